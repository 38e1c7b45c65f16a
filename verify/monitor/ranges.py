"""Certified ranges for `verify.monitor`: every node's bounds over a domain for every
floating-point evaluation of the network (the float model of `verify.monitor`'s docstring:
each affine op's rounding error as a bounded extra input, `_Rounded`; CROWN's own float64
rounding padded by `crown_pad`).

Besides affine ops and ReLU-like activations: embedding lookups (`bounds.ops.embedding`: data
movement, exact in floating point) and products of two activations (`x * y`, and the terms of
`x @ y`): one IEEE multiplication, correctly rounded, `fl(x y) = x y (1 + d) + e` with
`|d| <= u` and `|e| <= eta` (the smallest normal number: flushed subnormals covered; Higham,
Sec. 2.2), so the McCormick lines and the interval are widened by `u max|x y| + eta` over the
box (`_RoundedProduct`; TF32 rounds the factors first: `f + u + f u` relative). The sums of `x @ y` are a `ReduceOp` (affine: `_Rounded`); together
they cover any evaluation order of the dot products, fused multiply-adds included."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from bounds.errors import (
    InvalidNetworkError,
    UnsupportedOperationError,
)
from bounds.graph.graph import Graph, Node
from bounds.methods.crown import crown
from bounds.ops import ActivationOp, ConvOp, LinearOp, MultiActivationOp, ReshapeOp, SumOp
from bounds.ops.embedding import EmbeddingOp
from bounds.rounding import eta
from bounds.types import Interval, rounded_down, rounded_up
from relaxations.base import MultiLinearBounds
from verify.monitor.stages import gamma

FLOAT64_UNIT = 2.0**-53


def _abs_apply(op, vectors: list[Tensor]) -> Tensor:
    """`|L| v` of an affine op (for several inputs: the sum over them), via its interval."""
    return op.interval(*(Interval(-v, v) for v in vectors)).radius


def _magnitude(iv: Interval) -> Tensor:
    return torch.maximum(iv.lower.abs(), iv.upper.abs())


def _terms(op, inputs: list[Tensor]) -> int:
    """Terms of the longest sum an op computes (an upper bound: the inputs' size otherwise)."""
    if isinstance(op, LinearOp):
        return int(op.weight.shape[1])
    if isinstance(op, ConvOp):
        return int(op.weight[0].numel())
    if isinstance(op, SumOp):
        return len(inputs)
    return sum(int(v[0].numel()) for v in inputs)


class _Rounded:
    """An affine op evaluated in floating point: its exact value on the (float) inputs plus a
    rounding error `rho`, `|rho| <= radius = 2 gamma_{n+3} (|L| m_in + |b|)`. `interval` sets
    `radius` from the inputs' intervals (so the nodes must be visited in topological order, as
    IBP and CROWN do) and widens by it; `bias_term` adds `min_rho A . rho = -|A| . radius`."""

    def __init__(self, op, unit: tuple[float, float]) -> None:
        self.op, self.unit, self.radius = op, unit, None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.op, name)

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.op.forward(*inputs)

    def interval(self, *inputs: Interval) -> Interval:
        mags = [_magnitude(iv) for iv in inputs]
        zero = self.op.forward(*(torch.zeros_like(m) for m in mags)).abs()
        size = _abs_apply(self.op, mags) + zero
        factors, sums = self.unit
        self.radius = 2 * (factors + gamma(_terms(self.op, mags) + 3, sums)) * size
        iv = self.op.interval(*inputs)
        return Interval(iv.lower - self.radius, iv.upper + self.radius)

    def vjp(self, A: Tensor) -> tuple[Tensor, ...]:
        return self.op.vjp(A)

    def bias_term(self, A: Tensor) -> Tensor:
        return self.op.bias_term(A) - (A.abs() * self.radius.unsqueeze(1)).flatten(2).sum(-1)


# Functions of several activations that IEEE arithmetic evaluates with one correct rounding.
CORRECTLY_ROUNDED = ("product",)


class _RoundedProduct:
    """A product relaxation widened by the float evaluation's rounding: `u m + eta`, `m` the
    largest `|x y|` over the box (its extreme corners), on both lines and the interval."""

    def __init__(self, relaxation, unit: tuple[float, float], dtype: torch.dtype) -> None:
        self.relaxation, self.unit, self.eta = relaxation, unit, eta(dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.relaxation, name)

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.relaxation.forward(*inputs)

    def _radius(self, lowers, uppers) -> Tensor:
        """`(f + u + f u) m + eta`: the factors' rounding `f` (TF32) and the product's `u`."""
        low, high = self.relaxation.interval(lowers, uppers)
        factors, sums = self.unit
        relative = factors + sums + factors * sums
        return relative * torch.maximum(low.abs(), high.abs()) + self.eta

    def interval(self, lowers, uppers) -> tuple[Tensor, Tensor]:
        low, high = self.relaxation.interval(lowers, uppers)
        radius = self._radius(lowers, uppers)
        return low - radius, high + radius

    def linear_bounds(self, lowers, uppers, params=None) -> MultiLinearBounds:
        lines = self.relaxation.linear_bounds(lowers, uppers, params)
        radius = self._radius(lowers, uppers)
        return MultiLinearBounds(lines.lower_slopes, lines.lower_intercept - radius,
                                 lines.upper_slopes, lines.upper_intercept + radius)  # fmt: skip


