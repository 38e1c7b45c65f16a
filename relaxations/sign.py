"""Relaxations of monotone steps at 0: `sigma(xh) = low` for `xh < 0`, `zero` at 0, `high` for
`xh > 0` (`low <= zero <= high`): `sign` (ONNX Sign, torch.sign: -1, 0, 1) and `heaviside`
(torch.heaviside with a constant value at 0: 0, value, 1).

Piecewise constant and discontinuous at 0, so the relaxation is the convex hull of the closure
of the graph (sound: it contains the graph). With `c = clamp(0, l, u)`, the hull's vertices are
`(l, sigma(l))`, `(u, sigma(u))`, and at `c` the lowest and highest values the closure takes
there: `lo_c = low` if `l < 0` (the left limit) else `sigma(c)`, `hi_c = high` if `u > 0` (the
right limit) else `sigma(c)`. On a box crossing 0 (`l < 0 < u`) that is the quadrilateral
`(l, low)`, `(0, low)`, `(0, high)`, `(u, high)`; on `[l, 0]` the triangle `(l, low)`, `(0,
low)`, `(0, zero)`; on `[0, u]` the triangle `(0, zero)`, `(0, high)`, `(u, high)`. Its lower
side is `(l, sigma(l)) -> (c, lo_c)` (flat) then `(c, lo_c) -> (u, sigma(u))`, so every tight
lower line passes through `(c, lo_c)` with a slope `s = t r`, `r = (sigma(u) - lo_c) / (u - c)`,
`t` in [0, 1] the parameter; mirrored above through `(c, hi_c)` with `s' = t' r'`, `r' = (hi_c -
sigma(l)) / (c - l)`. These are the support lines of the hull (a CROWN-style relaxation of a
general activation, Zhang et al. 2018, Sec. 3 and appendix; slopes optimised as alpha-CROWN's,
Xu et al. 2021). Defaults: the side of least area (`t = 1` where `u > -l`, `t' = 1` where `-l >
u`). The slopes across the jump are capped over tiny widths (`capped_ratio`: the lines stay
valid, slightly looser, and finite) and the lines widened by a few ulps where not exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relaxations.base import Piece, polygon_argmin
from relaxations.piecewise import (
    SideLines,
    along,
    capped_ratio,
    check_level,
    pivot_line,
)
from relaxations.registry import register


class StepRelaxation(SideLines):
    """The step `(low, zero, high)` at 0; see the module docstring. Subclasses fix the levels
    and register themselves."""

    name = "step"
    convex = False
    monotone = True
    split_at_zero = False
    param_shape = (2,)  # (t of the lower line, t' of the upper line)

    def __init__(self, low: float, zero: float, high: float) -> None:
        self.low = check_level(low, "low")
        self.zero = check_level(zero, "zero")
        self.high = check_level(high, "high")
        if not self.low <= self.zero <= self.high:
            raise ValueError(f"a step needs low <= zero <= high, got {low}, {zero}, {high}")
        self.pieces = (
            Piece(-torch.inf, 0.0, 0.0, self.low),
            Piece(0.0, 0.0, 0.0, self.zero),
            Piece(0.0, torch.inf, 0.0, self.high),
        )

    def forward(self, xh: Tensor) -> Tensor:
        level = torch.where(xh > 0, self.high, xh.new_full((), self.zero))
        return torch.where(xh < 0, self.low, level)

    def attack_derivative(self, xh: Tensor) -> Tensor:
        """`sech^2(xh / s)`, `s` half the standard deviation of `xh` over the tensor: the
        derivative of a smoothed step (`tanh(xh / s)`), so the inputs near the jump, those an
        attack can flip, carry the gradient, at any scale of `xh` (raw pixels or normalised)."""
        scale = 0.5 * xh.detach().std() if xh.numel() > 1 else xh.new_ones(())
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.cosh(xh.detach() / scale).pow(-2)

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        """The exact range (sigma is monotone)."""
        return self.forward(lower), self.forward(upper)

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        """The sides of least area: `t = 1` where `u > -l`, `t' = 1` where `-l > u`."""
        return torch.stack([upper > -lower, -lower > upper], -1).to(lower.dtype)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Where the box is not inside one constant piece: `l < 0 < u`, or `[l, 0]` with `zero
        != low`, or `[0, u]` with `zero != high` (`sign` on `[0, u]` takes 0 and 1)."""
        crossing = (lower < 0) & (upper > 0)
        left = (lower < 0) & (upper == 0) & (self.zero != self.low)
        right = (lower == 0) & (upper > 0) & (self.zero != self.high)
        return crossing | left | right

    def _points(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`c = clamp(0, l, u)` and the lowest and highest values of the closure at `c`."""
        c = torch.minimum(lower.clamp(min=0), upper)
        f_c = self.forward(c)
        lo_c = torch.where(lower < 0, self.low, f_c).to(lower.dtype)
        hi_c = torch.where(upper > 0, self.high, f_c).to(lower.dtype)
        return c, lo_c, hi_c

    def _lines(self, lower: Tensor, upper: Tensor, t_lower: Tensor, t_upper: Tensor):
        """The lower and upper `(slope, intercept)` for the fractions `t_lower`, `t_upper`."""
        loose = self.needs_refinement(lower, upper)
        c, lo_c, hi_c = self._points(lower, upper)
        zero = torch.zeros_like(c)
        right = capped_ratio(self.forward(upper) - lo_c, upper - c, lower, upper)
        left = capped_ratio(hi_c - self.forward(lower), c - lower, lower, upper)
        low = pivot_line(c, lo_c, along(t_lower, zero, right), lower, upper, loose, -1)
        up = pivot_line(c, hi_c, along(t_upper, zero, left), lower, upper, loose, +1)
        return low, up

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The best vertex of the `constraints` polygon (`polygon_argmin`): the hull of the
        ends and of `c` at its lowest and highest, widened where a slope is capped or a line
        padded (so the oracle and the LP agree)."""
        cons = self.constraints(lower, upper)
        return polygon_argmin(cons, coeff_pre, coeff_post, lower, upper)


@register("sign", torch=(torch.sign, "sign"), onnx=("Sign",))
class SignRelaxation(StepRelaxation):
    """`sign`: -1, 0, 1 (no options)."""

    name = "sign"

    def __init__(self) -> None:
        super().__init__(-1.0, 0.0, 1.0)

    def __repr__(self) -> str:
        return "SignRelaxation()"

    def forward(self, xh: Tensor) -> Tensor:
        return torch.sign(xh)


@register("heaviside")
class HeavisideRelaxation(StepRelaxation):
    """`torch.heaviside(xh, value)`: 0, `value` (in [0, 1]), 1."""

    name = "heaviside"

    def __init__(self, value: float = 0.5) -> None:
        value = check_level(value, "heaviside's value")
        if not 0 <= value <= 1:
            raise ValueError(f"heaviside's value must be in [0, 1] (a monotone step), got {value}")
        super().__init__(0.0, value, 1.0)

    def __repr__(self) -> str:
        return f"HeavisideRelaxation(value={self.zero!r})"
