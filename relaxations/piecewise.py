"""Shared pieces of the relaxations of piecewise-linear and piecewise-constant functions
(`leaky_relu`, `abs`, `hardtanh`, `sign` / `heaviside`, `floor`).

Each of those functions has, on a box `[l, u]`, a convex hull that is a polygon whose vertices
are finitely many points of the (closed) graph: the box ends, the kinks inside the box, and at a
jump both one-sided limits. So
- the relaxed set is that polygon, and a linear objective is minimised at one of those points
  (`vertex_argmin`; Bunel, De Palma et al., UAI 2020, Sec. 3: the decomposition's oracle);
- every tight line is a supporting line of the polygon at one vertex (the pivot), with a slope
  between the slopes of the two hull edges that meet there; a relaxation's parameter is that
  slope as a fraction `t` in [0, 1] of the range (`along`), as alpha-CROWN's slope of ReLU
  (Xu et al., ICLR 2021) is a fraction of [0, 1];
- a line computed in floating point can miss the function by a rounding error (of the slope,
  of the intercept): `pivot_line` widens it outwards by `PAD_ULPS` units in the last place of
  the magnitudes involved, on the neurons where the line is not exact.
Shapes: `lower`, `upper` `[*shape]`; parameters and slopes broadcast against them (they may carry
leading dimensions, one copy per specification).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor

from relaxations.base import LinearBounds, LinearConstraints, Relaxation, broadcast_shape

# Units in the last place added outwards to the intercept of a line that is not exact. The
# rounding errors are at most ~5 units (the intercept's two operations, the slope's division of
# two rounded differences times the distance to the pivot); 8 leaves room.
PAD_ULPS = 8.0


def unit_clamp(params: Tensor) -> Tensor:
    """Parameters projected onto [0, 1] (NaN, which no step should produce, to 0)."""
    return torch.nan_to_num(params, nan=0.0).clamp(0.0, 1.0)


def along(t: Tensor, start: Tensor, end: Tensor) -> Tensor:
    """`start + t (end - start)` for `t` in [0, 1], clamped between `start` and `end` (rounding
    never leaves the range)."""
    value = start + t * (end - start)
    return torch.minimum(torch.maximum(value, torch.minimum(start, end)), torch.maximum(start, end))


def ratio(num: Tensor, den: Tensor) -> Tensor:
    """`num / den` where `den > 0`, else 0 (no inf, no NaN, none in gradients either)."""
    positive = den > 0
    return torch.where(positive, num / torch.where(positive, den, torch.ones_like(den)), 0.0)


def capped_ratio(num: Tensor, den: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """`num / max(den, w)` where `den > 0` (else 0), `w = max(sqrt(eps), 64 eps (|l| + |u|))`:
    the slope of a hull edge across a jump over a tiny width, capped (for `num >= 0` a smaller
    slope is still in the family of valid lines, so the cap only loosens). It keeps slopes finite
    and moderate (a slope multiplies every error behind it) and the pad of a line,
    `pad(|slope| (|l| + |u|))`, below `num / 8` however narrow the box."""
    eps = torch.finfo(lower.dtype).eps
    floor = torch.clamp(64 * eps * (lower.abs() + upper.abs()), min=eps**0.5)
    return ratio(num, torch.where(den > 0, torch.maximum(den, floor), den))


def pad(scale: Tensor) -> Tensor:
    """`PAD_ULPS` units in the last place of `scale` (its dtype's epsilon), and as many of the
    smallest subnormal (the absolute rounding error of an operation below the normal range)."""
    info = torch.finfo(scale.dtype)
    return PAD_ULPS * info.eps * (scale + info.smallest_normal)


def pivot_line(
    px: Tensor, py: Tensor, slope: Tensor, lower: Tensor, upper: Tensor, loose: Tensor, side: int
) -> tuple[Tensor, Tensor]:
    """`(slope, intercept)` of the line through `(px, py)` with `slope`, moved outwards (`side`
    -1: down, a lower line; +1: up, an upper line) by `pad(|py| + |slope| (|l| + |u|))` where
    `loose` (the rounding of the intercept and of the slope over the box; `|px| <= max(|l|,
    |u|)`). Where `loose` is False the line is as computed (exact pieces)."""
    intercept = py - slope * px
    margin = pad(py.abs() + slope.abs() * (lower.abs() + upper.abs()))
    return slope, intercept + side * torch.where(loose, margin, 0.0)


def vertex_argmin(
    coeff_pre: Tensor, coeff_post: Tensor, xs: list[Tensor], ys: list[Tensor]
) -> tuple[Tensor, Tensor]:
    """Minimiser `(xh, x)` of `coeff_pre * xh + coeff_post * x` among the points `(xs[k],
    ys[k])` (each broadcastable to the inputs): the relaxed set is their convex hull, so a
    vertex attains the minimum. Ties go to the first point."""
    full = broadcast_shape(coeff_pre.shape, coeff_post.shape, *(x.shape for x in xs))
    px = torch.stack([x.expand(full) for x in xs])
    py = torch.stack([y.expand(full) for y in ys])
    value = coeff_pre * px + coeff_post * py
    best = value.argmin(0, keepdim=True)
    return px.gather(0, best)[0], py.gather(0, best)[0]


def stacked_constraints(
    lower_lines: list[tuple[Tensor, Tensor]], upper_lines: list[tuple[Tensor, Tensor]]
) -> LinearConstraints:
    """`LinearConstraints` from lists of `(slope, intercept)` lines, broadcast to one shape and
    stacked on dim 0."""
    shape = broadcast_shape(*(t.shape for line in lower_lines + upper_lines for t in line))

    def stack(lines: list[tuple[Tensor, Tensor]], i: int) -> Tensor:
        return torch.stack([line[i].expand(shape) for line in lines])

    return LinearConstraints(
        lower_slopes=stack(lower_lines, 0),
        lower_intercepts=stack(lower_lines, 1),
        upper_slopes=stack(upper_lines, 0),
        upper_intercepts=stack(upper_lines, 1),
    )


class SideLines(Relaxation):
    """The protocol methods of a relaxation with one line per side chosen by `t, t'` in
    [0, 1] (`params [..., 2]`) between two extreme support lines, from its
    `_lines(lower, upper, t_lower, t_upper) -> ((low_slope, low_intercept), (up_slope,
    up_intercept))` and `default_params`: `linear_bounds` at the (projected) parameters and, as
    `constraints`, the hull's lines at `t = t' = 0` and `t = t' = 1`."""

    def project(self, params: Tensor) -> Tensor:
        return unit_clamp(params)

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, params: Tensor | None = None
    ) -> LinearBounds:
        """`params [..., 2]` (projected here) are `(t, t')`; default: `default_params`."""
        t = self.project(self.default_params(lower, upper) if params is None else params)
        (low_s, low_i), (up_s, up_i) = self._lines(lower, upper, t[..., 0], t[..., 1])
        return LinearBounds(low_s, low_i, up_s, up_i)

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints:
        """Both lower sides (`t = 0`, `t = 1`) and both upper sides (`t' = 0`, `t' = 1`)."""
        zeros, ones = torch.zeros_like(lower), torch.ones_like(lower)
        low0, up0 = self._lines(lower, upper, zeros, zeros)
        low1, up1 = self._lines(lower, upper, ones, ones)
        return stacked_constraints([low0, low1], [up0, up1])


def check_level(value: Any, what: str) -> float:
    """`value` as a finite float; ValueError naming `what` otherwise (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return value
