"""The relaxations of sin and cos (relaxations/trig.py): exact convex/concave pieces, the
S-shape around one inflection point, curvature-bounded lines on wide boxes, the exact interval;
strict float64/float32 validity (large arguments, boxes at multiples of pi/2), mpmath."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

import relaxations.trig  # noqa: F401  (registers "sin" and "cos")
from relaxations import get_relaxation
from tests.relaxation_checks import check_all, check_methods_sound, grid
from tests.relaxations.strict_smooth import (
    DTYPES,
    assert_constraints_at_least_as_tight,
    assert_point_box_exact,
    assert_strictly_valid,
    assert_valid_mpmath,
    boxes,
    worst_gaps,
)

D = torch.float64
PI = math.pi
FUNCTIONS = {"sin": (torch.sin, mpmath.sin), "cos": (torch.cos, mpmath.cos)}
BOTH = pytest.mark.parametrize("name", ["sin", "cos"])
SPECIAL = (
    (0.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (-5.0, -5.0 + 1e-7), (-1e-7, 1e-7), (-40.0, 40.0),
    (1e4, 1e4 + 1.0), (1e4, 1e4 + 3.0), (-0.3, 8.0), (PI, PI), (PI / 2, PI / 2), (0.0, PI),
    (-PI, 0.0), (PI / 2, 3 * PI / 2), (-PI / 2, PI / 2), (PI - 1e-9, PI + 1e-9), (-1.0, 1.0),
    (2.9, 3.5), (1e-7, 1e-7), (3.0, 3.0 + 1e-9), (-100 * PI - 0.5, -100 * PI + 0.5),
    (1e6 * PI, 1e6 * PI + 1.0), (-PI / 2 - 0.1, PI / 2 + 0.1), (-1e4, 1e4),
)  # fmt: skip


@BOTH
def test_protocol_checks(name):
    for scale in (0.5, 3.0, 20.0):
        check_all(get_relaxation(name), *boxes(scale=scale, special=SPECIAL))


@BOTH
@DTYPES
@pytest.mark.parametrize("scale", [0.5, 3.0, 1e3], ids=["narrow", "medium", "large"])
def test_lines_strictly_valid(name, dtype, scale):
    relaxation, (f64, _) = get_relaxation(name), FUNCTIONS[name]
    assert_strictly_valid(relaxation, *boxes(dtype, scale, seed=5, special=SPECIAL), f64)


@BOTH
def test_lines_valid_in_mpmath(name):
    relaxation, (f64, f_mp) = get_relaxation(name), FUNCTIONS[name]
    assert_valid_mpmath(relaxation, *boxes(D, 3.0, seed=6, special=SPECIAL), f64, f_mp)


@BOTH
def test_interval_is_exact(name):
    """The interval contains a dense grid's range and exceeds it by no more than the grid's
    resolution error; ends are exact where no extremum lies inside."""
    relaxation, (f64, _) = get_relaxation(name), FUNCTIONS[name]
    lower, upper = boxes(scale=3.0, special=SPECIAL[:-1])
    low, up = relaxation.interval(lower, upper)
    y = f64(grid(lower, upper, 4001))
    step = (upper - lower) / 4000
    assert (low <= y.min(0).values).all() and (up >= y.max(0).values).all()
    assert (low >= y.min(0).values - step**2 - 1e-15).all()
    assert (up <= y.max(0).values + step**2 + 1e-15).all()


def test_interval_examples():
    sin, cos = get_relaxation("sin"), get_relaxation("cos")
    lower = torch.tensor([1.0, 2.0, -4.0, 0.0, 10.0], dtype=D)
    upper = torch.tensor([2.0, 3.0, -1.0, 7.0, 10.0], dtype=D)
    low, up = sin.interval(lower, upper)
    s, s_up = torch.sin(lower).tolist(), torch.sin(upper).tolist()  # the function's own values
    assert low.tolist() == [s[0], s_up[1], -1.0, -1.0, s[4]]
    assert up.tolist() == [1.0, s[1], s[2], 1.0, s[4]]
    lower, upper = torch.tensor([-1.0, 3.0], dtype=D), torch.tensor([1.0, 3.5], dtype=D)
    low, up = cos.interval(lower, upper)
    assert low.tolist() == [float(torch.cos(upper[0])), -1.0]
    assert up.tolist() == [1.0, float(torch.cos(upper[1]))]


def test_s_shape_around_one_inflection_point():
    """sin on [-1, 2] (inflection 0: convex then concave) and on [2, 4] (inflection pi:
    concave then convex): CROWN's tangents through the far ends touch the curve."""
    sin = get_relaxation("sin")
    lower, upper = torch.tensor([-1.0, 2.0], dtype=D), torch.tensor([2.0, 4.0], dtype=D)
    lines = sin.linear_bounds(lower, upper)
    (gl, _), (gu, _) = worst_gaps(lines, lower, upper, torch.sin)
    assert (gl.abs() < 1e-10).all() and (gu.abs() < 1e-10).all()
    value = lambda slope, icpt, x: float(slope * x + icpt - torch.sin(x))  # noqa: E731
    # [-1, 2]: the upper tangent passes through (l, sin l), the lower one through (u, sin u).
    assert abs(value(lines.upper_slope[0], lines.upper_intercept[0], lower[0])) < 1e-9
    assert abs(value(lines.lower_slope[0], lines.lower_intercept[0], upper[0])) < 1e-9
    # [2, 4], mirrored: the lower tangent (convex side) passes through (l, sin l), the upper
    # one (concave side) through (u, sin u).
    assert abs(value(lines.lower_slope[1], lines.lower_intercept[1], lower[1])) < 1e-9
    assert abs(value(lines.upper_slope[1], lines.upper_intercept[1], upper[1])) < 1e-9


