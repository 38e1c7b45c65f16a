"""The CROWN relaxation of S-shaped functions (Zhang et al., NeurIPS 2018, Sec. 3.2 and
appendix A), with the tangent points as optimisable parameters (alpha-CROWN: Xu et al., ICLR
2021, "Fast and Complete", for general activations).

`g` is an S-shape on the box `[l, u]` when it is convex on `[l, c]` and concave on `[c, u]` for an
inflection point `c` (clamped into the box; `c >= u`: convex only, `c <= l`: concave only).
- convex only: upper = the chord, lower = the tangent at `d` in `[l, u]`;
- concave only: lower = the chord, upper = the tangent at `d` in `[l, u]`;
- straddling (`l < c < u`): the upper line is the tangent at `d` in `[d_l, u]`, where `d_l` in
  `[c, u]` is the point whose tangent passes through `(l, g(l))` (found by bisection, the
  predicate monotone because `T_d(l)` grows with `d` on the concave side); if the tangent at
  `u` already passes below `(l, g(l))` (`d_l >= u`), the upper line is the chord. Mirrored for
  the lower line, tangent at `d` in `[l, d_u]`, `d_u` in `[l, c]` through `(u, g(u))`.
Why any such line is valid, whatever the bisection found: a tangent at `d` on the concave side
is above `g` on `[c, u]`, and `line - g` is concave on `[l, c]`, so it is enough that the line is
above `g` at `l` and `c`; lifting the intercept to `max(g(d) - a d, g(l) - a l)` ensures it at
`l` (at `c` it holds already). The straddling chord uses the slope `min(s, g'(u))`: then
`line - g` is convex and non-increasing on `[c, u]` and concave on `[l, c]`, so being above `g` at
both ends suffices. Every intercept then moves outwards by a rounding margin
(`relaxations.smooth`).

Parameters (`param_shape = (2,)`): fractions `t` in [0, 1] of the tangent points in their valid
range, `[..., 0]` for the lower line (`d = l + t (end - l)`, `end = u` convex only, `d_u`
straddling) and `[..., 1]` for the upper line (`d = start + t (u - start)`, `start = l` concave
only, `d_l` straddling). Defaults: 0.5 (the midpoint) on one-curvature boxes; CROWN's tangents
through the far end point when straddling (lower `t = 1`, upper `t = 0`). Unused on chord sides.
`SCurve` handles `sign * f` for a sign (a number or an elementwise tensor of +-1) so that a
concave-then-convex `f` (x^3, sin around pi) is relaxed as the S-shape `-f`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from relaxations.base import LinearBounds, LinearConstraints, Relaxation, broadcast_shape
from relaxations.smooth import (
    BISECTION_STEPS,
    Fn,
    bisect,
    chord_slope,
    fraction_point,
    full_lines,
    highest_intercept,
    lowest_intercept,
    negated,
    outward_margin,
    require_finite_lines,
)

CONSTRAINT_FRACTIONS = (0.0, 0.5, 1.0)


@dataclass(frozen=True)
class SBox:
    """Everything about a box `[lower, upper]` that the lines need, for `g = sign * f`:
    end values and slopes, the regime masks, and the valid tangent ranges `[lower, low_end]`
    (lower line) and `[up_start, upper]` (upper line). Elementwise tensors of `lower`'s shape."""

    lower: Tensor
    upper: Tensor
    c: Tensor
    g_lower: Tensor
    g_upper: Tensor
    dg_lower: Tensor
    dg_upper: Tensor
    dg_c: Tensor
    straddle: Tensor
    low_tangent: Tensor  # the lower line is a tangent (else a chord)
    up_tangent: Tensor
    low_end: Tensor
    up_start: Tensor