def _check_activation(node) -> None:
    """ReLU-like only: pieces with slopes in {0, 1} and no intercepts are exact in float."""
    pieces = node.op.relaxation.pieces
    if (
        len(node.inputs) != 1
        or not pieces
        or not all(p.slope in (0.0, 1.0) and p.intercept == 0.0 for p in pieces)
    ):
        raise UnsupportedOperationError(
            type(node.op.relaxation).__name__, node.name,
            "monitors support ReLU-like activations only (exact in floating point)",
        )  # fmt: skip


def rounded_graph(graph: Graph, unit: tuple[float, float]) -> Graph:
    """`graph` with every affine op but reshapes replaced by its `_Rounded` version, and every
    product by its `_RoundedProduct` (embedding lookups are exact)."""
    nodes = [graph.input]
    dtype = {2.0**-24: torch.float32}.get(unit[1], torch.float64)
    for node in graph.nodes[1:]:
        op = node.op
        if isinstance(op, MultiActivationOp) and op.relaxation.name in CORRECTLY_ROUNDED:
            op = MultiActivationOp(_RoundedProduct(op.relaxation, unit, dtype), op.out_shape)
        elif isinstance(op, ActivationOp):
            _check_activation(node)
        elif isinstance(op, EmbeddingOp):
            pass
        elif not op.is_affine:
            raise UnsupportedOperationError(type(op).__name__, node.name, "not affine")
        elif not isinstance(op, ReshapeOp):
            op = _Rounded(op, unit)
        nodes.append(Node(node.name, op, node.inputs, node.shape))
    return Graph(tuple(nodes))


def float_bounds(
    graph: Graph, box: Interval, method: str, unit: tuple[float, float]
) -> dict[str, Interval]:
    """Intervals `[R, *shape]` of every node that contain its value in every float evaluation
    (`unit`: a `PRECISIONS` entry) on the boxes: IBP or CROWN on the rounded graph (float64)."""
    rounded = rounded_graph(graph, unit)
    if method == "ibp":
        return rounded.interval(box)
    n_out = int(torch.Size(graph.output.shape).numel())
    eye = torch.eye(n_out, dtype=box.lower.dtype).expand(box.lower.shape[0], n_out, n_out)
    lower, upper, intervals = crown(rounded, box, eye)
    out = graph.output.name
    shape = intervals[out].lower.shape
    refined = Interval(lower.reshape(shape), upper.reshape(shape))
    return {**intervals, out: intervals[out].intersect(refined)}


def crown_pad(graph: Graph, box: Interval) -> dict[str, Tensor]:
    """Per node `[R, *shape]`: a bound on the float64 rounding of its bound computation,
    `2 gamma_N` (float64; `N`: the terms of all ops and the input) times its interval-
    arithmetic magnitude, which bounds every term of a backward pass to it (products of
    `|W|`, slopes in [0, 1], intercepts at most the magnitudes)."""
    chain = {graph.input.name: _magnitude(box)}
    total = int(box.lower[0].numel())
    for node in graph.nodes[1:]:
        mags = [chain[i] for i in node.inputs]
        if isinstance(node.op, MultiActivationOp):  # McCormick: |a x| + |b y| + |c| <= 3 |x||y|
            chain[node.name] = 3 * mags[0] * mags[1]
            continue
        if isinstance(node.op, ActivationOp):
            chain[node.name] = mags[0]
            continue
        if isinstance(node.op, EmbeddingOp):  # a row: no functional goes on to the index
            table = node.op.table.abs().amax(0)
            chain[node.name] = table.expand(mags[0].shape + table.shape).clone()
            total += node.op.dim
            continue
        zero = node.op.forward(*(torch.zeros_like(m) for m in mags)).abs()
        chain[node.name] = _abs_apply(node.op, mags) + zero
        total += _terms(node.op, mags)
    pad = 2 * gamma(total, FLOAT64_UNIT)
    pads = {name: pad * value for name, value in chain.items()}
    for node in graph.nodes[1:]:  # a lookup's interval is its rows' extremes: exact, no pad
        if isinstance(node.op, EmbeddingOp):
            pads[node.name] = torch.zeros_like(pads[node.name])
    return pads


def certified_ranges(
    bounds: dict[str, Interval], pads: dict[str, Tensor], dtype: torch.dtype, layer: bool
) -> dict[str, tuple[Tensor, Tensor]]:
    """`[lower - pad, upper + pad]` rounded outwards to `dtype`; `layer`: one range per node
    and region (the extremes over its elements), shape `[R, 1, ..., 1]`."""
    ranges = {}
    for name, pad in pads.items():
        low, high = bounds[name].lower - pad, bounds[name].upper + pad
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise InvalidNetworkError(f"the bounds of node {name!r} are not finite")
        if layer:
            dims = tuple(range(1, low.dim()))
            low, high = low.amin(dims, keepdim=True), high.amax(dims, keepdim=True)
        ranges[name] = (rounded_down(low, dtype), rounded_up(high, dtype))
    return ranges