def test_concave_box_gives_chord_and_tangent():
    """cos on [-1, 1] is concave: the lower line is the chord (y = cos 1), the upper one the
    tangent at the midpoint (y = 1)."""
    cos = get_relaxation("cos")
    lines = cos.linear_bounds(torch.tensor([-1.0], dtype=D), torch.tensor([1.0], dtype=D))
    torch.testing.assert_close(lines.lower_slope, torch.zeros(1, dtype=D), atol=1e-15, rtol=0)
    torch.testing.assert_close(lines.lower_intercept, torch.tensor([math.cos(1.0)], dtype=D))
    torch.testing.assert_close(lines.upper_slope, torch.zeros(1, dtype=D), atol=1e-15, rtol=0)
    torch.testing.assert_close(lines.upper_intercept, torch.ones(1, dtype=D))


@BOTH
def test_wide_boxes_take_the_tighter_of_shifted_chord_and_horizontal(name):
    relaxation = get_relaxation(name)
    lower, upper = boxes(scale=6.0, seed=7)
    k = torch.floor((upper - relaxation.inflection_phase) / PI) - torch.ceil(
        (lower - relaxation.inflection_phase) / PI
    )
    wide = k >= 1  # at least two inflection points
    lower, upper = lower[wide], upper[wide]
    lines = relaxation.linear_bounds(lower, upper)
    low, up = relaxation.interval(lower, upper)
    mid = (lower + upper) / 2
    assert (lines.lower_slope * mid + lines.lower_intercept >= low - 1e-12).all()
    assert (lines.upper_slope * mid + lines.upper_intercept <= up + 1e-12).all()
    cons = relaxation.constraints(lower, upper)
    assert (cons.lower_slopes != 0).any(dim=0).any()  # the shifted chords are kept for the LP


@BOTH
def test_huge_and_infinite_boxes_get_the_unit_interval(name):
    relaxation = get_relaxation(name)
    lower = torch.tensor([-torch.inf, 1e13, -1.0], dtype=D)
    upper = torch.tensor([torch.inf, 1e13 + 1, torch.inf], dtype=D)
    low, up = relaxation.interval(lower, upper)
    assert low.tolist() == [-1.0] * 3 and up.tolist() == [1.0] * 3
    lines = relaxation.linear_bounds(lower, upper)
    assert (lines.lower_slope == 0).all() and (lines.upper_slope == 0).all()
    assert (lines.lower_intercept <= -1).all() and (lines.upper_intercept >= 1).all()


@BOTH
def test_point_box_and_constraints(name):
    relaxation = get_relaxation(name)
    assert_point_box_exact(relaxation, torch.tensor([-2.0, 0.0, PI / 2, 1.5, 100.0], dtype=D))
    assert_constraints_at_least_as_tight(relaxation, *boxes(scale=3.0, special=SPECIAL))


@BOTH
def test_methods_sound(name):
    relaxation = get_relaxation(name)
    check_methods_sound(relaxation, scale=1.0, radius=0.3)  # mostly one-inflection boxes
    check_methods_sound(relaxation, methods=("crown", "alpha-crown"), seeds=(1,))
    check_methods_sound(relaxation, methods=("lp",), seeds=(0,), scale=1.0, radius=0.3)