class SCurve:
    """The S-shape machinery for `g = sign * f` (convex left of the inflection point, concave
    right of it on the boxes it is given); lines are returned for `f` itself."""

    def __init__(self, f: Fn, df: Fn, sign: Tensor | float = 1.0) -> None:
        self.f, self.df, self.sign = f, df, sign

    def g(self, x: Tensor) -> Tensor:
        return self.sign * self.f(x)

    def dg(self, x: Tensor) -> Tensor:
        return self.sign * self.df(x)

    def box(self, lower: Tensor, upper: Tensor, c: Tensor) -> SBox:
        """Regimes and tangent ranges for `[lower, upper]` with inflection point `c`."""
        g, dg = self.g, self.dg
        c = torch.maximum(torch.minimum(c, upper), lower)
        convex = c >= upper  # also l = u
        concave = ~convex & (c <= lower)
        straddle = ~convex & ~concave
        gl, gu, dl, du, dc = g(lower), g(upper), dg(lower), dg(upper), dg(c)
        up_chord = gu + du * (lower - upper) <= gl  # the tangent at u passes below (l, g(l))
        low_chord = gl + dl * (upper - lower) >= gu
        low_end, up_start = upper, lower
        if bool(straddle.any()):
            d_l, d_u = self._through_ends(straddle, lower, upper, c, gl, gu)
            low_end = torch.where(straddle & ~low_chord, d_u, lower)
            up_start = torch.where(straddle & ~up_chord, d_l, upper)
        low_end = torch.where(convex, upper, low_end)
        up_start = torch.where(concave, lower, up_start)
        return SBox(
            lower, upper, c, gl, gu, dl, du, dc, straddle,
            low_tangent=convex | (straddle & ~low_chord),
            up_tangent=concave | (straddle & ~up_chord),
            low_end=low_end, up_start=up_start,
        )  # fmt: skip

    @torch.no_grad()
    def _through_ends(self, mask, lower, upper, c, g_lower, g_upper) -> tuple[Tensor, Tensor]:
        """Tangent points whose tangents pass through `(l, g(l))` (in `[c, u]`) and through
        `(u, g(u))` (in `[l, c]`), by bisection on the `mask`ed (straddling) elements only;
        detached. Elsewhere `(u, l)`."""
        shape = mask.shape
        pick = lambda t: torch.broadcast_to(t, shape)[mask]  # noqa: E731
        lo, up, c, gl, gu = (pick(t.detach()) for t in (lower, upper, c, g_lower, g_upper))
        sign = pick(self.sign) if isinstance(self.sign, Tensor) else self.sign
        part = SCurve(self.f, self.df, sign)
        g, dg = part.g, part.dg
        steps = min(BISECTION_STEPS, 4 - int(math.log2(torch.finfo(lo.dtype).eps)))
        _, d_l = bisect(lambda d: g(d) + dg(d) * (lo - d) >= gl, c, up, steps)
        d_u, _ = bisect(lambda d: g(d) + dg(d) * (up - d) > gu, lo, c, steps)
        full_l = torch.broadcast_to(upper.detach(), shape).clone()
        full_u = torch.broadcast_to(lower.detach(), shape).clone()
        full_l[mask], full_u[mask] = d_l, d_u
        return full_l, full_u

    def _lines_g(self, b: SBox, t_low: Tensor, t_up: Tensor) -> LinearBounds:
        """Lines of `g` for tangent fractions `t_low`, `t_up` (clamped to [0, 1])."""
        l, u = b.lower, b.upper
        ends = ((l, u), (b.g_lower, b.g_upper))
        slope = chord_slope(self.g, self.dg, l, u, b.dg_lower, b.dg_upper, b.dg_c)
        # Lower line: tangent at d_low (lifted below every point) or the chord.
        d_low = fraction_point(l, b.low_end, t_low)
        a_t, g_d = self.dg(d_low), self.g(d_low)
        b_t = lowest_intercept(a_t, (d_low, *ends[0]), (g_d, *ends[1]))
        m_t = outward_margin(l, b_t, a_t * l, a_t * u, a_t * d_low)
        a_c = torch.minimum(slope, b.dg_lower)
        b_c = lowest_intercept(a_c, *ends)
        m_c = outward_margin(l, b_c, a_c * l, a_c * u)
        low_a = torch.where(b.low_tangent, a_t, a_c)
        low_b = torch.where(b.low_tangent, b_t - m_t, b_c - m_c)
        # Upper line: tangent at d_up (lifted above every point) or the chord.
        d_up = fraction_point(b.up_start, u, t_up)
        a_t, g_d = self.dg(d_up), self.g(d_up)
        b_t = highest_intercept(a_t, (d_up, *ends[0]), (g_d, *ends[1]))
        m_t = outward_margin(l, b_t, a_t * l, a_t * u, a_t * d_up)
        a_c = torch.minimum(slope, b.dg_upper)
        b_c = highest_intercept(a_c, *ends)
        m_c = outward_margin(l, b_c, a_c * l, a_c * u)
        up_a = torch.where(b.up_tangent, a_t, a_c)
        up_b = torch.where(b.up_tangent, b_t + m_t, b_c + m_c)
        return full_lines(low_a, low_b, up_a, up_b)

    def _for_g(self, p_low: Tensor, p_up: Tensor) -> tuple[Tensor, Tensor]:
        """`f`'s (lower, upper) fractions as `g`'s: swapped where the sign is negative."""
        if isinstance(self.sign, Tensor):
            flip = self.sign < 0
            return torch.where(flip, p_up, p_low), torch.where(flip, p_low, p_up)
        return (p_up, p_low) if self.sign < 0 else (p_low, p_up)

    def lines(self, b: SBox, p_low: Tensor, p_up: Tensor) -> LinearBounds:
        """Lines of `f` for `f`'s fractions (lower line `p_low`, upper line `p_up`)."""
        lines = self._lines_g(b, *self._for_g(p_low, p_up))
        if isinstance(self.sign, Tensor):
            neg = negated(lines)
            flip = self.sign < 0
            return full_lines(
                *(torch.where(flip, n, p) for n, p in zip(_fields(neg), _fields(lines)))
            )
        return negated(lines) if self.sign < 0 else lines

    def default_fractions(self, b: SBox) -> tuple[Tensor, Tensor]:
        """`f`'s default (lower, upper) fractions: midpoints, or CROWN's through-end tangents."""
        half = torch.full_like(b.lower, 0.5)
        t_low_g = torch.where(b.straddle, torch.ones_like(half), half)
        t_up_g = torch.where(b.straddle, torch.zeros_like(half), half)
        return self._for_g(t_low_g, t_up_g)

    def constraint_lines(self, b: SBox) -> tuple[LinearBounds, ...]:
        """Lines of `f` at the fractions `CONSTRAINT_FRACTIONS` (both sides at once)."""
        out = []
        for t in CONSTRAINT_FRACTIONS:
            frac = torch.full_like(b.lower, t)
            out.append(self.lines(b, frac, frac))
        return tuple(out)


