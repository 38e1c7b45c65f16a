"""The CROWN relaxation of sigmoid (relaxations/sigmoid.py, relaxations/s_shaped.py).

Besides the protocol harness, the lines are checked strictly: computed in float64 or float32,
evaluated in float64 against the float64 function with zero slack at the worst point of each box
(found by a zoomed grid search, so tangent points are hit to ~1e-9 of the width), and at those
points against mpmath at 50 digits. The helpers here (`worst_gaps`, `assert_strictly_valid`,
`assert_valid_mpmath`) are shared by the other smooth relaxations' tests."""

from __future__ import annotations

import mpmath
import pytest
import torch

import relaxations.sigmoid  # noqa: F401  (registers "sigmoid")
from relaxations import get_relaxation
from relaxations.base import polygon_argmin
from tests.relaxation_checks import check_all, check_methods_sound, random_boxes

D = torch.float64
F = torch.float32
DTYPES = pytest.mark.parametrize("dtype", [D, F], ids=["float64", "float32"])
sigmoid = get_relaxation("sigmoid")

# Saturation, huge, inflection-point and tiny boxes (the brief's precision cases first).
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


def sigmoid_mp(x):
    return 1 / (1 + mpmath.exp(-x))


def test_protocol_checks():
    for scale in (0.5, 3.0, 20.0):
        check_all(sigmoid, *boxes(scale=scale))


@DTYPES
@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0], ids=["narrow", "medium", "wide"])
def test_lines_strictly_valid(dtype, scale):
    assert_strictly_valid(sigmoid, *boxes(dtype, scale), torch.sigmoid)


@pytest.mark.parametrize("box", HARD_BOXES[:3], ids=["sat_hi", "huge", "sat_lo"])
@DTYPES
def test_saturated_boxes(box, dtype):
    lower, upper = (torch.tensor([v], dtype=dtype) for v in box)
    assert_strictly_valid(sigmoid, lower, upper, torch.sigmoid)
    lines = sigmoid.linear_bounds(lower, upper)
    for t in (lines.lower_slope, lines.lower_intercept, lines.upper_slope, lines.upper_intercept):
        assert torch.isfinite(t).all()


def test_lines_valid_in_mpmath():
    assert_valid_mpmath(sigmoid, *boxes(D, 3.0), torch.sigmoid, sigmoid_mp)


def test_default_lines_are_crowns():
    """Straddling: the default upper line is the tangent through (l, f(l)) (CROWN), the lower
    one the tangent through (u, f(u)); one-curvature boxes: the tangent at the midpoint."""
    lower = torch.tensor([-4.0, -1.0, -6.0, 0.5], dtype=D)
    upper = torch.tensor([3.0, 5.0, -1.0, 4.0], dtype=D)
    lines = sigmoid.linear_bounds(lower, upper)
    (gl, _), (gu, _) = worst_gaps(lines, lower, upper, torch.sigmoid)
    assert (gl.abs() < 1e-10).all() and (gu.abs() < 1e-10).all()  # both touch f
    f = torch.sigmoid
    at_l = lines.upper_slope[:2] * lower[:2] + lines.upper_intercept[:2]
    at_u = lines.lower_slope[:2] * upper[:2] + lines.lower_intercept[:2]
    torch.testing.assert_close(at_l, f(lower[:2]), atol=1e-7, rtol=0)
    torch.testing.assert_close(at_u, f(upper[:2]), atol=1e-7, rtol=0)
    mid = (lower + upper) / 2
    torch.testing.assert_close(lines.lower_slope[2], sigmoid.df(mid[2]))  # convex: lower
    torch.testing.assert_close(lines.upper_slope[3], sigmoid.df(mid[3]))  # concave: upper


def test_straddling_chord_case():
    """When the tangent at u passes below (l, f(l)), the upper line is the chord."""
    lower, upper = torch.tensor([-3.0], dtype=D), torch.tensor([0.5], dtype=D)
    lines = sigmoid.linear_bounds(lower, upper)
    f = torch.sigmoid
    chord = (f(upper) - f(lower)) / (upper - lower)
    torch.testing.assert_close(lines.upper_slope, chord)
    torch.testing.assert_close(lines.upper_slope * lower + lines.upper_intercept, f(lower))


