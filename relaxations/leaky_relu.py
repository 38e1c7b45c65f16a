"""Triangle relaxation of LeakyReLU / PReLU, `sigma(xh) = xh` for `xh >= 0`, `n xh` for `xh < 0`
with any real negative slope `n` (a number, or a tensor broadcastable to the neuron shape for
PReLU's per-channel slopes, e.g. `[C, 1, 1]`).

On an ambiguous box (`l < 0 < u`, `n != 1`) the convex hull of the graph is the triangle with
vertices `(l, n l)`, `(0, 0)`, `(u, u)` (the Planet relaxation, Ehlers 2017, of
`sigma = n xh + (1 - n) relu(xh)`). For `n <= 1` sigma is convex:
- upper: the chord `k xh + c`, `k = (u - n l) / (u - l)`, `c = (1 - n) u (-l) / (u - l)`;
- lower: `s xh` with `s = n + t (1 - n)`, `t` in [0, 1] the relaxation's parameter (exactly
  ReLU's alpha on the `relu` part; CROWN, Zhang et al. 2018, Sec. 3.2, and alpha-CROWN, Xu et
  al. 2021, for its choice and optimisation); CROWN's adaptive default `t = 1` where `u > -l`.
For `n > 1` sigma is concave and the roles swap (the chord below, `s xh` above). On a stable box
(`l >= 0`: `xh`; `u <= 0`: `n xh`) both lines are the piece, exact, so splitting at 0 (ReLU
branch and bound, beta-CROWN) makes every neuron exact: `split_at_zero`. The chord is widened by
a few ulps (`relaxations.piecewise.pivot_line`); `s xh` is exact (through the origin, `s` kept
between `n` and 1).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relaxations.base import LinearBounds, LinearConstraints, Piece, Relaxation, broadcast_shape
from relaxations.piecewise import (
    along,
    check_level,
    pad,
    stacked_constraints,
    unit_clamp,
    vertex_argmin,
)
from relaxations.registry import OnnxNode, OnnxOp, Spelling, TorchCall, register

Slope = float | Tensor


def checked_slope(negative_slope: Any) -> Slope:
    """The slope as a float (numbers and one-element tensors) or a float tensor (a detached
    copy); ValueError for anything else, or for NaN / infinite entries."""
    if isinstance(negative_slope, torch.Tensor):
        if negative_slope.numel() == 0 or negative_slope.dtype == torch.bool:
            raise ValueError(
                f"negative_slope must be a non-empty real tensor, got {negative_slope}"
            )
        if negative_slope.is_complex():
            raise ValueError("negative_slope must be real, got a complex tensor")
        slope = negative_slope.detach().clone()
        slope = slope if slope.is_floating_point() else slope.double()
        if not torch.isfinite(slope).all():
            index = tuple((~torch.isfinite(slope)).nonzero()[0].tolist())
            raise ValueError(f"negative_slope must be finite, entry {index} is {slope[index]}")
        return float(slope.reshape(-1)[0]) if slope.numel() == 1 else slope
    if isinstance(negative_slope, numbers.Real) and not isinstance(negative_slope, bool):
        return check_level(negative_slope, "negative_slope")
    raise ValueError(f"negative_slope must be a real number or tensor, got {negative_slope!r}")


def as_tensor(slope: Slope, like: Tensor) -> Tensor:
    """`slope` in `like`'s dtype and device (0-d for a float)."""
    if isinstance(slope, float):
        return like.new_tensor(slope)
    return slope.to(dtype=like.dtype, device=like.device)


