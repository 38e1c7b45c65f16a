"""Folding of elementwise affine maps (BatchNorm, scalings, shifts) into the affine op before
them (Linear, Conv, ConvTranspose, MatMul, another elementwise map), when that op feeds
nothing else. The composed constants are computed in float64 and rounded once to the graph's
dtype. Folding changes no function (up to that rounding) and only tightens interval bounds:
the interval of a composition is never wider than the composition of the intervals."""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from bounds.ops.base import BoundOp
from bounds.ops.conv import ConvOp
from bounds.ops.conv_transpose import ConvTransposeOp
from bounds.ops.elementwise import ElementwiseAffineOp
from bounds.ops.linear import LinearOp
from bounds.ops.matmul import MatMulOp

NodeSpec = tuple[str, BoundOp | None, tuple[str, ...], tuple[int, ...]]


def _vector(t: Tensor | None, shape: tuple[int, ...], axis: int, like: Tensor) -> Tensor | None:
    """`t` (broadcastable to `shape`) as a float64 vector along `axis`, or None when it varies
    along another axis."""
    if t is None:
        return None
    full = torch.broadcast_to(t.double(), shape)
    first = full.movedim(axis, 0).reshape(shape[axis], -1)
    if not bool((first == first[:, :1]).all()):
        return None
    return first[:, 0].to(like.device)


def _scale_shift(ew: ElementwiseAffineOp, n: int, like: Tensor, shape, axis) -> tuple | None:
    s = (
        torch.ones(n, dtype=torch.float64)
        if ew.scale is None
        else _vector(ew.scale, shape, axis, like)
    )
    t = (
        torch.zeros(n, dtype=torch.float64)
        if ew.shift is None
        else _vector(ew.shift, shape, axis, like)
    )
    return None if s is None or t is None else (s.to(like.device), t.to(like.device))


def _bias(bias: Tensor | None, s: Tensor, t: Tensor, dtype: torch.dtype) -> Tensor:
    base = torch.zeros_like(s) if bias is None else bias.double().reshape(-1)
    return (base * s + t).to(dtype)


def compose(prev: BoundOp, ew: ElementwiseAffineOp) -> BoundOp | None:
    """One op computing `ew(prev(x))`, or None when this pair does not fold."""
    out = ew.in_shape
    if isinstance(prev, ElementwiseAffineOp) and prev.out_shape == out:
        dtype = next(iter(prev.constants() + ew.constants()), torch.zeros(())).dtype
        return prev.to(torch.float64, "cpu").then(ew.to(torch.float64, "cpu")).to(dtype, "cpu")
    if isinstance(prev, LinearOp):
        w = prev.weight
        st = _scale_shift(ew, out[0], w, out, 0)
        if st is None:
            return None
        s, t = st
        return LinearOp((w.double() * s[:, None]).to(w.dtype), _bias(prev.bias, s, t, w.dtype))
    if isinstance(prev, (ConvOp, ConvTransposeOp)):
        w = prev.weight
        st = _scale_shift(ew, out[0], w, out, 0)
        if st is None:
            return None
        s, t = st
        if isinstance(prev, ConvOp):
            weight = w.double() * s[:, None, None, None]
            return ConvOp(weight.to(w.dtype), _bias(prev.bias, s, t, w.dtype), prev.in_shape,
                          prev.stride, prev.padding, prev.dilation, prev.groups)  # fmt: skip
        g = prev.groups
        grouped = w.double().reshape(g, w.shape[0] // g, *w.shape[1:])
        weight = (grouped * s.reshape(g, 1, -1, 1, 1)).reshape(w.shape)
        return ConvTransposeOp(weight.to(w.dtype), _bias(prev.bias, s, t, w.dtype), prev.in_shape,
                               prev.stride, prev.padding, prev.output_padding, prev.dilation, g)  # fmt: skip
    if isinstance(prev, MatMulOp) and prev.right and ew.scale is not None:
        w = prev.weight
        s = _vector(ew.scale, out, len(out) - 1, w)
        if s is None:
            return None
        bias = None if prev.bias is None else prev.bias.double() * s
        shift = None if ew.shift is None else torch.broadcast_to(ew.shift.double(), out)
        if shift is not None:
            bias = shift if bias is None else bias + shift
        bias = None if bias is None else bias.to(w.dtype)
        return MatMulOp((w.double() * s[None, :]).to(w.dtype), prev.in_shape, True, bias)
    return None


def fold_affine_chains(specs: list[NodeSpec]) -> list[NodeSpec]:
    """`specs` (topological, the output last) with each elementwise affine node merged into its
    single input when that input is an affine op used by nothing else. The merged node keeps
    the later node's name (and so the output keeps its name)."""
    uses = Counter(name for spec in specs for name in spec[2])
    out: list[NodeSpec] = []
    position: dict[str, int] = {}
    for spec in specs:
        name, op, inputs, shape = spec
        if isinstance(op, ElementwiseAffineOp) and len(inputs) == 1 and uses[inputs[0]] == 1:
            k = position.get(inputs[0])
            prev = out[k] if k is not None else None
            merged = None if prev is None or prev[1] is None else compose(prev[1], op)
            if merged is not None:
                out[k] = (name, merged, prev[2], shape)
                del position[inputs[0]]
                position[name] = k
                continue
        position[name] = len(out)
        out.append(spec)
    return out
