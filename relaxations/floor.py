"""Relaxation of `floor` (ONNX Floor, torch.floor): unit steps, `xh - 1 < floor(xh) <= xh`,
tightened to the box.

Where `l` and `u` lie in one interval `[k, k + 1)` floor is the constant `k` (exact). Otherwise
let `A = floor(l) + 1` and `B = floor(u)` (`l < A <= B <= u`, the first and last integers of
the box). The closure of the graph is the union of the steps `[max(l, k), min(u, k + 1)] x
{k}`; its convex hull has the vertices `(l, floor(l))`, `(A, A - 1)`, `(A, A)`, `(B, B - 1)`,
`(B, B)`, `(u, floor(u))` (the step ends; those between lie on the lines `y = x` and `y = x - 1`
through them). Its lower side runs `(l, floor(l)) -> (A, A - 1)` (slope 0) `-> (B, B - 1)` (slope
1, when `B > A`) `-> (u, floor(u))` (slope `1 / (u - B)`, when `u > B`); its upper side `(l,
floor(l)) -> (A, A)` (slope `1 / (A - l)`) `-> (B, B)` (slope 1) `-> (u, floor(u))` (slope 0).
A tight lower line with slope `s` between the first and last lower slopes passes through `(A,
A - 1)` for `s <= 1` and `(B, B - 1)` for `s > 1`; a tight upper line through `(A, A)` for `s >=
1` and `(B, B)` for `s < 1` (support lines of the hull; a CROWN-style relaxation of a general
activation, Zhang et al. 2018, Sec. 3; slopes optimised as alpha-CROWN's, Xu et al. 2021). The
parameters `(t, t')` are the slopes as fractions of those ranges. Defaults: slope 1 (the lines
`x - 1` and `x` moved onto the hull) when the box holds several integers; across one jump the
side of least area. Slopes over tiny widths are capped (`capped_ratio`) and the lines widened
by a few ulps (not exact there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from relaxations.base import LinearBounds, LinearConstraints, Relaxation, polygon_argmin
from relaxations.piecewise import (
    along,
    capped_ratio,
    pivot_line,
    ratio,
    stacked_constraints,
    unit_clamp,
)
from relaxations.registry import register


@register("floor", torch=(torch.floor, "floor"), onnx=("Floor",))
class FloorRelaxation(Relaxation):
    """`floor` (no options); see the module docstring. `pieces` is None (infinitely many)."""

    name = "floor"
    convex = False
    monotone = True
    split_at_zero = False
    param_shape = (2,)  # (t of the lower line, t' of the upper line)
    pieces = None

    def __repr__(self) -> str:
        return "FloorRelaxation()"

    def attack_derivative(self, xh: Tensor) -> Tensor:
        """1: floor stays within 1 of the identity, whose derivative attacks use (BPDA)."""
        return torch.ones_like(xh)

    def forward(self, xh: Tensor) -> Tensor:
        return torch.floor(xh)

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        """The exact range (floor is monotone)."""
        return torch.floor(lower), torch.floor(upper)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Where the box holds an integer `> l` (`floor(l) < floor(u)`)."""
        return torch.floor(lower) < torch.floor(upper)

    def _frame(self, lower: Tensor, upper: Tensor):
        """`(cross, A, B, lower slope range, upper slope range)`; where the box holds no jump
        `A = B = l` and every slope is 0."""
        cross = self.needs_refinement(lower, upper)
        a = torch.where(cross, torch.floor(lower) + 1, lower)
        b = torch.where(cross, torch.floor(upper), lower)
        several = b > a
        inner = torch.where(several, 1.0, 0.0).to(lower.dtype)
        last = capped_ratio(torch.ones_like(upper), upper - b, lower, upper)
        low_end = torch.where(cross, torch.where(upper > b, last, inner), 0.0)
        first = capped_ratio(torch.ones_like(lower), a - lower, lower, upper)
        up_start = torch.where(upper > b, 0.0, torch.where(several, 1.0, first))
        up_start = torch.where(cross, up_start, 0.0)
        up_end = torch.where(cross, first, 0.0)
        return cross, a, b, (torch.zeros_like(low_end), low_end), (up_start, up_end)

    def _lines_at(self, lower: Tensor, upper: Tensor, low_s: Tensor, up_s: Tensor, frame):
        """The support lines with slopes `low_s`, `up_s` (within the ranges of `frame`, the
        `_frame` of the box)."""
        cross, a, b, _, _ = frame
        base = torch.floor(lower)
        low_x = torch.where(low_s <= 1, a, b)
        low_y = torch.where(cross, low_x - 1, base)
        up_x = torch.where(up_s >= 1, a, b)
        up_y = torch.where(cross, up_x, base)
        low = pivot_line(low_x, low_y, low_s, lower, upper, cross, -1)
        up = pivot_line(up_x, up_y, up_s, lower, upper, cross, +1)
        return low, up

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Slope 1 where the box holds several integers; across one jump `A`, `t = 1` where `u -
        A > A - l` and `t' = 1` where `A - l > u - A` (the sides of least area)."""
        _, a, b, (_, low_end), (up_start, up_end) = self._frame(lower, upper)
        several = b > a
        t_low = torch.where(several, ratio(torch.ones_like(low_end), low_end), 0.0)
        t_low = torch.where(~several & (upper - a > a - lower), 1.0, t_low)
        t_up = torch.where(several, ratio(1 - up_start, up_end - up_start), 0.0)
        t_up = torch.where(~several & (a - lower > upper - a), 1.0, t_up)
        return unit_clamp(torch.stack([t_low, t_up], -1))

    def project(self, params: Tensor) -> Tensor:
        return unit_clamp(params)

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, params: Tensor | None = None
    ) -> LinearBounds:
        """See the module docstring; `params [..., 2]` (projected here) are `(t, t')`."""
        frame = self._frame(lower, upper)
        (low0, low1), (up0, up1) = frame[3], frame[4]
        t = self.project(self.default_params(lower, upper) if params is None else params)
        low_s, up_s = along(t[..., 0], low0, low1), along(t[..., 1], up0, up1)
        (low_s, low_i), (up_s, up_i) = self._lines_at(lower, upper, low_s, up_s, frame)
        return LinearBounds(low_s, low_i, up_s, up_i)

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The best vertex of the `constraints` polygon (`polygon_argmin`): the hull of the six
        points `(l, floor(l))`, `(A, A - 1)`, `(A, A)`, `(B, B - 1)`, `(B, B)`, `(u, floor(u))`,
        widened where a slope is capped or a line padded (so the oracle and the LP agree)."""
        cons = self.constraints(lower, upper)
        return polygon_argmin(cons, coeff_pre, coeff_post, lower, upper)

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints:
        """The hull: the support lines at each side's end slopes and at slope 1 (clamped into
        the ranges), three below and three above."""
        frame = self._frame(lower, upper)
        (low0, low1), (up0, up1) = frame[3], frame[4]
        ones = torch.ones_like(lower)
        middle = (ones.clamp(low0, low1), ones.clamp(up0, up1))  # slope 1, in the ranges
        slopes = ((low0, up0), middle, (low1, up1))
        lines = [self._lines_at(lower, upper, low_s, up_s, frame) for low_s, up_s in slopes]
        return stacked_constraints([low for low, _ in lines], [up for _, up in lines])