def _fields(lines: LinearBounds) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return lines.lower_slope, lines.lower_intercept, lines.upper_slope, lines.upper_intercept


def _all_finite(lines: LinearBounds) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in _fields(lines))


def _or_default(lines: LinearBounds, default: LinearBounds) -> LinearBounds:
    """`lines`, with each side replaced by `default`'s where it is not finite."""
    a_l, b_l, a_u, b_u = torch.broadcast_tensors(*_fields(lines))
    d_l, e_l, d_u, e_u = torch.broadcast_tensors(*_fields(default))
    ok_l = torch.isfinite(a_l) & torch.isfinite(b_l)
    ok_u = torch.isfinite(a_u) & torch.isfinite(b_u)
    return LinearBounds(
        torch.where(ok_l, a_l, d_l), torch.where(ok_l, b_l, e_l),
        torch.where(ok_u, a_u, d_u), torch.where(ok_u, b_u, e_u),
    )  # fmt: skip


def stack_constraints(lines: tuple[LinearBounds, ...]) -> LinearConstraints:
    """`LinearConstraints` from several `LinearBounds` (broadcast to one shape)."""
    low = [(x.lower_slope, x.lower_intercept) for x in lines]
    up = [(x.upper_slope, x.upper_intercept) for x in lines]
    shape = broadcast_shape(*(t.shape for pair in low + up for t in pair))
    stack = lambda pairs, k: torch.stack([p[k].expand(shape) for p in pairs])  # noqa: E731
    return LinearConstraints(stack(low, 0), stack(low, 1), stack(up, 0), stack(up, 1))


def horizontal(value: Tensor, outward: float) -> tuple[Tensor, Tensor]:
    """The line `x = value` moved by a rounding margin (`outward` = -1 below, +1 above)."""
    return torch.zeros_like(value), value + outward * outward_margin(value, value)


