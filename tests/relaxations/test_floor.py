"""floor (relaxations/floor.py): the protocol harness, strict validity at the ends and both
sides of the first and last jumps, the hull of the staircase, the default lines, the methods."""

from __future__ import annotations

import pytest
import torch

import relaxations.floor  # noqa: F401  (registers "floor")
from relaxations import get_relaxation
from tests.bad_inputs.conftest import raises_where
from tests.relaxation_checks import check_all, check_methods_sound
from tests.relaxations.strict_piecewise import (
    DTYPES,
    assert_constraints_are_the_hull,
    assert_exactly_valid,
    assert_lp_milp_sound,
    boxes,
)

D = torch.float64
floor = get_relaxation("floor")
STEP_BOXES = (
    (0.0, 0.0), (-1.0, 1.0), (-2.0, 0.0), (0.0, 2.0), (-1e-7, 1e-7), (0.0, 1e-7), (-1e-7, 0.0),
    (-1e4, 1e4), (0.5, 0.7), (0.9, 1.1), (0.9, 2.0), (1.0, 2.0), (1.0, 2.5), (0.5, 3.0),
    (2.0, 2.0), (2.0 - 1e-9, 2.0), (2.0, 2.0 + 1e-9), (-3.5, -0.5), (0.999, 1.001), (7.0, 7.9),
    (-1e-300, 1e-300), (1e3 - 0.5, 1e3 + 0.25),
    (-1e-40, 2e-40), (-5e-324, 1e-323), (-3e-39, 1e-45),
)  # fmt: skip


def floor_critical(lower, upper):
    """The ends, and both values at the first and last integers `A = floor(l) + 1 <= B =
    floor(u)` of the box: between them `line - floor` is linear in the integer, and linear on
    each step (so its extremes are among these)."""
    fl, fu = torch.floor(lower), torch.floor(upper)
    cross = fl < fu
    first, last = torch.where(cross, fl + 1, lower), torch.where(cross, fu, lower)
    xs = torch.stack([lower, upper, first, first, last, last])
    at = [torch.where(cross, v, fl) for v in (first - 1, first, last - 1, last)]
    b = torch.stack([fl, fu, *at])
    return xs, torch.zeros_like(xs), b


@pytest.mark.parametrize("scale", [3.0, 0.7, 20.0, 1e-3])
def test_protocol_checks(scale):
    check_all(floor, *boxes(special=STEP_BOXES, scale=scale))


@DTYPES
@pytest.mark.parametrize("scale", [3.0, 0.7, 1e3])
def test_lines_exactly_valid(dtype, scale):
    lower, upper = boxes(dtype, special=STEP_BOXES, scale=scale)
    assert_exactly_valid(floor, lower, upper, floor_critical)


def test_one_step_is_exact():
    lower = torch.tensor([0.0, 0.5, -3.0, 7.25, 2.0], dtype=D)
    upper = torch.tensor([0.9, 0.5, -2.5, 7.99, 2.0], dtype=D)
    assert not floor.needs_refinement(lower, upper).any()
    lb = floor.linear_bounds(lower, upper, torch.rand(5, 2, dtype=D))
    for t in (lb.lower_slope, lb.upper_slope):
        assert (t == 0).all()
    assert lb.lower_intercept.equal(torch.floor(lower)) and lb.upper_intercept.equal(
        torch.floor(lower)
    )


def test_default_lines_on_wide_boxes_are_x_minus_one_and_x():
    """Several integers in the box: the default lines are `x - 1` below and `x` above (the
    classic bounds, through the hull's vertices), up to the pad."""
    lower = torch.tensor([0.5, -3.2, 10.0], dtype=D)
    upper = torch.tensor([3.5, 4.7, 15.0], dtype=D)
    lb = floor.linear_bounds(lower, upper)
    torch.testing.assert_close(lb.lower_slope, torch.ones(3, dtype=D))
    torch.testing.assert_close(lb.upper_slope, torch.ones(3, dtype=D))
    torch.testing.assert_close(lb.lower_intercept, -torch.ones(3, dtype=D))
    torch.testing.assert_close(lb.upper_intercept, torch.zeros(3, dtype=D), atol=1e-12, rtol=0)


def test_slope_ranges_are_the_hull_sides():
    """On [0.5, 2.25]: the lower side's slopes run 0 -> 1 -> 4 (to (2.25, 2) from (2, 1)), the
    upper's 2 (from (0.5, 0) to (1, 1)) -> 1 -> 0; `t = 0` and `t = 1` are the end slopes."""
    lower, upper = torch.tensor([0.5], dtype=D), torch.tensor([2.25], dtype=D)
    ones, zeros = torch.ones(1, 2, dtype=D), torch.zeros(1, 2, dtype=D)
    top, bottom = floor.linear_bounds(lower, upper, ones), floor.linear_bounds(lower, upper, zeros)
    assert top.lower_slope.item() == pytest.approx(4.0) and top.upper_slope.item() == pytest.approx(
        2.0
    )
    assert bottom.lower_slope.item() == 0.0 and bottom.upper_slope.item() == 0.0
    # the steep lower line passes through (2, 1), the steep upper one through (1, 1)
    assert 4.0 * 2 + top.lower_intercept.item() == pytest.approx(1.0)
    assert 2.0 * 1 + top.upper_intercept.item() == pytest.approx(1.0)
    assert bottom.lower_intercept.item() == pytest.approx(0.0)
    assert bottom.upper_intercept.item() == pytest.approx(2.0)


def test_slopes_are_not_capped_at_large_magnitudes_in_float32():
    """[9999.5, 10000.5] in float32: the steep sides keep their slope 2 (the cap on slopes is
    for widths near the rounding of the magnitudes, not for half a unit)."""
    lower = torch.tensor([9999.5], dtype=torch.float32)
    upper = torch.tensor([10000.5], dtype=torch.float32)
    lb = floor.linear_bounds(lower, upper, torch.ones(1, 2))
    assert lb.lower_slope.item() == 2.0 and lb.upper_slope.item() == 2.0


def test_constraints_are_the_hull():
    """Away from boxes so narrow (or so close to an integer) that the slopes are capped."""
    lower, upper = boxes(special=STEP_BOXES)
    frac = torch.minimum(upper - torch.floor(upper), torch.ceil(lower) - lower)
    keep = (upper - lower > 1e-5) & ((frac > 1e-5) | (frac == 0))
    assert_constraints_are_the_hull(floor, lower[keep], upper[keep], floor_critical)


def test_interval_and_traits():
    lower = torch.tensor([-0.5, 1.0, 2.5], dtype=D)
    upper = torch.tensor([0.5, 1.0, 4.0], dtype=D)
    low, up = floor.interval(lower, upper)
    assert low.tolist() == [-1.0, 1.0, 2.0] and up.tolist() == [0.0, 1.0, 4.0]
    assert floor.pieces is None and floor.monotone and not floor.split_at_zero
    assert floor.forward(torch.tensor([-0.5, 0.0, 1.99], dtype=D)).tolist() == [-1.0, 0.0, 1.0]


def test_methods_sound():
    check_methods_sound(floor, scale=3.0)
    assert_lp_milp_sound(floor, scale=3.0)


def test_options_are_refused():
    with raises_where(ValueError, "floor", "step"):
        get_relaxation("floor", step=2.0)