def test_params_move_the_tangent_points():
    """Fraction 0 and 1 of a convex-only box's lower line are the tangents at l and u."""
    lower, upper = torch.tensor([-5.0], dtype=D), torch.tensor([-1.0], dtype=D)
    for t, point in ((0.0, lower), (1.0, upper)):
        params = torch.tensor([[t, 0.5]], dtype=D)
        lines = sigmoid.linear_bounds(lower, upper, params)
        torch.testing.assert_close(lines.lower_slope, sigmoid.df(point))


def test_point_box_is_exact():
    assert_point_box_exact(sigmoid, torch.tensor([-3.0, 0.0, 2.5, 17.0, -40.0], dtype=D))


def test_interval_is_exact():
    lower, upper = boxes()
    low, up = sigmoid.interval(lower, upper)
    assert torch.equal(low, torch.sigmoid(lower)) and torch.equal(up, torch.sigmoid(upper))


def test_infinite_bounds_give_the_horizontal_lines():
    lower = torch.tensor([-torch.inf, -1.0, -torch.inf], dtype=D)
    upper = torch.tensor([torch.inf, torch.inf, 2.0], dtype=D)
    lines = sigmoid.linear_bounds(lower, upper)
    for t in (lines.lower_slope, lines.lower_intercept, lines.upper_slope, lines.upper_intercept):
        assert torch.isfinite(t).all()
    assert (lines.lower_slope == 0).all() and (lines.upper_slope == 0).all()
    assert (lines.lower_intercept <= torch.sigmoid(lower)).all()
    assert (lines.upper_intercept >= torch.sigmoid(upper)).all()


def test_params_broadcast_and_carry_gradients():
    lower, upper = boxes(scale=2.0)
    params = sigmoid.default_params(lower, upper).expand(3, -1, -1).clone().requires_grad_(True)
    lines = sigmoid.linear_bounds(lower, upper, params)
    assert lines.lower_slope.shape == (3, lower.numel())
    (lines.lower_intercept.sum() - lines.upper_intercept.sum()).backward()
    assert torch.isfinite(params.grad).all() and params.grad.abs().sum() > 0


def assert_constraints_at_least_as_tight(relaxation, lower, upper) -> None:
    """The LP's set lies between the default lines (they are among its lines)."""
    cons = relaxation.constraints(lower, upper)
    lines = relaxation.linear_bounds(lower, upper)
    t = torch.linspace(0, 1, 33, dtype=D).unsqueeze(1)
    xh = (lower + t * (upper - lower)).to(lower.dtype)
    low = lines.lower_slope * xh + lines.lower_intercept
    up = lines.upper_slope * xh + lines.upper_intercept
    assert (cons.lower_envelope(xh) >= low).all() and (cons.upper_envelope(xh) <= up).all()


def test_constraints_tighter_than_default_lines_and_argmin_matches_polygon():
    lower, upper = boxes(scale=2.0)
    cons = sigmoid.constraints(lower, upper)
    assert cons.lower_slopes.shape[0] == cons.upper_slopes.shape[0] == 5
    assert_constraints_at_least_as_tight(sigmoid, lower, upper)
    gen = torch.Generator().manual_seed(4)
    cp, cq = torch.randn(2, lower.numel(), generator=gen, dtype=D)
    xh, x = sigmoid.argmin(cp, cq, lower, upper)
    pxh, px = polygon_argmin(cons, cp, cq, lower, upper)
    torch.testing.assert_close(cp * xh + cq * x, cp * pxh + cq * px)


def test_options_are_rejected():
    with pytest.raises(ValueError, match="sigmoid"):
        get_relaxation("sigmoid", exponent=2)


def test_methods_sound():
    check_methods_sound(sigmoid)
    check_methods_sound(sigmoid, methods=("lp",), seeds=(0,))
    check_methods_sound(
        sigmoid, methods=("crown", "alpha-crown"), seeds=(1,), scale=6.0, radius=3.0
    )