class SCurveRelaxation(Relaxation):
    """The protocol for a relaxation built on `SCurve`: subclasses supply `f`, `df`, `interval`
    and `_curve(lower, upper) -> (SCurve, SBox)` (which validates the box), and may override
    `_adjust(lines, lower, upper, for_lp)` (a last pass over the lines for special regimes)
    and `_defaults`. With `checks_finite`, lines that overflow the dtype raise ValueError
    (`linear_bounds`; in `constraints` only the default lines must be finite, extra lines that
    overflow are replaced by them). `param_shape` is `(2,)` (lower line, upper line fractions)
    or `(1,)` (one fraction, used by whichever side is a tangent: boxes that never straddle)."""

    param_shape: tuple[int, ...] = (2,)
    checks_finite = False

    @property
    def label(self) -> str:
        """The name used in error messages."""
        return self.name

    def f(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def df(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        raise NotImplementedError

    def _adjust(
        self, lines: LinearBounds, lower: Tensor, upper: Tensor, for_lp: bool
    ) -> LinearBounds:
        return lines

    def _defaults(self, curve: SCurve, box: SBox) -> tuple[Tensor, ...]:
        """Default fractions, one per entry of `param_shape`'s last dimension."""
        p_low, p_up = curve.default_fractions(box)
        if self.param_shape == (1,):
            return (torch.where(box.low_tangent, p_low, p_up),)
        return p_low, p_up

    def forward(self, xh: Tensor) -> Tensor:
        return self.f(xh)

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        """`[*lower.shape, *param_shape]`: the default tangent fractions."""
        curve, box = self._curve(lower, upper)
        return torch.stack(self._defaults(curve, box), dim=-1)

    def project(self, params: Tensor) -> Tensor:
        """Fractions onto [0, 1]."""
        return params.clamp(0.0, 1.0)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Every box of positive width (only a point is relaxed exactly)."""
        return upper > lower

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, params: Tensor | None = None
    ) -> LinearBounds:
        """One lower and one upper line, valid on `[lower, upper]` for any `params`
        (`[..., *lower.shape, *param_shape]`, projected here); the result broadcasts against
        `params`. With `checks_finite`, a side whose chosen tangent overflows takes the default
        line instead, and ValueError is raised only where that overflows too."""
        curve, box = self._curve(lower, upper)
        defaults = self._defaults(curve, box)
        chosen = torch.stack(defaults, dim=-1) if params is None else self.project(params)
        lines = curve.lines(box, chosen[..., 0], chosen[..., -1])
        lines = self._adjust(lines, lower, upper, for_lp=False)
        if self.checks_finite and not _all_finite(lines):
            if params is not None:  # a tangent moved towards an overflow: the default there
                default = curve.lines(box, defaults[0], defaults[-1])
                lines = _or_default(lines, self._adjust(default, lower, upper, for_lp=False))
            require_finite_lines(self.label, lines, lower, upper)
        return lines

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints:
        """The default lines, lines at tangent fractions 0, 1/2, 1 on each side, and the
        interval's horizontals (so the set is inside the default lines)."""
        curve, box = self._curve(lower, upper)
        defaults = self._defaults(curve, box)
        default = self._adjust(curve.lines(box, defaults[0], defaults[-1]), lower, upper, True)
        if self.checks_finite:
            require_finite_lines(self.label, default, lower, upper)
        extra = [self._adjust(x, lower, upper, True) for x in curve.constraint_lines(box)]
        f_low, f_up = self.interval(lower, upper)
        (zero, h_low), (_, h_up) = horizontal(f_low, -1.0), horizontal(f_up, 1.0)
        extra.append(LinearBounds(zero, h_low, zero, h_up))
        lines = (default, *(_or_default(x, default) for x in extra))
        return stack_constraints(lines)


class MonotoneSRelaxation(SCurveRelaxation):
    """An increasing S-shaped `f` with inflection point 0 (sigmoid, tanh): subclasses set `name`
    and supply `f` and `df`. See the module docstring for the lines; `interval` is
    `[f(l), f(u)]` (exact: `f` is increasing). Boxes with an infinite (or astronomically large)
    end get the horizontal lines of the interval, which are valid and finite because `f` is
    bounded."""

    monotone = True

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        return self.f(lower), self.f(upper)

    @staticmethod
    def _huge(lower: Tensor, upper: Tensor) -> Tensor:
        big = torch.finfo(lower.dtype).max ** 0.5
        return ~((lower.abs() <= big) & (upper.abs() <= big))  # also NaN

    def _curve(self, lower: Tensor, upper: Tensor) -> tuple[SCurve, SBox]:
        """The S-box of the finite part (huge boxes replaced by [0, 0])."""
        huge, zero = self._huge(lower, upper), torch.zeros_like(lower)
        lo, up = torch.where(huge, zero, lower), torch.where(huge, zero, upper)
        curve = SCurve(self.f, self.df)
        return curve, curve.box(lo, up, zero)

    def _adjust(
        self, lines: LinearBounds, lower: Tensor, upper: Tensor, for_lp: bool
    ) -> LinearBounds:
        """`lines` with the interval's horizontal lines where the box is huge."""
        huge = self._huge(lower, upper)
        fl, fu = self.interval(lower, upper)
        (zl, bl), (zu, bu) = horizontal(fl, -1.0), horizontal(fu, 1.0)
        pick = lambda a, b: torch.where(huge, a, b)  # noqa: E731
        return full_lines(
            pick(zl, lines.lower_slope), pick(bl, lines.lower_intercept),
            pick(zu, lines.upper_slope), pick(bu, lines.upper_intercept),
        )  # fmt: skip
