"""Shared pieces of the torch.fx -> BoundOp translation (`bounds.graph.fx_handlers`,
`bounds.graph.fx_shapes`): the activation value `Act`, the node-spec builder and the typed error.

Every value met while the fx graph is interpreted on an example batch is either a constant
(folded eagerly) or an `Act`: the output of one of our nodes, with its example value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.ops import BoundOp, ElementwiseAffineOp, ExpandOp, ReshapeOp

INPUT = "input"
NodeSpec = tuple[str, BoundOp | None, tuple[str, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Act:
    """An activation: the output of our node `name`, with its example value `[batch, *shape]`."""

    name: str
    value: Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape[1:])


class Builder:
    """Accumulates node specs while the fx graph is interpreted."""

    def __init__(self, example: Tensor) -> None:
        self.specs: list[NodeSpec] = [(INPUT, None, (), tuple(example.shape[1:]))]
        self.dtype = example.dtype
        self.batch = example.shape[0]
        self._names = {INPUT}

    def add(self, name: str, op: BoundOp, inputs: list[Act]) -> Act:
        base, k = name, 1
        while name in self._names:  # helper nodes' suffixes may meet an fx name
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        value = op.forward(*(a.value for a in inputs))
        self.specs.append((name, op, tuple(a.name for a in inputs), tuple(value.shape[1:])))
        return Act(name, value)

    def const(self, value: Any, node: str) -> Tensor:
        """A constant operand as a tensor in the network's dtype: a copy, so the graph is a
        snapshot that later in-place changes of the module's weights cannot alter."""
        if isinstance(value, Tensor):
            return value.detach().to(self.dtype, copy=True)
        if isinstance(value, (bool, int, float)):
            return torch.tensor(float(value), dtype=self.dtype)
        raise UnsupportedOperationError(type(value).__name__, node, "unexpected operand")


def unsupported(what: str, node: str, detail: str = "") -> UnsupportedOperationError:
    return UnsupportedOperationError(what, node, detail)


def reshape_result(b: Builder, node: str, x: Act, out: Tensor) -> Act:
    """A reshape whose example result is `out`; it must keep the batch dimension apart."""
    if out.shape[0] != b.batch or out[0].numel() != x.value[0].numel():
        raise unsupported("reshape", node, f"mixes the batch dimension ({tuple(out.shape)})")
    if tuple(out.shape[1:]) == x.shape:
        return x
    return b.add(node, ReshapeOp(x.shape, tuple(out.shape[1:])), [x])


def per_sample(t: Tensor, ndim: int, node: str) -> Tensor:
    """A constant broadcast against activations `[batch, *shape]` (`ndim = len(shape)`), without
    its batch dimension: leading dims beyond `ndim` must be 1, or repeat one row over the batch."""
    while t.dim() > ndim:
        if t.shape[0] != 1 and not bool((t == t[:1]).all()):
            raise unsupported("broadcast", node, "constant depends on the batch index")
        t = t[0]
    return t


def expand_to(b: Builder, node: str, x: Act, shape: tuple[int, ...]) -> Act:
    """`x` broadcast to the per-sample `shape` (itself when it already has it)."""
    if x.shape == tuple(shape):
        return x
    try:
        op = ExpandOp(x.shape, tuple(shape))
    except ValueError as err:
        raise unsupported("broadcast", node, str(err)) from err
    return b.add(f"{node}_expand", op, [x])


def affine_const(b: Builder, node: str, x: Act, scale: Any, shift: Any) -> Act:
    """`x * scale + shift` with constant operands (either may be None); `x` is first broadcast
    when the constants have a larger shape."""
    scale = None if scale is None else b.const(scale, node)
    shift = None if shift is None else b.const(shift, node)
    probe = x.value
    for t in (scale, shift):
        if t is not None:
            try:
                probe = probe + t
            except RuntimeError as err:
                raise unsupported("broadcast", node, f"constant of shape {tuple(t.shape)}") from err
    if probe.dim() != x.value.dim() or probe.shape[0] != b.batch:
        raise unsupported("broadcast", node, f"a constant broadcasts {tuple(x.value.shape)} to "
                          f"{tuple(probe.shape)}, over the batch dimension")  # fmt: skip
    target = tuple(probe.shape[1:])
    x = expand_to(b, node, x, target)
    trim = [None if t is None else per_sample(t, len(target), node) for t in (scale, shift)]
    return b.add(node, ElementwiseAffineOp(target, *trim), [x])
