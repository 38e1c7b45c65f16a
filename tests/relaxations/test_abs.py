"""abs (relaxations/abs.py): LeakyReLU with slope -1; the protocol harness, strict validity,
the triangle's lines, and the methods."""

from __future__ import annotations

import pytest
import torch

import relaxations.abs  # noqa: F401  (registers "abs")
from relaxations import get_relaxation
from tests.bad_inputs.conftest import raises_where
from tests.relaxation_checks import check_all, check_methods_sound
from tests.relaxations.strict_piecewise import (
    DTYPES,
    assert_argmin_is_polygon_argmin,
    assert_constraints_are_the_hull,
    assert_exactly_valid,
    assert_lp_milp_sound,
    boxes,
    kink_critical,
    param_sets,
)

D = torch.float64
absolute = get_relaxation("abs")


@pytest.mark.parametrize("scale", [3.0, 1e-3, 1e3])
def test_protocol_checks(scale):
    check_all(absolute, *boxes(scale=scale))


@DTYPES
def test_lines_exactly_valid(dtype):
    assert_exactly_valid(absolute, *boxes(dtype), kink_critical(-1.0))


def test_forward_and_traits():
    x = torch.linspace(-3, 3, 61, dtype=D)
    assert absolute.forward(x).equal(torch.abs(x))
    assert absolute.convex and not absolute.monotone and absolute.split_at_zero
    assert [(p.slope, p.intercept) for p in absolute.pieces] == [(-1.0, 0.0), (1.0, 0.0)]


def test_ambiguous_lines():
    """Chord `(u + l) / (u - l) xh + 2 u (-l) / (u - l)` above (up to its pad), `(2 t - 1) xh`
    below; the default takes slope 1 where `u > -l`, else -1."""
    lower = torch.tensor([-1.0, -3.0, -2.0], dtype=D)
    upper = torch.tensor([3.0, 1.0, 2.0], dtype=D)
    t = torch.tensor([0.0, 0.25, 1.0], dtype=D)
    lb = absolute.linear_bounds(lower, upper, t)
    torch.testing.assert_close(lb.lower_slope, 2 * t - 1)
    assert (lb.lower_intercept == 0).all()
    torch.testing.assert_close(lb.upper_slope, (upper + lower) / (upper - lower))
    torch.testing.assert_close(lb.upper_intercept, 2 * upper * -lower / (upper - lower))
    assert (lb.upper_intercept >= 2 * upper * -lower / (upper - lower)).all()
    default = absolute.linear_bounds(lower, upper)
    assert default.lower_slope.tolist() == [1.0, -1.0, -1.0]


def test_stable_boxes_are_exact():
    lower = torch.tensor([0.0, 0.5, -2.0, -1.0, 0.0], dtype=D)
    upper = torch.tensor([2.0, 0.5, -0.5, 0.0, 0.0], dtype=D)
    assert not absolute.needs_refinement(lower, upper).any()
    for params in param_sets(absolute, lower, upper):
        lb = absolute.linear_bounds(lower, upper, params)
        assert lb.lower_slope.equal(lb.upper_slope)
        assert lb.lower_slope.tolist() == [1.0, 1.0, -1.0, -1.0, 1.0]
        assert (lb.lower_intercept == 0).all() and (lb.upper_intercept == 0).all()


def test_interval_is_exact():
    lower = torch.tensor([-1.0, -3.0, 1.0, -4.0], dtype=D)
    upper = torch.tensor([3.0, 1.0, 2.0, -2.0], dtype=D)
    low, up = absolute.interval(lower, upper)
    assert low.tolist() == [0.0, 0.0, 1.0, 2.0] and up.tolist() == [3.0, 3.0, 2.0, 4.0]


def test_constraints_are_the_triangle():
    lower, upper = boxes()
    assert_constraints_are_the_hull(absolute, lower, upper, kink_critical(-1.0))
    assert_argmin_is_polygon_argmin(absolute, lower, upper)


def test_methods_sound():
    check_methods_sound(absolute)
    assert_lp_milp_sound(absolute)


def test_options_are_refused():
    with raises_where(ValueError, "abs", "negative_slope"):
        get_relaxation("abs", negative_slope=0.5)
