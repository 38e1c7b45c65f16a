"""Relaxations of `x^n` (relaxations/power.py): even exponents convex (chord above, tangent
below), odd ones the S-shape of `-x^n`; `square` = exponent 2; strict float64/float32 validity,
mpmath, CROWN's lines worked out by hand, exponent validation and overflow errors."""

from __future__ import annotations

import pytest
import torch

import relaxations.power  # noqa: F401  (registers "pow" and "square")
from relaxations import get_relaxation
from tests.relaxation_checks import check_all, check_methods_sound
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
EXPONENTS = pytest.mark.parametrize("n", [2, 3, 4, 5, 7], ids=lambda n: f"n{n}")
# Moderate boxes for the harness (its sampled points lose precision past ~1e20 magnitudes).
MODERATE = (
    (0.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (-5.0, -5.0 + 1e-7), (-1e-7, 1e-7), (-40.0, 40.0),
    (-0.3, 8.0), (-8.0, 0.3), (-3.0, 0.5), (-1.0, 3.0), (1e-7, 1e-7), (-1e-300, 1e-300),
    (3.0, 3.0 + 1e-9),
)  # fmt: skip
LARGE = ((-1e4, 1e4), (-1e4, 2.0), (-2.0, 1e4), (1e3, 1e4), (-1e4, -1e3))


def power(n):
    return get_relaxation("pow", exponent=n)


@EXPONENTS
def test_protocol_checks(n):
    for scale in (0.5, 3.0, 10.0):
        check_all(power(n), *boxes(scale=scale, special=MODERATE))


@EXPONENTS
@DTYPES
def test_lines_strictly_valid(n, dtype):
    for scale in (0.5, 5.0):
        lower, upper = boxes(dtype, scale, seed=n, special=MODERATE + LARGE)
        assert_strictly_valid(power(n), lower, upper, lambda x: torch.pow(x, n))


@EXPONENTS
def test_lines_valid_in_mpmath(n):
    lower, upper = boxes(D, 3.0, seed=n, special=MODERATE + LARGE)
    assert_valid_mpmath(power(n), lower, upper, lambda x: torch.pow(x, n), lambda x: x**n)


def test_odd_straddling_lines_are_crowns():
    """x^3 on [-1, 3]: the lower line is the tangent at 1/2 through (-1, -1) (roots of
    (d + 1)^2 (2d - 1)), the upper one the chord (the tangent through (3, 27) touches at
    -3/2 < l)."""
    lines = power(3).linear_bounds(torch.tensor([-1.0], dtype=D), torch.tensor([3.0], dtype=D))
    torch.testing.assert_close(lines.lower_slope, torch.tensor([0.75], dtype=D))
    torch.testing.assert_close(lines.lower_intercept, torch.tensor([-0.25], dtype=D))
    torch.testing.assert_close(lines.upper_slope, torch.tensor([7.0], dtype=D))
    torch.testing.assert_close(lines.upper_intercept, torch.tensor([6.0], dtype=D))


@pytest.mark.parametrize("n", [2, 3, 4], ids=lambda n: f"n{n}")
def test_convex_region_default_is_midpoint_tangent_and_chord(n):
    lower, upper = torch.tensor([0.5, 1.0], dtype=D), torch.tensor([2.0, 4.0], dtype=D)
    lines = power(n).linear_bounds(lower, upper)
    mid = (lower + upper) / 2
    torch.testing.assert_close(lines.lower_slope, n * mid ** (n - 1))
    chord = (upper**n - lower**n) / (upper - lower)
    torch.testing.assert_close(lines.upper_slope, chord)
    torch.testing.assert_close(lines.upper_slope * lower + lines.upper_intercept, lower**n)


@pytest.mark.parametrize("n", [3, 5], ids=lambda n: f"n{n}")
def test_odd_lines_mirror(n):
    """x^n is odd: the lines of [-u, -l] are the point reflections of those of [l, u]."""
    lower, upper = boxes(scale=2.0, special=MODERATE)
    a, b = power(n).linear_bounds(lower, upper), power(n).linear_bounds(-upper, -lower)
    torch.testing.assert_close(a.upper_slope, b.lower_slope)
    torch.testing.assert_close(a.upper_intercept, -b.lower_intercept, atol=1e-8, rtol=1e-8)


@EXPONENTS
def test_interval_is_exact(n):
    lower, upper = boxes(scale=2.0, special=MODERATE)
    low, up = power(n).interval(lower, upper)
    f_l, f_u = lower**n, upper**n
    if n % 2:
        assert torch.equal(low, f_l) and torch.equal(up, f_u)
    else:
        zero_inside = (lower < 0) & (upper > 0)
        expect = torch.where(zero_inside, torch.zeros_like(f_l), torch.minimum(f_l, f_u))
        assert torch.equal(low, expect) and torch.equal(up, torch.maximum(f_l, f_u))


def test_square_is_pow_two():
    lower, upper = boxes(scale=2.0, special=MODERATE)
    a = get_relaxation("square").linear_bounds(lower, upper)
    b = power(2).linear_bounds(lower, upper)
    for x, y in zip((a.lower_slope, a.upper_intercept), (b.lower_slope, b.upper_intercept)):
        assert torch.equal(x, y)
    assert get_relaxation("square").param_shape == (1,) and power(3).param_shape == (2,)


@pytest.mark.parametrize(
    ("exponent", "fragment"),
    [(0, "constant"), (1, "affine"), (-1, "reciprocal"), (-3, "negative"), (0.5, "integer"),
     (2.5, "integer"), (True, "integer"), ("2", "integer"), (None, "integer")],
    ids=["zero", "one", "minus_one", "negative", "half", "fraction", "bool", "string", "none"],
)  # fmt: skip
def test_bad_exponents_are_rejected(exponent, fragment):
    with pytest.raises(ValueError, match=fragment):
        get_relaxation("pow", exponent=exponent)


def test_integral_float_exponent_is_accepted():
    assert get_relaxation("pow", exponent=3.0).exponent == 3
    with pytest.raises(ValueError, match="pow"):
        get_relaxation("pow")  # the exponent is required


def test_overflow_and_infinite_bounds_raise():
    lower = torch.tensor([1.0, 1e13], dtype=torch.float32)
    upper = torch.tensor([2.0, 2e13], dtype=torch.float32)
    with pytest.raises(ValueError, match=r"index \(1,\).*overflows torch.float32"):
        power(3).linear_bounds(lower, upper)
    with pytest.raises(ValueError, match=r"index \(1,\).*overflows"):
        power(3).constraints(lower, upper)
    inf = torch.tensor([0.0, torch.inf], dtype=D)
    with pytest.raises(ValueError, match=r"finite; at index \(1,\)"):
        power(2).linear_bounds(torch.zeros(2, dtype=D), inf)


def test_point_box_and_tightness():
    for n in (2, 3, 4, 5):
        assert_point_box_exact(power(n), torch.tensor([-2.0, 0.0, 1.5, 30.0], dtype=D))
    lower, upper = torch.tensor([-2.0, 0.5], dtype=D), torch.tensor([1.0, 3.0], dtype=D)
    lines = power(4).linear_bounds(lower, upper)
    (gl, _), (gu, _) = worst_gaps(lines, lower, upper, lambda v: v**4)
    assert (gl.abs() < 1e-10).all() and (gu.abs() < 1e-10).all()  # tangent and chord touch
    for n in (2, 3):
        assert_constraints_at_least_as_tight(power(n), *boxes(scale=2.0, special=MODERATE))


def test_methods_sound():
    for n in (2, 3):
        check_methods_sound(power(n), scale=1.0, radius=0.5)
    check_methods_sound(power(2), methods=("lp",), seeds=(0,), scale=1.0, radius=0.5)
