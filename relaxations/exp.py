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

`clipped_exp`, `min(exp(x), B)` with `B = sqrt(max)` of the dtype, is the softmax's overflow-free
copy of its sum of exps (`relaxations/softmax.py`): an S-shape (convex, then constant), so every
box has finite lines; below the clip level they are exp's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relaxations.registry import register
from relaxations.s_shaped import MonotoneSRelaxation, SBox, SCurve, SCurveRelaxation
from relaxations.smooth import require_finite_box


@register("exp", torch=(torch.exp, "exp"), onnx=("Exp",))
class ExpRelaxation(SCurveRelaxation):
    """exp; see the module docstring."""

    name = "exp"
    output_range = (0.0, float("inf"))
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


def clip_level(dtype: torch.dtype) -> float:
    """`c = log(B)` of the clipped exponential in `dtype`: `B = sqrt(max)` of the dtype, so that
    sums of up to `sqrt(max)` terms and the chords' intercepts (`~ B |l|`) stay finite."""
    return 0.5 * math.log(torch.finfo(dtype).max)


@register("clipped_exp")
class ClippedExpRelaxation(MonotoneSRelaxation):
    """`min(exp(x), B)` with `B = exp(clip_level(dtype))` (the softmax's overflow-free copy of
    its sum of exps, `bounds.fx_nonlinear.softmax`): convex up to `c = log B`, constant after,
    an S-shape with inflection point `c` (`relaxations.s_shaped`: its lines are valid for any
    S-shape, the kink at `c` included: the tangents right of it are the constant `B`).
    Increasing and bounded, so every box, a huge or infinite one included, has finite lines
    (`MonotoneSRelaxation`: the interval's horizontals where the box is huge). On boxes below
    `c` the lines and default tangent point are `exp`'s (`ExpRelaxation`)."""

    name = "clipped_exp"
    convex = False

    def f(self, x: Tensor) -> Tensor:
        c = clip_level(x.dtype)
        return torch.exp(x.clamp(max=c))

    def df(self, x: Tensor) -> Tensor:
        c = clip_level(x.dtype)
        return torch.where(x < c, torch.exp(x.clamp(max=c)), torch.zeros_like(x))

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        huge, zero = self._huge(lower, upper), torch.zeros_like(lower)
        lo, up = torch.where(huge, zero, lower), torch.where(huge, zero, upper)
        curve = SCurve(self.f, self.df)
        return curve, curve.box(lo, up, torch.full_like(lo, clip_level(lo.dtype)))

    def _defaults(self, curve: SCurve, box: SBox) -> tuple[Tensor, ...]:
        """`exp`'s tangent fraction `min(1/2, 0.99 / (u - l))` on convex boxes (below `c`)."""
        p_low, p_up = curve.default_fractions(box)
        width = box.upper - box.lower
        safe = torch.where(width > 0, width, torch.ones_like(width))
        t = torch.where(width > 0.99 / 0.5, 0.99 / safe, torch.full_like(width, 0.5))
        convex = ~box.straddle & (box.c >= box.upper)
        return torch.where(convex, t, p_low), p_up
