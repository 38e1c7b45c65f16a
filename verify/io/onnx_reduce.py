"""ONNX reductions over activations -> torch.fx (used by `verify.io.onnx_loader`): ReduceSum and
ReduceMean (linear: torch sum/mean), ReduceMax and ReduceMin (a tournament of two-input
max/min relaxations), over constant axes given as an attribute or as a constant input (opset
13/18), with `keepdims` and `noop_with_empty_axes` as the ONNX operator specification says;
checked against onnxruntime in tests/test_onnx_general.py. Reductions of constants are folded
(`verify.io.onnx_fold`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch

from verify.io.onnx_builder import GraphBuilder, Traced, Value
from verify.io.onnx_fold import node_attributes
from verify.io.onnx_ops import activation, hint
from verify.io.onnx_shapes import axis_of, int_list

Node = onnx.NodeProto


def _reduced_axes(b: GraphBuilder, node: Node, inputs: list[Value]) -> tuple[Traced, list[int]]:
    """The activation (unbatched when axis 0 is reduced) and the sorted axes to reduce:
    an attribute (opset < 18) or the constant input; none: every axis, or none at all with
    `noop_with_empty_axes`."""
    x = activation(node, inputs)
    rank = len(x.shape)
    axes = int_list(node, inputs, 1, "axes")
    if not axes:
        if node_attributes(node).get("noop_with_empty_axes", 0):
            return x, []
        axes = list(range(rank))
    axes = sorted({axis_of(node, a, rank) for a in axes})
    if x.batched and 0 in axes:
        x = b.unbatched(x)
    return x, axes


def _kept(
    b: GraphBuilder, node: Node, y: Traced, shape: tuple[int, ...], axes: list[int]
) -> Traced:
    """`y` (reduced with its axes kept, of size 1) reshaped as `keepdims` says."""
    keep = node_attributes(node).get("keepdims", 1)
    out = tuple(1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes)
    return b.reshape(y, out, node)


def _reduce(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """ReduceSum/ReduceMean over constant axes (torch sum/mean with keepdim, then a reshape)."""
    x, axes = _reduced_axes(b, node, inputs)
    if not axes:
        return x
    fn = torch.mean if node.op_type == "ReduceMean" else torch.sum
    y = b.function(fn, x, tuple(x.axis(a) for a in axes), True, batched=x.batched)
    return _kept(b, node, y, x.shape, axes)


def _reduce_extreme(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """ReduceMax/ReduceMin over constant axes: per axis a tournament of `torch.maximum` (or
    `minimum`) of its first and last `ceil(n / 2)` entries (overlapping by one when `n` is odd:
    max is idempotent), log2(n) levels of the two-input max relaxation; then a reshape."""
    x, axes = _reduced_axes(b, node, inputs)
    if not axes:
        return x
    shape = x.shape
    fn = torch.maximum if node.op_type == "ReduceMax" else torch.minimum
    for a in axes:
        while x.shape[a] > 1:
            n = x.shape[a]
            k = (n + 1) // 2
            halves = [b.function(torch.index_select, x, x.axis(a),
                                 b.buffer(f"{hint(node)}_index", np.arange(start, start + k), np.int64),
                                 batched=x.batched) for start in (0, n - k)]  # fmt: skip
            x = b.function(fn, *halves, batched=x.batched, hint=hint(node))
    return _kept(b, node, x, shape, axes)


HANDLERS: dict[str, Callable[[GraphBuilder, Node, list[Value]], Any]] = {
    "ReduceSum": _reduce,
    "ReduceMean": _reduce,
    "ReduceMax": _reduce_extreme,
    "ReduceMin": _reduce_extreme,
}
