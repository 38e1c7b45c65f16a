"""The CROWN relaxation of sigmoid (relaxations/sigmoid.py, relaxations/s_shaped.py).

Besides the protocol harness, the lines are checked strictly: computed in float64 or float32,
evaluated in float64 against the float64 function with zero slack at the worst point of each box
(found by a zoomed grid search, so tangent points are hit to ~1e-9 of the width), and at those
points against mpmath at 50 digits (the helpers, shared by the other smooth relaxations' tests,
are in `tests/relaxations/strict_smooth.py`)."""

from __future__ import annotations

import mpmath
import pytest
import torch

import relaxations.sigmoid  # noqa: F401  (registers "sigmoid")
from relaxations import get_relaxation
from relaxations.base import polygon_argmin
from tests.relaxation_checks import check_all, check_methods_sound
from tests.relaxations.strict_smooth import (
    DTYPES,
    HARD_BOXES,
    D,
    assert_constraints_at_least_as_tight,
    assert_point_box_exact,
    assert_strictly_valid,
    assert_valid_mpmath,
    boxes,
    worst_gaps,
)

sigmoid = get_relaxation("sigmoid")

# Saturation, huge, inflection-point and tiny boxes (the brief's precision cases first).


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
