"""The Anderson relaxation's problem (package docstring: `bounds.dual.anderson`): a ReLU
chain as affine `Layers`, the `AndersonProblem` over boxes, its per-layer constants, and the
CROWN slopes that start its duals."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.dual.dag import decompose
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph
from bounds.ops import UnaryAffineOp
from bounds.types import Interval


@dataclass(frozen=True)
class Layers:
    """A ReLU chain as affine layers, each the chain of unary affine ops between two ReLUs
    (Linear, Conv, BatchNorm, Flatten, ...; applied as ops, never as dense matrices), on flat
    values: layer k maps `x_{k-1}` (`in_shapes[k]`) to `xh_k` (`out_shapes[k]`), the last one
    the output layer. `biases[k]` `[n_k]`: its image of 0; `pre_names[k]`, `act_names[k]`:
    hidden layer k's pre-activation and ReLU nodes."""

    graph: Graph
    chains: tuple[tuple[UnaryAffineOp, ...], ...]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    biases: tuple[Tensor, ...]
    pre_names: tuple[str, ...]
    act_names: tuple[str, ...]

    @property
    def hidden(self) -> int:
        return len(self.chains) - 1

    def width(self, k: int) -> int:
        return self.biases[k].shape[0]

    def forward(self, k: int, x: Tensor) -> Tensor:
        """`W_k x + b_k` for `x` `[..., n_{k-1}]`."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, *self.in_shapes[k])
        for op in self.chains[k]:
            flat = op.linear(flat)
        return flat.reshape(*lead, -1) + self.biases[k]

    def adjoint(self, k: int, y: Tensor) -> Tensor:
        """`W_k^T y` for `y` `[..., n_k]`."""
        lead = y.shape[:-1]
        flat = y.reshape(-1, *self.out_shapes[k])
        for op in reversed(self.chains[k]):
            flat = op.adjoint(flat)
        return flat.reshape(*lead, -1)

    def rows(self, k: int, index: Tensor, chunk: int = 1 << 24) -> Tensor:
        """The rows `W_k[index]` `[*index.shape, n_{k-1}]` (adjoints of unit vectors, one per
        distinct neuron of `index`, in chunks of about `chunk` elements)."""
        if index.numel() > 1:
            unique, inverse = torch.unique(index, return_inverse=True)
            if unique.numel() < index.numel():
                return self.rows(k, unique, chunk)[inverse]
        n, flat = self.width(k), index.reshape(-1)
        n_in = 1
        for d in self.in_shapes[k]:
            n_in *= d
        step = max(1, chunk // max(n, n_in))
        parts = []
        for start in range(0, flat.shape[0], step):
            part = flat[start : start + step]
            unit = self.biases[k].new_zeros(part.shape[0], n).scatter_(1, part[:, None], 1.0)
            parts.append(self.adjoint(k, unit))
        if not parts:
            return self.biases[k].new_zeros(*index.shape, n_in)
        return torch.cat(parts).reshape(*index.shape, n_in)

    def dense(self, k: int) -> Tensor:
        """`W_k` `[n_k, n_{k-1}]` (for references on small networks)."""
        return self.rows(k, torch.arange(self.width(k), device=self.biases[k].device))

    def to(self, dtype: torch.dtype) -> Layers:
        return anderson_layers(self.graph.to(dtype, self.biases[0].device))


def anderson_layers(graph: Graph) -> Layers:
    """The graph as `Layers`, in the dtype and on the device of its constants.
    UnsupportedOperationError unless it is a chain of affine ops and nonlinearities whose
    relaxations have the Anderson hull (`relaxation.anderson`: ReLU)."""
    net = decompose(graph)
    for act in net.acts:
        if not act.op.relaxation.anderson:
            raise UnsupportedOperationError(
                act.op.relaxation.name, act.name,
                "the Anderson relaxation covers ReLU after an affine layer; use prox or "
                "alpha-crown for other activations",
            )  # fmt: skip
    for source in net.sources:
        if source.chain is None or not source.simple:
            raise UnsupportedOperationError(
                "graph", source.name,
                "the active-set and Big-M solvers need a chain (affine, ReLU, affine, ...); "
                "use prox on residual or multi-branch graphs",
            )  # fmt: skip
    like = next(t for n in graph.nodes[1:] for t in n.op.constants())
    chains, in_shapes, out_shapes, biases = [], [], [], []
    for source in net.sources:
        zero = like.new_zeros(1, *source.shape)
        for op in source.chain:
            zero = op.forward(zero)
        chains.append(tuple(source.chain))
        in_shapes.append(tuple(source.shape))
        out_shapes.append(tuple(zero.shape[1:]))
        biases.append(zero.reshape(-1))
    pre = tuple(e.pre for e in net.edges)
    return Layers(
        graph, tuple(chains), tuple(in_shapes), tuple(out_shapes), tuple(biases), pre,
        tuple(a.name for a in net.acts),
    )  # fmt: skip


@dataclass(frozen=True)
class AndersonProblem:
    """`min c . y` per (batch, spec) over the relaxation. `x_lower[k]`, `x_upper[k]` `[B, n]`:
    the boxes of the input (k = 0) and of the hidden layers' outputs (k = 1..H);
    `pre_lower[k]`, `pre_upper[k]` `[B, n_k]`: hidden layer k's pre-activation bounds;
    `c` `[B, S, n_out]`."""

    layers: Layers
    x_lower: tuple[Tensor, ...]
    x_upper: tuple[Tensor, ...]
    pre_lower: tuple[Tensor, ...]
    pre_upper: tuple[Tensor, ...]
    c: Tensor

    def to(self, dtype: torch.dtype) -> AndersonProblem:
        return build_problem(
            self.layers.to(dtype),
            Interval(self.x_lower[0].to(dtype), self.x_upper[0].to(dtype)),
            tuple(Interval(lo.to(dtype), up.to(dtype))
                  for lo, up in zip(self.pre_lower, self.pre_upper)),
            self.c.to(dtype),
        )  # fmt: skip

    @cached_property
    def constants(self) -> tuple[_LayerConstants, ...]:
        """Per hidden layer, the fixed tensors an evaluation reads (computed once)."""
        return _constants(self)

    def ends(self, k: int, rows: Tensor) -> tuple[Tensor, Tensor]:
        """`(W_ij L_ij, W_ij U_ij)` for weight rows `rows` `[B, ..., n_in]` of layer k: each
        input's box end that minimises / maximises `W_ij x_j`."""
        extra = rows.dim() - 2
        lo = self.x_lower[k].reshape(rows.shape[0], *([1] * extra), -1)
        up = self.x_upper[k].reshape(rows.shape[0], *([1] * extra), -1)
        positive = rows > 0
        return rows * torch.where(positive, lo, up), rows * torch.where(positive, up, lo)


