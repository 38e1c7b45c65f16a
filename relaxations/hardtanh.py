"""Relaxation of hardtanh / clip, `sigma(xh) = min(max(xh, a), b)` with constant limits
`a = min <= b = max` (either may be infinite: `torch.clamp(x, min=0)` is a shifted ReLU).

On a box `[l, u]` the graph's convex hull has the vertices `(l, sigma(l))`, `(p, sigma(p))`,
`(q, sigma(q))`, `(u, sigma(u))` with the kinks clamped into the box, `p = clamp(a, l, u)`,
`q = clamp(b, l, u)`: a ReLU-like triangle when the box crosses one kink, the quadrilateral
`(l, a)`, `(a, a)`, `(u, b)`, `(b, b)` when it crosses both (the hull of the two-kink function;
DeepPoly, Singh et al. 2019, and auto_LiRPA's clip use these lines). Its lower side is
`(l, sigma(l)) -> (p, sigma(p)) -> (u, sigma(u))` (flat, then the chord from the kink `a`) and its
upper side `(l, sigma(l)) -> (q, sigma(q)) -> (u, sigma(u))` (the chord to the kink `b`, then
flat), so
- lower: the line through `(p, sigma(p))` with slope `s = t r`, `r = (sigma(u) - sigma(p)) /
  (u - p)`, where the box starts left of `a` (`l < a`: `t` in [0, 1] chooses between the flat
  side and the chord; ReLU's lower slope alpha when `b >= u`); elsewhere the chord, `s = r`;
- upper: the line through `(q, sigma(q))` with slope `t' r'`, `r' = (sigma(q) - sigma(l)) /
  (q - l)`, where `u > b`, else the chord.
The parameters `(t, t')` are optimised as alpha-CROWN's slopes (Xu et al. 2021); the defaults
take the side of least area (the longer side's slope, CROWN's adaptive rule, Zhang et al. 2018).
Both lines are the piece where the box lies in one piece (exact); elsewhere they are widened by
a few ulps (`relaxations.piecewise.pivot_line`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relaxations.base import Piece
from relaxations.piecewise import (
    SideLines,
    along,
    pivot_line,
    ratio,
    vertex_argmin,
)
from relaxations.registry import InvalidNodeError, OnnxNode, OnnxOp, Spelling, TorchCall, register


def checked_limit(value: Any, what: str) -> float:
    """A limit as a float (infinite allowed, NaN and non-numbers refused: ValueError)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"hardtanh's {what} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"hardtanh's {what} must not be NaN")
    return value


