"""Unsafe sets with rows over the inputs (`Polytope.A_x`: linear input constraints that are not a
box, as VNN-LIB 2.0 files write them, or rows mixing inputs and outputs) for a bound engine that
sees only the network's outputs.

The network is wrapped to output `[f(x), x]` (`WithInputs`) and each polytope's rows
`A y + A_x x <= b` become `[A, A_x] [y; x] <= b` over that output (`with_input_rows`). The
region's box stays the input domain and the input rows are rows like any other: branch and
bound bounds them, and prunes a domain that some row proves outside the polytope. This is the
same property (a point of the box violates it iff `[f(x); x]` lies in a rewritten polytope), so
"unsat" and a validated counterexample mean what they meant; the counterexample's output is
`f(x)` again (`strip_inputs`). The box is not tightened by the rows (an LP's bound in floating
point could cut off a feasible sliver): every input needs its own bounds, as before."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from verify.property import Polytope, Region, VnnlibProperty


class WithInputs(nn.Module):
    """`x -> [f(x).flatten(1), x.flatten(1)]`; `net` is held, never changed."""

    def __init__(self, net: nn.Module, n_outputs: int) -> None:
        super().__init__()
        self.net = net
        shape = getattr(net, "input_shape", None)
        if shape is not None:
            self.input_shape = tuple(shape)
            self.output_shape = (n_outputs + math.prod(shape),)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.net(x).flatten(1), x.flatten(1)], 1)


def _rewritten(poly: Polytope, n_inputs: int) -> Polytope:
    A_x = poly.A_x if poly.A_x is not None else np.zeros((len(poly.b), n_inputs))
    return Polytope(np.concatenate([poly.A, A_x], 1), poly.b)


def with_input_rows(net: nn.Module, spec: VnnlibProperty) -> tuple[nn.Module, VnnlibProperty]:
    """`(net, spec)` unchanged when no row involves the inputs; else the wrapped network and the
    property over `[y; x]` (module docstring)."""
    if not any(p.A_x is not None for r in spec.regions for p in r.unsafe):
        return net, spec
    regions = tuple(
        Region(r.lower, r.upper, tuple(_rewritten(p, spec.n_inputs) for p in r.unsafe))
        for r in spec.regions
    )
    wrapped = WithInputs(net, spec.n_outputs)
    return wrapped, VnnlibProperty(
        spec.path, spec.n_inputs, spec.n_outputs + spec.n_inputs, regions
    )


def strip_inputs(found: tuple[Tensor, Tensor] | None, n_outputs: int) -> tuple | None:
    """A counterexample `(x, [f(x); x])` as `(x, f(x))`."""
    if found is None:
        return None
    return found[0], found[1].reshape(-1)[:n_outputs]
