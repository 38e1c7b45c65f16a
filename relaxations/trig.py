"""Relaxations of `sin` and `cos` (periodic, neither convex nor concave; `f'' = -f`).

Inflection points are `phase + k pi` (sin: 0, cos: pi/2); the box is classified (in float64,
whatever the input dtype) by how many it contains:
- none: `f` has one sign on the box, so it is concave (`f >= 0`) or convex (`f <= 0`) there:
  chord on one side, tangent at an optimisable point on the other (exact convex/concave pieces);
- one, at `c`: `f` is an S-shape around `c` (convex then concave where `f'(c) > 0`, else the
  mirror image): CROWN's S-shaped relaxation (Zhang et al., NeurIPS 2018, appendix A) of
  `sign * f` from `relaxations.s_shaped`, with optimisable tangent points (alpha-CROWN, Xu et
  al., ICLR 2021);
- two or more: curvature-bounded lines. With `m <= f <= M` on the box (the exact interval),
  `f'' = -f` lies in `[-M, -m]`, so for the chord `C` through both ends,
  `C - max(0, -m) w^2 / 8 <= f <= C + max(0, M) w^2 / 8` (`w = u - l`; the error of linear
  interpolation is at most `max |f''| (x - l)(u - x) / 2`). `linear_bounds` takes whichever of
  that line and the horizontal `m` (resp. `M`) is higher (lower) at the box's middle;
  `constraints` keeps both. Parameters are unused there.
Misclassifying a box whose end lies within rounding distance of an inflection point is harmless:
`f` deviates from the assumed curvature only by `O(delta^3)` on that sliver, far below the
rounding margin every line carries (`relaxations.smooth`).

`interval` is exact: the ends' values, widened to +-1 where a maximum `max_phase + 2 pi k` or a
minimum lies in the box (decided in float64 with a tolerance of a few ulps of the ends, erring
towards +-1, which is sound). Boxes with an end beyond `HUGE` (1e12, where float64 cannot
resolve the period to the tolerance) or not finite get `[-1, 1]` and horizontal lines.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relaxations.base import LinearBounds
from relaxations.registry import register
from relaxations.s_shaped import SBox, SCurve, SCurveRelaxation, horizontal
from relaxations.smooth import full_lines, highest_intercept, lowest_intercept, outward_margin

HUGE = 1e12
D = torch.float64


def _huge(lower: Tensor, upper: Tensor) -> Tensor:
    return ~((lower.abs() <= HUGE) & (upper.abs() <= HUGE))  # also inf and NaN


def _contains(lower64: Tensor, upper64: Tensor, phase: float) -> Tensor:
    """Whether some `phase + 2 pi k` lies in `[lower, upper]` widened by a few ulps (float64)."""
    tol = 8 * torch.finfo(D).eps * (lower64.abs() + upper64.abs() + 1)
    lo, up = lower64 - tol, upper64 + tol
    k = torch.floor((up - phase) / (2 * math.pi))
    found = torch.zeros_like(lo, dtype=torch.bool)
    for j in (k - 1, k, k + 1):
        p = phase + 2 * math.pi * j
        found = found | ((p >= lo) & (p <= up))
    return found


class _TrigRelaxation(SCurveRelaxation):
    """sin or cos: subclasses set the phases and `f`, `df`; see the module docstring."""

    inflection_phase: float
    max_phase: float
    min_phase: float
    sign_even: float  # sign of f'(c) at the inflection point phase + k pi with k even

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        l64, u64 = lower.to(D), upper.to(D)
        f_l, f_u = self.f(lower), self.f(upper)
        huge = _huge(lower, upper)
        one = torch.ones_like(f_l)
        low = torch.where(_contains(l64, u64, self.min_phase) | huge, -one, torch.minimum(f_l, f_u))
        up = torch.where(_contains(l64, u64, self.max_phase) | huge, one, torch.maximum(f_l, f_u))
        return low, up

    def _classify(self, lower: Tensor, upper: Tensor):
        """`(finite lower, finite upper, inflection count, first inflection k)`; huge boxes
        are replaced by [0, 0] and counted as wide (2)."""
        huge, zero = _huge(lower, upper), torch.zeros_like(lower)
        lower, upper = torch.where(huge, zero, lower), torch.where(huge, zero, upper)
        l64, u64 = lower.to(D), upper.to(D)
        k_lo = torch.ceil((l64 - self.inflection_phase) / math.pi)
        k_hi = torch.floor((u64 - self.inflection_phase) / math.pi)
        count = torch.where(huge, torch.full_like(k_lo, 2.0), k_hi - k_lo + 1)
        return lower, upper, count, k_lo

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        lower, upper, count, k = self._classify(lower, upper)
        l64, u64 = lower.to(D), upper.to(D)
        c_one = self.inflection_phase + k * math.pi
        sign_one = self.sign_even * (1 - 2 * torch.remainder(k, 2))
        convex = self.f((l64 + u64) / 2) < 0  # no inflection inside: f'' = -f has one sign
        side = torch.where(convex, torch.inf, -torch.inf)
        one = count == 1
        c = torch.where(one, c_one, side).to(lower.dtype)
        sign = torch.where(one, sign_one, torch.ones_like(sign_one)).to(lower.dtype)
        curve = SCurve(self.f, self.df, sign)
        return curve, curve.box(lower, upper, c)

    def _wide_lines(self, lower: Tensor, upper: Tensor, choose: bool) -> LinearBounds:
        """The curvature-shifted chord (or, if `choose`, whichever of it and the interval's
        horizontal line is tighter at the middle), for boxes with >= 2 inflection points."""
        f_min, f_max = self.interval(lower, upper)
        huge, zero = _huge(lower, upper), torch.zeros_like(lower)
        l, u = torch.where(huge, zero, lower), torch.where(huge, zero, upper)
        f_l, f_u = self.f(l), self.f(u)
        width = u - l
        wide = width > 0
        slope = torch.where(wide, (f_u - f_l) / torch.where(wide, width, 1.0), zero)
        q = width.square() / 8
        shift_up, shift_low = f_max.clamp(min=0) * q, (-f_min).clamp(min=0) * q
        b_low = lowest_intercept(slope, (l, u), (f_l, f_u)) - shift_low
        b_up = highest_intercept(slope, (l, u), (f_l, f_u)) + shift_up
        terms = (f_l, f_u, slope * l, slope * u)
        b_low = b_low - outward_margin(l, b_low, shift_low, *terms)
        b_up = b_up + outward_margin(l, b_up, shift_up, *terms)
        (z, h_low), (_, h_up) = horizontal(f_min, -1.0), horizontal(f_max, 1.0)
        mid = (l + u) / 2
        use_h_low = huge | (choose & (slope * mid + b_low < h_low))
        use_h_up = huge | (choose & (slope * mid + b_up > h_up))
        return full_lines(
            torch.where(use_h_low, z, slope), torch.where(use_h_low, h_low, b_low),
            torch.where(use_h_up, z, slope), torch.where(use_h_up, h_up, b_up),
        )  # fmt: skip

    def _adjust(
        self, lines: LinearBounds, lower: Tensor, upper: Tensor, for_lp: bool
    ) -> LinearBounds:
        """`lines` with the wide boxes' lines where the box holds >= 2 inflection points (for
        the LP the shifted chord, the horizontal being among the constraints anyway)."""
        wide = self._classify(lower, upper)[2] >= 2
        other = self._wide_lines(lower, upper, choose=not for_lp)
        fields = ("lower_slope", "lower_intercept", "upper_slope", "upper_intercept")
        return full_lines(
            *(torch.where(wide, getattr(other, n), getattr(lines, n)) for n in fields)
        )


@register("sin", torch=(torch.sin, "sin"), onnx=("Sin",))
class SinRelaxation(_TrigRelaxation):
    """sin: inflection points `k pi`, maxima `pi/2 + 2 pi k`, minima `-pi/2 + 2 pi k`."""

    name = "sin"
    inflection_phase = 0.0
    max_phase = math.pi / 2
    min_phase = -math.pi / 2
    sign_even = 1.0

    def f(self, x: Tensor) -> Tensor:
        return torch.sin(x)

    def df(self, x: Tensor) -> Tensor:
        return torch.cos(x)


@register("cos", torch=(torch.cos, "cos"), onnx=("Cos",))
class CosRelaxation(_TrigRelaxation):
    """cos: inflection points `pi/2 + k pi`, maxima `2 pi k`, minima `pi + 2 pi k`."""

    name = "cos"
    inflection_phase = math.pi / 2
    max_phase = 0.0
    min_phase = math.pi
    sign_even = -1.0

    def f(self, x: Tensor) -> Tensor:
        return torch.cos(x)

    def df(self, x: Tensor) -> Tensor:
        return -torch.sin(x)
