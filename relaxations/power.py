"""Relaxations of `x^n` for a constant integer exponent `n >= 2` (option `exponent`), and of
`square` (`n = 2`).

- even `n`: convex; upper = the chord, lower = the tangent at an optimisable point (the
  relaxation of convex functions in CROWN, Zhang et al., NeurIPS 2018, Sec. 3.2; the tangent
  point optimised as alpha-CROWN does, Xu et al., ICLR 2021). One parameter (`param_shape =
  (1,)`): the tangent point as a fraction of `[l, u]`, default 1/2.
- odd `n`: concave on `x <= 0`, convex on `x >= 0`, so `-x^n` is an S-shape with inflection
  point 0 and the lines are `relaxations.s_shaped`'s for `-x^n`, negated (CROWN's S-shaped
  relaxation, appendix A). Two parameters (`[..., 0]` lower line, `[..., 1]` upper line).
`interval` is exact: `[f(l), f(u)]` for odd `n`; for even `n` the maximum of the ends, and 0 or
the smaller end value as the minimum. Exponents 0 and 1 are constant/affine (the front end folds
them) and are refused, as are negative and fractional exponents (ValueError). Where `x^n` or its
slope overflows the dtype (e.g. `|x| > 4.4e12` for `x^3` in float32) no finite sound line exists:
`linear_bounds` and `constraints` raise ValueError naming the index (the interval is still sound,
with `inf`); an optimised tangent point whose line overflows takes the default line instead.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any

import torch
from torch import Tensor

from relaxations.registry import OnnxNode, OnnxOp, Spelling, TorchCall, register
from relaxations.s_shaped import SBox, SCurve, SCurveRelaxation
from relaxations.smooth import require_finite_box


def integer_exponent(exponent: Any) -> int:
    """`exponent` as an int >= 2 (an integral float is accepted), else ValueError."""
    if isinstance(exponent, bool) or not isinstance(exponent, numbers.Real):
        raise ValueError(f"pow relaxation: exponent must be an integer >= 2, got {exponent!r}")
    if not float(exponent).is_integer():
        raise ValueError(f"pow relaxation: only integer exponents are supported, got {exponent!r}")
    n = int(exponent)
    if n in (0, 1):
        raise ValueError(
            f"pow relaxation: exponent {n} makes x^{n} {'constant' if n == 0 else 'affine'}; "
            "the front end folds it instead of relaxing it"
        )
    if n < 0:
        raise ValueError(
            f"pow relaxation: negative exponent {n} is not supported (x^-1 is 'reciprocal')"
        )
    return n


def _exponent(exponent: Any) -> dict[str, Any]:
    """A constant integer exponent (the relaxation refuses the affine 0 and 1)."""
    if isinstance(exponent, torch.Tensor) and exponent.numel() == 1:
        exponent = exponent.item()
    if not isinstance(exponent, (int, float)) or float(exponent) != int(exponent):
        raise ValueError(f"the exponent must be a constant integer, got {exponent!r}")
    return {"exponent": int(exponent)}


def _square() -> dict[str, Any]:
    return {"exponent": 2}


def _onnx_pow(node: OnnxNode) -> TorchCall | None:
    """Pow by a constant integer exponent: torch.pow (x^1 is x: None; x^0 would be 1: refused)."""
    exponent = node.constants[0] if node.constants else None
    if exponent is None or exponent.numel() != 1:
        raise ValueError("the exponent must be a scalar constant")
    value = float(exponent.reshape(-1)[0])
    if value != int(value) or value < 1:
        raise ValueError(f"exponent {value} (only integers >= 1)")
    return None if value == 1 else TorchCall(torch.pow, (int(value),))


_SPELLINGS = (
    *(Spelling(target, _exponent) for target in (torch.pow, operator.pow, "pow")),
    *(Spelling(target, _square) for target in (torch.square, "square")),
)


@register("pow", torch=_SPELLINGS, onnx=(OnnxOp("Pow", _onnx_pow),))
class PowerRelaxation(SCurveRelaxation):
    """`x^n` for an integer `n >= 2`; see the module docstring."""

    name = "pow"
    checks_finite = True

    @property
    def label(self) -> str:
        return f"{self.name} (exponent {self.exponent})"

    def __init__(self, exponent: Any) -> None:
        self.exponent = integer_exponent(exponent)
        even = self.exponent % 2 == 0
        self.convex = even
        self.monotone = not even
        self.param_shape = (1,) if even else (2,)

    def f(self, x: Tensor) -> Tensor:
        return torch.pow(x, self.exponent)

    def df(self, x: Tensor) -> Tensor:
        return self.exponent * torch.pow(x, self.exponent - 1)

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        f_l, f_u = self.f(lower), self.f(upper)
        if self.monotone:
            return f_l, f_u
        straddle = (lower < 0) & (upper > 0)
        low = torch.where(straddle, torch.zeros_like(f_l), torch.minimum(f_l, f_u))
        return low, torch.maximum(f_l, f_u)

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        require_finite_box(self.name, lower, upper)
        if self.convex:  # convex everywhere: the inflection point is at +inf
            curve = SCurve(self.f, self.df)
            return curve, curve.box(lower, upper, torch.full_like(lower, torch.inf))
        curve = SCurve(self.f, self.df, sign=-1.0)  # -x^n: convex on x <= 0
        return curve, curve.box(lower, upper, torch.zeros_like(lower))


@register("square")
class SquareRelaxation(PowerRelaxation):
    """`x^2` (`torch.square`, `x * x`): `pow` with exponent 2 and no options."""

    name = "square"

    def __init__(self) -> None:
        super().__init__(2)
