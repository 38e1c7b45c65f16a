"""Relaxation of `exp` (convex): upper = the chord, lower = the tangent at an optimisable
point (CROWN's relaxation of convex functions, Zhang et al., NeurIPS 2018, Sec. 3.2; the tangent
point optimised as in alpha-CROWN, Xu et al., ICLR 2021).

One parameter (`param_shape = (1,)`): the tangent point `d = l + t (u - l)`. The default is
`d = min((l + u) / 2, l + 0.99)` (auto_LiRPA's choice for exp): the lower line
`e^d (1 + x - d)` is then positive on the whole box (at `l` it is `e^d (1 + l - d) >= 0.01 e^d`),
which keeps a later reciprocal or log (softmax) away from 0.

Overflow: `exp(u)` is `inf` past ~88.7 in float32 (~709.8 in float64), and the chord's slope and
intercept overflow a little earlier (`|b| ~ e^u |l|`). There no finite line is sound, and an
infinite one would turn CROWN's sums into `nan`, so `linear_bounds` and `constraints` raise
ValueError naming the first such index and its box (the caller can report the node, or fall back
to the interval for it); `interval` stays sound with `+inf`. Non-finite bounds raise the same way.
Optimised tangent points whose line overflows (a tangent moved towards `u`) take the default
line on that side instead, so alpha-CROWN never raises where CROWN does not.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relaxations.base import register
from relaxations.s_shaped import SBox, SCurve, SCurveRelaxation
from relaxations.smooth import require_finite_box


@register("exp")
class ExpRelaxation(SCurveRelaxation):
    """exp; see the module docstring."""

    name = "exp"
    convex = True
    monotone = True
    param_shape = (1,)
    checks_finite = True

    def f(self, x: Tensor) -> Tensor:
        return torch.exp(x)

    def df(self, x: Tensor) -> Tensor:
        return torch.exp(x)

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        return torch.exp(lower), torch.exp(upper)

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        require_finite_box(self.name, lower, upper)
        curve = SCurve(self.f, self.df)
        return curve, curve.box(lower, upper, torch.full_like(lower, torch.inf))

    def _defaults(self, curve: SCurve, box: SBox) -> tuple[Tensor, ...]:
        """`t = min(1/2, 0.99 / (u - l))`: the tangent at `min(midpoint, l + 0.99)`."""
        width = box.upper - box.lower
        safe = torch.where(width > 0, width, torch.ones_like(width))
        t = torch.where(width > 0.99 / 0.5, 0.99 / safe, torch.full_like(width, 0.5))
        return (t,)
