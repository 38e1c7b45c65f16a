"""Relaxation of one softmax output as a function of its logit differences,
`f(y) = 1 / (1 + sum_k exp(y_k))` with `y_k = x_{j_k} - x_i` over the `m = n - 1` other logits
(`softmax(x)_i = f(y)` exactly; the `j = i` term `exp(0) = 1` is the constant 1). Elementwise
over the inputs' common shape (the `MultiRelaxation` protocol), with `m + 1` inputs: the `m`
differences, and last the clipped sum `P = sum_k min(exp(y_k), B)` (`clipped_exp`,
`relaxations/exp.py`), which `f` does not depend on: its bounds (CROWN's, through the network,
as tight as the exp / sum / reciprocal composition's bounds on its sum) narrow the range of
the denominator `S = 1 + sum_k exp(y_k)`: `S >= 1 + P` always, and `S = 1 + P` where `P < B`.
Every line has slope 0 on `P`.

Interval (exact on the box up to rounding: `f` decreases in every `y_k`):
`exp(-lse(0, u)) <= f <= exp(-lse(0, l))` with `lse` the log-sum-exp (stable for any range:
a huge `u_k` gives the limit 0, a huge negative `l` the limit 1), intersected with `1 / S`
over the denominator's range, rounded outwards within [0, 1].

Lines: the composition of CROWN's relaxations of `exp` (convex) and of `r(S) = 1 / S` (convex,
decreasing) on `S = 1 + sum_k exp(y_k)` in `[S_l, S_u]` (the range above)
(Zhang et al., NeurIPS 2018, Sec. 3.2; the softmax as exp, sum and reciprocal: Shi et al.,
ICLR 2020, "Robustness verification for transformers"), done in closed form:
- lower: `1 / S >= 2 q - q^2 S` for any `q > 0` (the tangent at `t = 1 / q`; the gap is
  `(1 - q S)^2 / S >= 0`), and `S <= 1 + sum_k (c_k y_k + d_k)` with `(c_k, d_k)` the chord of
  `exp` on `[l_k, u_k]`; the tangent point is `t = S_l + theta (S_u - S_l)`, by default the
  midpoint (CROWN's default for the reciprocal);
- upper: the chord of `1 / S` on `[S_l, S_u]`, slope `alpha = -1 / (S_l S_u) <= 0` (0 when
  `S_u` overflows: the constant `1 / S_l`), and `S >= 1 + sum_k e^{p_k} (1 + y_k - p_k)`, the
  tangents of `exp` at `p_k = l_k + tau_k (u_k - l_k)` (by default `tau_k = min(1/2, 0.99 /
  (u_k - l_k))`, auto_LiRPA's tangent point for exp).
Each line is valid for whatever slope rounding gave (intercepts are fitted at the box ends of
each convex piece, as in `relaxations.smooth`) and moves outwards by a rounding margin. Where a
line is not finite (`exp(u_k)` overflows: logit differences of thousands), that side is the
constant from the interval, so every range has a sound finite relaxation.

Parameters (`param_shape = (m + 1,)`, fractions in [0, 1]): `[..., 0]` is `theta` (the lower
line), `[..., 1 + k]` is `tau_k` (the upper line).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relaxations.base import (
    MultiLinearBounds,
    MultiLinearConstraints,
    MultiRelaxation,
    broadcast_shape,
)
from relaxations.exp import clip_level
from relaxations.registry import register
from relaxations.smooth import (
    MARGIN_ULPS,
    chord_slope,
    fraction_point,
    highest_intercept,
    outward_margin,
)


def _log_denominator(ys: tuple[Tensor, ...]) -> Tensor:
    """`log(1 + sum_k exp(y_k))`, stable for any range (broadcast shape)."""
    parts = torch.broadcast_tensors(*ys)
    return torch.logsumexp(torch.stack([torch.zeros_like(parts[0]), *parts]), 0)


def _relative_margin(lse: Tensor, m: int) -> Tensor:
    """Relative error bound of `exp(+-lse)`: `lse` is accurate to a few ulps of `|lse|` plus
    one per term of the sum, and `exp` adds its own few ulps."""
    eps = torch.finfo(lse.dtype).eps
    return MARGIN_ULPS * eps * (lse.abs() + m + 4)


def _broadcast(lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...], *more: Tensor):
    shape = broadcast_shape(*(t.shape for t in (*lowers, *uppers, *more)))
    return (
        tuple(t.expand(shape) for t in lowers),
        tuple(t.expand(shape) for t in uppers),
        shape,
    )


def _finite(*tensors: Tensor) -> Tensor:
    ok = torch.isfinite(tensors[0])
    for t in tensors[1:]:
        ok = ok & torch.isfinite(t)
    return ok


def _lower_line(lowers, uppers, theta, s_l, s_u):
    """`f >= 2 q - q^2 (1 + sum_k (c_k y_k + d_k))`, `q = 1 / t`, `t = S_l + theta (S_u - S_l)`:
    `(slopes, intercept)`, possibly not finite."""
    q = torch.reciprocal(fraction_point(s_l, s_u, theta))
    slopes, total, size = [], torch.ones_like(q), torch.ones_like(q)
    for lo, up in zip(lowers, uppers):
        e_l, e_u = torch.exp(lo), torch.exp(up)
        c = chord_slope(torch.exp, torch.exp, lo, up, e_l, e_u)
        d = highest_intercept(c, (lo, up), (e_l, e_u))
        slopes.append(-(c * q) * q)
        total = total + d
        size = size + d.abs() + c.abs() * torch.maximum(lo.abs(), up.abs()) + e_u
    intercept = 2 * q - (total * q) * q
    return slopes, intercept - outward_margin(q, 2 * q, (size * q) * q)


def _upper_line(lowers, uppers, taus, s_l, s_u):
    """`f <= beta + alpha (1 + sum_k e^{p_k} (1 + y_k - p_k))` with `alpha S + beta` the chord
    of `1 / S` on `[S_l, S_u]` (the constant `1 / S_l` where `S_u` is infinite): `(slopes,
    intercept)`, possibly not finite."""
    finite_u = torch.isfinite(s_u)
    s_u = torch.where(finite_u, s_u, s_l)
    r_l, r_u = torch.reciprocal(s_l), torch.reciprocal(s_u)
    alpha = torch.where(finite_u, -(r_l * r_u), torch.zeros_like(r_l))
    beta = torch.where(finite_u, torch.maximum(r_l - alpha * s_l, r_u - alpha * s_u), r_l)
    slopes, total, size = [], torch.ones_like(alpha), torch.ones_like(alpha)
    for k, (lo, up) in enumerate(zip(lowers, uppers)):
        p = fraction_point(lo, up, taus[..., k])
        g = torch.exp(p)
        slopes.append(alpha * g)
        total = total + g * (1 - p)
        size = size + g * (1 + p.abs() + torch.maximum(lo.abs(), up.abs()))
    intercept = beta + alpha * total
    return slopes, intercept + outward_margin(alpha, beta, alpha.abs() * size)


def _guarded(line, lowers, uppers, params, s_l, s_u, fallback, need_finite_u):
    """`line(...)` where it is finite, the constant `fallback` elsewhere. The line is computed
    again on harmless inputs (0) at the elements it cannot be used for, so that no `inf` or
    `nan` enters it and its gradients (alpha-CROWN) stay finite."""
    with torch.no_grad():
        slopes, intercept = line(lowers, uppers, params, s_l, s_u)
        ok = _finite(intercept, *slopes, s_l) & (torch.isfinite(s_u) | (not need_finite_u))
    zero, one = torch.zeros_like(fallback), torch.ones_like(fallback)
    lowers = tuple(torch.where(ok, t, zero) for t in lowers)
    uppers = tuple(torch.where(ok, t, zero) for t in uppers)
    s_l, s_u = torch.where(ok, s_l, one), torch.where(ok, s_u, one)
    slopes, intercept = line(lowers, uppers, params, s_l, s_u)
    slopes = tuple(torch.where(ok, s, zero) for s in slopes)
    return slopes, torch.where(ok, intercept, fallback)


@register("softmax")
class SoftmaxRelaxation(MultiRelaxation):
    """`1 / (1 + sum_k exp(y_k))` of `terms` logit differences, plus the clipped sum `P` as
    the last input (bounds only); see the module docstring."""

    name = "softmax"
    output_range = (0.0, 1.0)  # exact: intervals widened for rounding stay in it
    convex = False
    monotone = False  # decreasing in every difference, but of several inputs
    split_at_zero = False
    pieces = None

    def __init__(self, terms: int) -> None:
        if not isinstance(terms, int) or terms < 1:
            raise ValueError(f"softmax relaxation needs terms >= 1, got {terms!r}")
        self.terms = terms
        self.n_inputs = terms + 1
        self.param_shape = (terms + 1,)

    def _split(self, inputs: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], Tensor]:
        if len(inputs) != self.n_inputs:
            raise ValueError(f"softmax relaxation: {len(inputs)} inputs, expected {self.n_inputs}")
        return tuple(inputs[:-1]), inputs[-1]

    def forward(self, *inputs: Tensor) -> Tensor:
        ys, _ = self._split(inputs)
        return torch.exp(-_log_denominator(ys))

    def _range(self, lowers, uppers) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`(f_lo, f_hi, S_l, S_u)`: the interval of `f` and of `S = 1 / f`, rounded outwards
        (`S_l`, `S_u` are `inf` where they would overflow), from the differences' box and the
        clipped sum's interval `[P_l, P_u]`: `S >= 1 + P`, and `S = 1 + P` when `P_u < B`."""
        (ys_l, p_l), (ys_u, p_u) = self._split(lowers), self._split(uppers)
        info = torch.finfo(p_l.dtype)
        lse_l, lse_u = _log_denominator(ys_l), _log_denominator(ys_u)
        rel_l = _relative_margin(lse_l, self.terms).clamp(max=1.0)
        rel_u = _relative_margin(lse_u, self.terms).clamp(max=1.0)
        cap = math.log(info.max) - 1.0  # exp(lse) (1 + rel) stays finite below it

        def exp_or_inf(lse: Tensor, factor: Tensor) -> Tensor:
            small = lse < cap
            return torch.where(small, torch.exp(torch.where(small, lse, 0.0)) * factor, torch.inf)

        rel = MARGIN_ULPS * info.eps * (self.terms + 4)
        s_l = torch.maximum(exp_or_inf(lse_l, 1 - rel_l), (1 + p_l) * (1 - rel)).clamp(min=1.0)
        s_u = exp_or_inf(lse_u, 1 + rel_u)
        unclipped = p_u * (1 + rel) < math.exp(clip_level(p_u.dtype))
        s_u = torch.where(unclipped, torch.minimum(s_u, (1 + p_u) * (1 + rel)), s_u)
        s_u = torch.maximum(s_u, s_l)
        f_lo = (torch.exp(-lse_u) * (1 - rel_u) - info.tiny).clamp(0.0, 1.0)
        f_hi = (torch.exp(-lse_l) * (1 + rel_l) + info.tiny).clamp(0.0, 1.0)
        f_lo = torch.maximum(f_lo, torch.reciprocal(s_u) * (1 - 2 * info.eps) - info.tiny)
        f_hi = torch.minimum(f_hi, torch.reciprocal(s_l) * (1 + 2 * info.eps) + info.tiny)
        return f_lo, f_hi, s_l, s_u

    def interval(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor]:
        f_lo, f_hi, _, _ = self._range(lowers, uppers)
        return f_lo, f_hi

    def default_params(self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]) -> Tensor:
        """`theta = 1/2` (the tangent of `1 / S` at the midpoint of `[S_l, S_u]`, CROWN's
        default for the reciprocal) and `tau_k = min(1/2, 0.99 / (u_k - l_k))`."""
        lowers, uppers, shape = _broadcast(lowers, uppers)
        theta = lowers[0].new_full(shape, 0.5)
        taus = []
        for lo, up in zip(lowers[:-1], uppers[:-1]):
            width = up - lo
            safe = torch.where(width > 0, width, torch.ones_like(width))
            taus.append(torch.where(width > 0.99 / 0.5, 0.99 / safe, torch.full_like(width, 0.5)))
        return torch.stack([theta, *taus], -1)

    def project(self, params: Tensor) -> Tensor:
        return params.clamp(0.0, 1.0)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Every input neuron that is not fixed."""
        return upper > lower

    def linear_bounds(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...], params: Tensor | None = None
    ) -> MultiLinearBounds:
        """One lower and one upper line per element (see the module docstring; slope 0 on the
        clipped sum); `params` (projected onto [0, 1]) choose the tangent points."""
        if params is None:
            params = self.default_params(lowers, uppers)
        params = self.project(params)
        lowers, uppers, _ = _broadcast(lowers, uppers, params[..., 0])
        f_lo, f_hi, s_l, s_u = self._range(lowers, uppers)
        (ys_l, _), (ys_u, _) = self._split(lowers), self._split(uppers)
        theta, taus = params[..., 0], params[..., 1:]
        low = _guarded(_lower_line, ys_l, ys_u, theta, s_l, s_u, f_lo, True)
        up = _guarded(_upper_line, ys_l, ys_u, taus, s_l, s_u, f_hi, False)
        zero = torch.zeros_like(f_lo)
        return MultiLinearBounds((*low[0], zero), low[1], (*up[0], zero), up[1])

    def constraints(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]
    ) -> MultiLinearConstraints:
        """The default lines (one per side): the set `argmin` minimises over."""
        lines = self.linear_bounds(lowers, uppers)
        return MultiLinearConstraints(
            tuple(s.unsqueeze(0) for s in lines.lower_slopes), lines.lower_intercept.unsqueeze(0),
            tuple(s.unsqueeze(0) for s in lines.upper_slopes), lines.upper_intercept.unsqueeze(0),
        )  # fmt: skip

    def argmin(
        self,
        coeffs_pre: tuple[Tensor, ...],
        coeff_post: Tensor,
        lowers: tuple[Tensor, ...],
        uppers: tuple[Tensor, ...],
    ) -> tuple[tuple[Tensor, ...], Tensor]:
        """Minimiser of `sum_k a_k y_k + c z` over `constraints`: `z` on the lower line where
        `c >= 0` (else the upper one), then each input at the end its total coefficient
        prefers (the objective is then separable over the box)."""
        lines = self.linear_bounds(lowers, uppers)
        on_lower = coeff_post >= 0
        ys = []
        for a, lo, up, s_low, s_up in zip(
            coeffs_pre, lowers, uppers, lines.lower_slopes, lines.upper_slopes
        ):
            total = a + coeff_post * torch.where(on_lower, s_low, s_up)
            ys.append(torch.where(total >= 0, lo, up))
        z_low = lines.lower_intercept + sum(s * y for s, y in zip(lines.lower_slopes, ys))
        z_up = lines.upper_intercept + sum(s * y for s, y in zip(lines.upper_slopes, ys))
        return tuple(ys), torch.where(on_lower, z_low, z_up)
