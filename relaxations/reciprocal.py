"""Relaxation of `1 / x` on boxes that exclude 0 (CROWN's relaxation of convex/concave
functions, Zhang et al., NeurIPS 2018, Sec. 3.2; the tangent point optimised as in alpha-CROWN,
Xu et al., ICLR 2021).

- `l > 0`: convex; upper = the chord, lower = the tangent at `d = l + t (u - l)`;
- `u < 0`: concave; lower = the chord, upper = the tangent at `d = l + t (u - l)`.
One parameter (`param_shape = (1,)`, the tangent fraction `t`, default 1/2). `interval` is
exact, `[1/u, 1/l]` (decreasing on each branch). A box that contains or touches 0 has no bounded
relaxation: every method raises ValueError naming the first such index and its box (the caller
names the node). Boxes whose lines overflow the dtype (`l` within ~1e-19 of 0 in float32) raise
ValueError too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relaxations.registry import register
from relaxations.s_shaped import SBox, SCurve, SCurveRelaxation
from relaxations.smooth import first_index, require_finite_box


def require_no_zero(lower: Tensor, upper: Tensor) -> None:
    """ValueError naming the first index where `[lower, upper]` contains or touches 0."""
    bad = ~((lower > 0) | (upper < 0))
    if bad.any():
        idx = first_index(bad)
        raise ValueError(
            f"reciprocal relaxation: the input box [{float(lower[idx]):.6g}, "
            f"{float(upper[idx]):.6g}] at index {idx} contains or touches 0, where 1/x is "
            "unbounded; bounds on the denominator must exclude 0"
        )


@register("reciprocal", torch=(torch.reciprocal, "reciprocal"), onnx=("Reciprocal",))
class ReciprocalRelaxation(SCurveRelaxation):
    """`1 / x` on boxes excluding 0; see the module docstring."""

    name = "reciprocal"
    convex = False  # convex only on x > 0
    monotone = False  # decreasing on each branch, not on the line
    param_shape = (1,)
    checks_finite = True

    def f(self, x: Tensor) -> Tensor:
        return torch.reciprocal(x)

    def df(self, x: Tensor) -> Tensor:
        return -torch.reciprocal(x).square()

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        require_no_zero(lower, upper)
        return torch.reciprocal(upper), torch.reciprocal(lower)

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        require_finite_box(self.name, lower, upper)
        require_no_zero(lower, upper)
        inf = torch.full_like(lower, torch.inf)
        c = torch.where(lower > 0, inf, -inf)  # convex branch: c past u; concave: c before l
        curve = SCurve(self.f, self.df)
        return curve, curve.box(lower, upper, c)
