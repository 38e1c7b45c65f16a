"""The CROWN relaxation of tanh (relaxations/tanh.py, relaxations/s_shaped.py): the protocol
harness, strict float64/float32 validity (zero slack, zoomed worst points), mpmath at 50 digits,
and CROWN's default lines."""

from __future__ import annotations

import mpmath
import pytest
import torch

import relaxations.tanh  # noqa: F401  (registers "tanh")
from relaxations import get_relaxation
from tests.relaxation_checks import check_all, check_methods_sound
from tests.relaxations.strict_smooth import (
    DTYPES,
    HARD_BOXES,
    assert_constraints_at_least_as_tight,
    assert_point_box_exact,
    assert_strictly_valid,
    assert_valid_mpmath,
    boxes,
    worst_gaps,
)

D = torch.float64
tanh = get_relaxation("tanh")


def test_protocol_checks():
    for scale in (0.5, 3.0, 20.0):
        check_all(tanh, *boxes(scale=scale))


@DTYPES
@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0], ids=["narrow", "medium", "wide"])
def test_lines_strictly_valid(dtype, scale):
    assert_strictly_valid(tanh, *boxes(dtype, scale, seed=1), torch.tanh)


@pytest.mark.parametrize("box", [(10.0, 20.0), (-1e4, 1e4), (-20.0, -10.0), (-400.0, 400.0)],
                         ids=["sat_hi", "huge", "sat_lo", "wide"])  # fmt: skip
@DTYPES
def test_saturated_boxes(box, dtype):
    lower, upper = (torch.tensor([v], dtype=dtype) for v in box)
    assert_strictly_valid(tanh, lower, upper, torch.tanh)


def test_lines_valid_in_mpmath():
    assert_valid_mpmath(tanh, *boxes(D, 3.0, seed=2), torch.tanh, mpmath.tanh)


def test_default_lines_touch_and_pass_through_the_far_end():
    lower = torch.tensor([-3.0, -1.0, -2.0, 0.25], dtype=D)
    upper = torch.tensor([2.0, 4.0, -0.5, 1.5], dtype=D)
    lines = tanh.linear_bounds(lower, upper)
    (gl, _), (gu, _) = worst_gaps(lines, lower, upper, torch.tanh)
    assert (gl.abs() < 1e-10).all() and (gu.abs() < 1e-10).all()
    at_l = lines.upper_slope[:2] * lower[:2] + lines.upper_intercept[:2]
    at_u = lines.lower_slope[:2] * upper[:2] + lines.lower_intercept[:2]
    torch.testing.assert_close(at_l, torch.tanh(lower[:2]), atol=1e-7, rtol=0)
    torch.testing.assert_close(at_u, torch.tanh(upper[:2]), atol=1e-7, rtol=0)


def test_odd_symmetry_of_the_default_lines():
    """tanh is odd and the relaxation mirrors: the lines of [-u, -l] are the mirrored lines."""
    lower = torch.tensor([-3.0, -1.0, 0.5, -2.0], dtype=D)
    upper = torch.tensor([2.0, 4.0, 1.5, -0.5], dtype=D)
    a, b = tanh.linear_bounds(lower, upper), tanh.linear_bounds(-upper, -lower)
    torch.testing.assert_close(a.upper_slope, b.lower_slope)
    torch.testing.assert_close(a.upper_intercept, -b.lower_intercept, atol=1e-8, rtol=0)


def test_interval_exact_and_point_box_exact():
    lower, upper = boxes(special=HARD_BOXES)
    low, up = tanh.interval(lower, upper)
    assert torch.equal(low, torch.tanh(lower)) and torch.equal(up, torch.tanh(upper))
    assert_point_box_exact(tanh, torch.tensor([-2.0, 0.0, 0.7, 30.0], dtype=D))


def test_constraints_at_least_as_tight_as_the_lines():
    assert_constraints_at_least_as_tight(tanh, *boxes(scale=2.0))


def test_methods_sound():
    check_methods_sound(tanh)
    check_methods_sound(tanh, methods=("lp",), seeds=(0,))