def _hardtanh(min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> dict:
    return {"min": float(min_val), "max": float(max_val)}


def _relu6(inplace: bool = False) -> dict[str, Any]:
    """relu6: clamp to [0, 6]."""
    return {"min": 0.0, "max": 6.0}


def _relu6_module(module: nn.ReLU6) -> dict[str, Any]:
    return {"min": 0.0, "max": 6.0}


def _clamp(min: Any = None, max: Any = None) -> dict[str, Any]:
    """Constant limits only (a missing one is infinite)."""
    for value in (min, max):
        if value is not None and not isinstance(value, (int, float)):
            raise ValueError("clamp limits must be constants (numbers)")
    low = -float("inf") if min is None else float(min)
    return {"min": low, "max": float("inf") if max is None else float(max)}


def _hardtanh_module(module: nn.Hardtanh) -> dict[str, Any]:
    return {"min": float(module.min_val), "max": float(module.max_val)}


def _onnx_clip(node: OnnxNode) -> TorchCall:
    """Clip with constant limits (inputs 1, 2 from opset 11; attributes before): torch.clamp."""
    limits = []
    for i, key in ((1, "min"), (2, "max")):
        value = node.constants[i - 1] if i <= len(node.constants) else node.attributes.get(key)
        if value is not None and torch.as_tensor(value).numel() != 1:
            raise ValueError(f"{key} must be a scalar constant")
        limits.append(None if value is None else float(torch.as_tensor(value).reshape(-1)[0]))
    if limits[0] is not None and limits[1] is not None and limits[0] > limits[1]:
        raise InvalidNodeError(f"min {limits[0]} > max {limits[1]}")
    return TorchCall(torch.clamp, tuple(limits))


_SPELLINGS = (
    Spelling(F.hardtanh, _hardtanh),
    Spelling(F.relu6, _relu6),
    *(Spelling(target, _clamp) for target in (torch.clamp, torch.clip, "clamp", "clip")),
    Spelling(nn.Hardtanh, _hardtanh_module),
    Spelling(nn.ReLU6, _relu6_module),
)


@register("hardtanh", torch=_SPELLINGS, onnx=(OnnxOp("Clip", _onnx_clip),))
class HardtanhRelaxation(SideLines):
    """`clamp(xh, min, max)` (torch's hardtanh, relu6, clamp and clip; ONNX Clip); see the module
    docstring. `min <= max`, `min < inf`, `max > -inf` (ValueError otherwise)."""

    name = "hardtanh"
    monotone = True
    split_at_zero = False
    param_shape = (2,)  # (t of the lower line, t' of the upper line)

    def __init__(self, min: float = -1.0, max: float = 1.0) -> None:
        low, high = checked_limit(min, "min"), checked_limit(max, "max")
        if not low <= high:
            raise ValueError(f"hardtanh needs min <= max, got min {low} > max {high}")
        if low == math.inf or high == -math.inf:
            raise ValueError(
                f"hardtanh's limits must not clamp to an infinity: min {low}, max {high}"
            )
        self.min, self.max = low, high
        self.convex = high == math.inf or low == high
        self.pieces = limits_pieces(low, high)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(min={self.min!r}, max={self.max!r})"

    def forward(self, xh: Tensor) -> Tensor:
        return xh.clamp(self.min, self.max)

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        """The exact range (sigma is monotone)."""
        return self.forward(lower), self.forward(upper)

    def _kinks(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        """The kinks clamped into the box: `p = clamp(a, l, u)`, `q = clamp(b, l, u)`."""
        p = torch.minimum(lower.clamp(min=self.min), upper)
        q = torch.minimum(lower.clamp(min=self.max), upper)
        return p, q

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        """`t = 1` (the chord from the kink) where the part right of `a` is longer than the part
        left of it, `t' = 1` where the part left of `b` is longer than the part right of it."""
        p, q = self._kinks(lower, upper)
        return torch.stack([upper - p > p - lower, q - lower > upper - q], -1).to(lower.dtype)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Where the box crosses a kink (`l < a < u` or `l < b < u`, with `a < b`)."""
        crosses = ((lower < self.min) & (upper > self.min)) | (
            (lower < self.max) & (upper > self.max)
        )
        return crosses & (self.min < self.max)

    def _lines(self, lower: Tensor, upper: Tensor, t_lower: Tensor, t_upper: Tensor):
        """The lower and upper `(slope, intercept)` for the fractions `t_lower`, `t_upper`."""
        loose = self.needs_refinement(lower, upper)
        p, q = self._kinks(lower, upper)
        f_l, f_p, f_q, f_u = (self.forward(x) for x in (lower, p, q, upper))
        right = ratio(f_u - f_p, upper - p)  # the chord from the kink a to u
        left = ratio(f_q - f_l, q - lower)  # the chord from l to the kink b
        # A point box: every line through it is exact; take the piece's slope there.
        on_identity = (lower == upper) & (lower >= self.min) & (lower <= self.max)
        right = torch.where(on_identity & (self.min < self.max), 1.0, right)
        left = torch.where(on_identity & (self.min < self.max), 1.0, left)
        zero = torch.zeros_like(right)
        low_s = along(t_lower, torch.where(lower < self.min, zero, right), right)
        up_s = along(t_upper, torch.where(upper > self.max, zero, left), left)
        low = pivot_line(p, f_p, low_s, lower, upper, loose, -1)
        up = pivot_line(q, f_q, up_s, lower, upper, loose, +1)
        return low, up

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The best of the hull's vertices (ends and clamped kinks)."""
        p, q = self._kinks(lower, upper)
        xs = [lower, p, q, upper]
        return vertex_argmin(coeff_pre, coeff_post, xs, [self.forward(x) for x in xs])


def limits_pieces(low: float, high: float) -> tuple[Piece, ...]:
    """Flat at `low`, the identity, flat at `high` (pieces on an infinite side left out)."""
    if low == high:
        return (Piece(-math.inf, low, 0.0, low), Piece(low, math.inf, 0.0, low))
    pieces = [Piece(low, high, 1.0, 0.0)]
    if low > -math.inf:
        pieces.insert(0, Piece(-math.inf, low, 0.0, low))
    if high < math.inf:
        pieces.append(Piece(high, math.inf, 0.0, high))
    return tuple(pieces)
