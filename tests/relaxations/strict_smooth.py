"""Strict validity checks of the smooth relaxations (sigmoid, tanh, exp, reciprocal, sin, cos,
powers): lines compared in float64 at each box's worst point (zoomed grid search) and again in
mpmath, shared by their test files."""

from __future__ import annotations

import mpmath
import pytest
import torch

import relaxations.sigmoid  # noqa: F401  (registers "sigmoid")
from tests.relaxation_checks import random_boxes

D = torch.float64


F = torch.float32


DTYPES = pytest.mark.parametrize("dtype", [D, F], ids=["float64", "float32"])


HARD_BOXES = (
    (20.0, 30.0), (-1e4, 1e4), (-30.0, -20.0), (0.0, 0.0), (-1.0, 0.0), (0.0, 1.0),
    (-5.0, -5.0 + 1e-7), (-1e-7, 1e-7), (-40.0, 40.0), (35.0, 1e4), (-1e4, -35.0), (-1e4, 2.0),
    (-2.0, 1e4), (-0.3, 8.0), (-8.0, 0.3), (700.0, 800.0), (-800.0, -700.0), (-3.0, 0.5),
    (-0.5, 3.0), (1e-7, 1e-7), (-1e-300, 1e-300),
)  # fmt: skip


def boxes(dtype=D, scale: float = 3.0, seed: int = 0, special=HARD_BOXES):
    lower, upper = random_boxes(n=300, seed=seed, scale=scale, special=special)
    return lower.to(dtype), upper.to(dtype)


def param_sets(relaxation, lower, upper, seeds=(1, 2, 3)):
    """None (the default), the projected extremes, and random (partly infeasible) params."""
    default = relaxation.default_params(lower, upper)
    out = [None, torch.zeros_like(default), torch.ones_like(default)]
    for s in seeds:
        gen = torch.Generator().manual_seed(s)
        out.append(torch.rand(default.shape, generator=gen, dtype=D).to(lower.dtype) * 1.6 - 0.3)
    return out


def worst_gaps(lines, lower, upper, f64, k: int = 129, rounds: int = 5):
    """Per box, `(max (lower line - f), argmax)` and `(max (f - upper line), argmax)` over the
    box, by a grid search zoomed `rounds` times around the worst point; all in float64 (the
    lines' coefficients are cast exactly)."""
    fields = (lines.lower_slope, lines.lower_intercept, lines.upper_slope, lines.upper_intercept)
    a_l, b_l, a_u, b_u = torch.broadcast_tensors(*(t.to(D) for t in fields))
    lo, up = lower.to(D).expand_as(a_l), upper.to(D).expand_as(a_l)
    t = torch.linspace(0, 1, k, dtype=D).reshape(-1, *([1] * a_l.dim()))
    out = []
    for a, b, sign in ((a_l, b_l, 1.0), (a_u, b_u, -1.0)):
        s, e = lo, up
        worst, where = torch.full_like(a, -torch.inf), lo
        for _ in range(rounds):
            x = (s + t * (e - s)).clamp(lo, up)
            gap, i = (sign * (a * x + b - f64(x))).max(0)
            xi = x.gather(0, i.unsqueeze(0))[0]
            better = gap > worst
            worst, where = torch.where(better, gap, worst), torch.where(better, xi, where)
            step = (e - s) / (k - 1)
            s, e = torch.maximum(xi - 2 * step, lo), torch.minimum(xi + 2 * step, up)
        out.append((worst, where))
    return out


def assert_strictly_valid(relaxation, lower, upper, f64, params=None) -> None:
    """Lines for each of `params` (default: `param_sets`) never cross the float64 function on
    the box, with zero slack."""
    for p in param_sets(relaxation, lower, upper) if params is None else params:
        lines = relaxation.linear_bounds(lower, upper, p)
        (gl, _), (gu, _) = worst_gaps(lines, lower, upper, f64)
        bad = (gl > 0) | (gu > 0)
        assert not bad.any(), (
            f"{relaxation.name}: lines cross f at boxes "
            f"{[(float(lower[i]), float(upper[i])) for i in bad.nonzero().flatten()[:4]]}"
        )


def assert_valid_mpmath(relaxation, lower, upper, f64, f_mp, limit: int = 60) -> None:
    """At each box's worst point (and both ends), the exact value of each line (its float
    coefficients taken exactly) is on the right side of `f_mp` at 50 digits."""
    mpmath.mp.dps = 50
    lines = relaxation.linear_bounds(lower, upper)
    (_, wl), (_, wu) = worst_gaps(lines, lower, upper, f64)
    order = torch.randperm(lower.numel(), generator=torch.Generator().manual_seed(0))
    for i in order[:limit].tolist():
        points = {float(lower[i]), float(upper[i]), float(wl[i]), float(wu[i])}
        for x in points:
            fx, xm = f_mp(mpmath.mpf(x)), mpmath.mpf(x)
            low = mpmath.mpf(float(lines.lower_slope[i])) * xm + float(lines.lower_intercept[i])
            up = mpmath.mpf(float(lines.upper_slope[i])) * xm + float(lines.upper_intercept[i])
            assert low <= fx <= up, (relaxation.name, float(lower[i]), float(upper[i]), x)


def assert_point_box_exact(relaxation, x) -> None:
    """At `l = u` both lines are the same line through `(x, f(x))`, up to the rounding margin
    (a few ulps of the line's terms), and the box needs no refinement."""
    lines = relaxation.linear_bounds(x, x)
    torch.testing.assert_close(lines.lower_slope, lines.upper_slope)
    scale = 1 + lines.upper_intercept.abs() + (lines.upper_slope * x).abs()
    gap = lines.upper_intercept - lines.lower_intercept
    assert (gap >= 0).all() and (gap <= 64 * torch.finfo(x.dtype).eps * scale).all()
    at_x = lines.lower_slope * x + lines.lower_intercept
    assert ((at_x - relaxation.forward(x)).abs() <= 64 * torch.finfo(x.dtype).eps * scale).all()
    assert not relaxation.needs_refinement(x, x).any()


def assert_constraints_at_least_as_tight(relaxation, lower, upper) -> None:
    """The LP's set lies between the default lines (they are among its lines)."""
    cons = relaxation.constraints(lower, upper)
    lines = relaxation.linear_bounds(lower, upper)
    t = torch.linspace(0, 1, 33, dtype=D).unsqueeze(1)
    xh = (lower + t * (upper - lower)).to(lower.dtype)
    low = lines.lower_slope * xh + lines.lower_intercept
    up = lines.upper_slope * xh + lines.upper_intercept
    assert (cons.lower_envelope(xh) >= low).all() and (cons.upper_envelope(xh) <= up).all()