def build_problem(
    layers: Layers, box: Interval, pre: tuple[Interval, ...], c: Tensor
) -> AndersonProblem:
    """The problem for the flat input `box` `[B, n_0]`, hidden pre-activation bounds `pre`
    (`[B, n_k]` each) and objectives `c` `[B, S, n_out]`."""
    x_lower = [box.lower] + [torch.relu(iv.lower) for iv in pre]
    x_upper = [box.upper] + [torch.relu(iv.upper) for iv in pre]
    return AndersonProblem(
        layers, tuple(x_lower), tuple(x_upper), tuple(iv.lower for iv in pre),
        tuple(iv.upper for iv in pre), c,
    )  # fmt: skip


def box_at(p: AndersonProblem, k: int, support: Tensor) -> tuple[Tensor, Tensor]:
    """The input box of layer k at `support` `[B, ..., F]`: `(lower, upper)`, same shape."""
    B = support.shape[0]
    at = support.reshape(B, -1)
    shape = support.shape
    lo = torch.gather(p.x_lower[k], 1, at).reshape(shape)
    return lo, torch.gather(p.x_upper[k], 1, at).reshape(shape)


class _LayerConstants(NamedTuple):
    """Hidden layer k's fixed tensors, `[B, 1, n_k]`: pre-activation bounds, the output box,
    `b - l`, and the ambiguous (`l < 0 < u`) and passing (`l >= 0`) neurons (as 0 / 1, and
    passing as bool)."""

    lo: Tensor
    up: Tensor
    lb: Tensor
    ub: Tensor
    b_lo: Tensor
    ambiguous: Tensor
    passing: Tensor
    passing_bool: Tensor


def _constants(p: AndersonProblem) -> tuple[_LayerConstants, ...]:
    out = []
    for k in range(p.layers.hidden):
        lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
        passing = lo >= 0
        out.append(_LayerConstants(
            lo, up, p.x_lower[k + 1].unsqueeze(1), p.x_upper[k + 1].unsqueeze(1),
            p.layers.biases[k] - lo, ((lo < 0) & (up > 0)).to(lo.dtype), passing.to(lo.dtype),
            passing,
        ))  # fmt: skip
    return tuple(out)


def anderson_slopes(p: AndersonProblem, slopes: dict[str, Tensor] | None) -> tuple[Tensor, ...]:
    """Per hidden layer `[B, S, n_k]`: the lower slopes of a CROWN pass, alpha-CROWN's
    (`slopes`, by activation node, `[B, S, *shape]`) when given, else each relaxation's
    defaults for the problem's pre-activation bounds."""
    B, S = p.c.shape[:2]
    graph, out = p.layers.graph, []
    for name, lo, up in zip(p.layers.act_names, p.pre_lower, p.pre_upper):
        if slopes is not None and name in slopes:
            out.append(slopes[name].reshape(B, S, -1))
        else:
            default = graph[name].op.relaxation.default_params(lo, up)
            out.append(default.unsqueeze(1).expand(-1, S, -1))
    return tuple(out)


def problem_from_graph(
    graph: Graph, box: Interval, intervals: dict[str, Interval], c: Tensor,
    layers: Layers | None = None,
) -> AndersonProblem:  # fmt: skip
    """The problem of `graph` (`anderson_layers`, or the given `layers` of it) over `box`
    `[B, *in_shape]` with the nodes' `intervals` and the objectives `c` `[B, S, *out_shape]`."""
    return problem_from_layers(
        anderson_layers(graph) if layers is None else layers, box, intervals, c
    )


def problem_from_layers(
    layers: Layers, box: Interval, intervals: dict[str, Interval], c: Tensor
) -> AndersonProblem:
    """`problem_from_graph` for the graph whose `Layers` these are."""
    batch = box.lower.shape[0]
    flat = Interval(box.lower.reshape(batch, -1), box.upper.reshape(batch, -1))
    pre = tuple(
        Interval(intervals[n].lower.reshape(batch, -1), intervals[n].upper.reshape(batch, -1))
        for n in layers.pre_names
    )
    return build_problem(layers, flat, pre, c.reshape(batch, c.shape[1], -1))