def regimes(lower: Tensor, upper: Tensor, n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Boolean masks (passing: `l >= 0` or `n == 1`, the identity; blocking: `u <= 0`;
    ambiguous: the rest, `l < 0 < u` with `n != 1`)."""
    passing = (lower >= 0) | (n == 1)
    blocking = (upper <= 0) & ~passing
    return passing, blocking, ~passing & ~blocking


def _leaky(negative_slope: float = 0.01, inplace: bool = False) -> dict[str, Any]:
    """F.leaky_relu's slope."""
    return {"negative_slope": float(negative_slope)}


def _leaky_module(module: nn.LeakyReLU) -> dict[str, Any]:
    return {"negative_slope": module.negative_slope}


def _prelu(weight: Any, *, shape: tuple[int, ...]) -> dict[str, Any]:
    """F.prelu with a constant slope per channel (axis 1 of `[batch, C, ...]`, the first of the
    per-sample `shape`) or one slope: a `[C, 1, ..., 1]` (or scalar) negative slope."""
    if not isinstance(weight, Tensor):
        raise ValueError(f"the slope must be a constant tensor, got {type(weight).__name__}")
    slope = weight.detach().clone().reshape(-1)
    if slope.numel() > 1:
        if not shape or shape[0] != slope.numel():
            raise ValueError(f"{slope.numel()} slopes for input {shape}")
        slope = slope.reshape(-1, *([1] * (len(shape) - 1)))
    return {"negative_slope": slope}


def _prelu_module(module: nn.PReLU, *, shape: tuple[int, ...]) -> dict[str, Any]:
    return _prelu(module.weight, shape=shape)


def _onnx_leaky(node: OnnxNode) -> TorchCall:
    """LeakyRelu(alpha): F.leaky_relu."""
    return TorchCall(F.leaky_relu, (float(node.attributes.get("alpha", 0.01)),))


def _onnx_prelu(node: OnnxNode) -> TorchCall:
    """PRelu with one constant slope, or one per channel (a slope of shape `[C, 1, ..., 1]` or
    `[C]` for a rank-2 input, broadcast over axis 1): F.leaky_relu or F.prelu."""
    slope = node.constants[0] if node.constants else None
    if slope is None or slope.numel() == 0:
        raise ValueError("the slope must be a constant")
    flat, shape = slope.reshape(-1), tuple(slope.shape)
    if bool((flat == flat[0]).all()):
        return TorchCall(F.leaky_relu, (float(flat[0]),))
    rank = len(node.shape)
    channels = node.shape[1] if rank > 1 else 0
    per_channel = shape[-(rank - 1) :] if rank > 1 else ()
    if not node.batched or flat.numel() != channels or math.prod(per_channel) != channels:
        raise ValueError(f"slope of shape {shape} (one per channel of axis 1)")
    if len(per_channel) > 1 and any(d != 1 for d in per_channel[1:]):
        raise ValueError(f"slope of shape {shape} (one per channel of axis 1)")
    return TorchCall(F.prelu, (flat,))


@register(
    "leaky_relu",
    torch=(
        Spelling(F.leaky_relu, _leaky),
        Spelling(nn.LeakyReLU, _leaky_module),
        Spelling(F.prelu, _prelu, shaped=True),
        Spelling(nn.PReLU, _prelu_module, shaped=True),
    ),
    onnx=(OnnxOp("LeakyRelu", _onnx_leaky), OnnxOp("PRelu", _onnx_prelu)),
)
class LeakyReluRelaxation(Relaxation):
    """LeakyReLU / PReLU with negative slope `negative_slope` (default torch's 0.01); see the
    module docstring. With a tensor slope `pieces` is None (pieces are constants)."""

    name = "leaky_relu"
    split_at_zero = True
    param_shape = ()  # the fraction t of the tangent side's slope between n and 1

    def __init__(self, negative_slope: Slope = 0.01) -> None:
        self.negative_slope = checked_slope(negative_slope)
        n = self.negative_slope
        if isinstance(n, float):
            self.convex, self.monotone = n <= 1, n >= 0
            self.pieces = (Piece(-torch.inf, 0.0, n, 0.0), Piece(0.0, torch.inf, 1.0, 0.0))
        else:
            self.convex, self.monotone = bool((n <= 1).all()), bool((n >= 0).all())
            self.pieces = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(negative_slope={self.negative_slope!r})"

    def slope(self, like: Tensor) -> Tensor:
        """The negative slope in `like`'s dtype and device."""
        return as_tensor(self.negative_slope, like)

    def forward(self, xh: Tensor) -> Tensor:
        return torch.where(xh >= 0, xh, self.slope(xh) * xh)

    def _points(self, lower: Tensor, upper: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The hull's vertices: both ends and the kink clamped into the box."""
        kink = torch.minimum(lower.clamp(min=0), upper)
        xs = [lower, kink, upper]
        return xs, [self.forward(x) for x in xs]

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        """The exact range: the extremes of sigma at the ends and the kink."""
        ys = torch.stack(torch.broadcast_tensors(*self._points(lower, upper)[1]))
        return ys.amin(0), ys.amax(0)

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        """CROWN's adaptive choice: the tangent side's slope of the longer piece (`t = 1`, the
        slope 1, where `u > -l`; else `t = 0`, the slope n)."""
        return (upper > -lower).to(lower.dtype)

    def project(self, params: Tensor) -> Tensor:
        return unit_clamp(params)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """The ambiguous neurons (`l < 0 < u`, `n != 1`)."""
        return regimes(lower, upper, self.slope(lower))[2]

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, params: Tensor | None = None
    ) -> LinearBounds:
        """The piece on stable neurons; on ambiguous ones the chord and `s xh`, `s = n + t (1 -
        n)` for `t = project(params)` (default `default_params`), below for a convex sigma
        (`n <= 1`) and above for a concave one."""
        n = self.slope(lower)
        passing, _, ambiguous = regimes(lower, upper, n)
        t = self.project(self.default_params(lower, upper) if params is None else params)
        tangent = along(t, n, torch.ones_like(n))
        chord_slope, chord_intercept = chord(lower, upper, n, ambiguous)
        piece = torch.where(passing, 1.0, n)
        convex = n <= 1
        lower_slope = torch.where(ambiguous, torch.where(convex, tangent, chord_slope), piece)
        upper_slope = torch.where(ambiguous, torch.where(convex, chord_slope, tangent), piece)
        lower_intercept = torch.where(ambiguous & ~convex, -chord_intercept, 0.0)
        upper_intercept = torch.where(ambiguous & convex, chord_intercept, 0.0)
        return LinearBounds(lower_slope, lower_intercept, upper_slope, upper_intercept)

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The best of the triangle's vertices `(l, sigma(l))`, `(0, 0)`, `(u, sigma(u))` (the
        kink clamped into the box: on a stable box, the segment's ends)."""
        return vertex_argmin(coeff_pre, coeff_post, *self._points(lower, upper))

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints:
        """The hull: on ambiguous neurons `x >= n xh`, `x >= xh` and `x <= chord` (convex sigma;
        mirrored for a concave one), on stable ones the piece (repeated)."""
        shape = broadcast_shape(lower.shape, self.slope(lower).shape)
        zeros, ones = lower.new_zeros(shape), lower.new_ones(shape)
        first, second = (
            self.linear_bounds(lower, upper, zeros),
            self.linear_bounds(lower, upper, ones),
        )
        return stacked_constraints(
            [
                (first.lower_slope, first.lower_intercept),
                (second.lower_slope, second.lower_intercept),
            ],
            [
                (first.upper_slope, first.upper_intercept),
                (second.upper_slope, second.upper_intercept),
            ],
        )


def chord(lower: Tensor, upper: Tensor, n: Tensor, ambiguous: Tensor) -> tuple[Tensor, Tensor]:
    """Slope `k` and the magnitude `|c| + pad` of the intercept of the chord from `(l, n l)` to
    `(u, u)` on ambiguous neurons (1 and 0 elsewhere): `c = (1 - n) u (-l) / (u - l)`, positive
    for `n < 1`, negative for `n > 1`; the caller adds it above (convex) or subtracts it below
    (concave). The pad covers the rounding of `k` (relative error a few ulps of `max(1, |n|)`,
    times `|xh| <= |l| + |u|`) and of `c`."""
    width = torch.where(ambiguous, upper - lower, torch.ones_like(upper))
    slope = torch.where(ambiguous, (upper - n * lower) / width, 1.0)
    value = (1 - n) * upper * (-lower / width)  # the ratio first: u (-l) may underflow
    scale = value.abs() + torch.maximum(n.abs(), torch.ones_like(n)) * (lower.abs() + upper.abs())
    magnitude = torch.where(ambiguous, value.abs() + pad(scale), 0.0)
    return slope, magnitude
