"""sign and heaviside (relaxations/sign.py): the protocol harness, strict validity at the ends
and both sides of the jump, the hull of the closure, refinement exactly at 0, the methods."""

from __future__ import annotations

import pytest
import torch

import relaxations.sign  # noqa: F401  (registers "sign" and "heaviside")
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
JUMP_BOXES = (
    (0.0, 0.0), (-1.0, 1.0), (-2.0, 0.0), (0.0, 2.0), (-1e-7, 1e-7), (0.0, 1e-7), (-1e-7, 0.0),
    (-1e4, 1e4), (-1e-300, 1e-300), (0.0, 1e-300), (-1e-300, 0.0), (1.0, 3.0), (-3.0, -1.0),
    (-1.0, 1e-9), (-1e-9, 1.0), (-1e4, 1e-4), (2.0, 2.0), (-2.0, -2.0), (-5e-324, 5e-324),
    (-1e-40, 2e-40), (-5e-324, 1e-323), (-3e-39, 1e-45),
)  # fmt: skip
STEPS = [("sign", {}), ("heaviside", {"value": 0.5}), ("heaviside", {"value": 0.0}),
         ("heaviside", {"value": 1.0}), ("heaviside", {"value": 0.3})]  # fmt: skip
IDS = ["sign", "heaviside-0.5", "heaviside-0", "heaviside-1", "heaviside-0.3"]
sign = get_relaxation("sign")


def levels(relaxation) -> tuple[float, float, float]:
    return relaxation.low, relaxation.zero, relaxation.high


def step_critical(low: float, zero: float, high: float):
    """The ends, and at `c = clamp(0, l, u)` the left limit, the value and the right limit
    (each a constant: `a = 0`)."""

    def value(x):
        return torch.where(x < 0, x.new_tensor(low), torch.where(x > 0, high, x.new_tensor(zero)))

    def critical(lower, upper):
        c = torch.minimum(lower.clamp(min=0), upper)
        left = torch.where(lower < 0, lower.new_tensor(low), value(c))
        right = torch.where(upper > 0, upper.new_tensor(high), value(c))
        xs = torch.stack([lower, upper, c, c, c])
        b = torch.stack([value(lower), value(upper), left, value(c), right])
        return xs, torch.zeros_like(xs), b

    return critical


@pytest.mark.parametrize(("name", "options"), STEPS, ids=IDS)
@pytest.mark.parametrize("scale", [3.0, 1e-3])
def test_protocol_checks(name, options, scale):
    check_all(get_relaxation(name, **options), *boxes(special=JUMP_BOXES, scale=scale))


@DTYPES
@pytest.mark.parametrize(("name", "options"), STEPS, ids=IDS)
def test_lines_exactly_valid(dtype, name, options):
    """In float32 the levels are the float32 function's (rounded)."""
    relaxation = get_relaxation(name, **options)
    lower, upper = boxes(dtype, special=JUMP_BOXES)
    rounded = (float(torch.tensor(v, dtype=dtype)) for v in levels(relaxation))
    assert_exactly_valid(relaxation, lower, upper, step_critical(*rounded))


def test_forward():
    x = torch.tensor([-2.0, -1e-300, -0.0, 0.0, 1e-300, 3.0], dtype=D)
    assert sign.forward(x).equal(torch.sign(x))
    for value in (0.0, 0.3, 1.0):
        heaviside = get_relaxation("heaviside", value=value)
        assert heaviside.forward(x).equal(torch.heaviside(x, torch.tensor(value, dtype=D)))


def test_needs_refinement_at_zero():
    """Not one constant piece: `l < 0 < u`, and `[l, 0]` or `[0, u]` where the value at 0
    differs from that side's level (sign(0) = 0: `[0, u]` holds 0 and 1)."""
    lower = torch.tensor([-1.0, 0.0, -1.0, 0.0, 0.5, -2.0, -1e-300], dtype=D)
    upper = torch.tensor([1.0, 2.0, 0.0, 0.0, 1.0, -1.0, 1e-300], dtype=D)
    assert sign.needs_refinement(lower, upper).tolist() == [True, True, True, False, False,
                                                            False, True]  # fmt: skip
    at_one = get_relaxation("heaviside", value=1.0)  # x >= 0
    assert at_one.needs_refinement(lower, upper).tolist() == [True, False, True, False, False,
                                                              False, True]  # fmt: skip
    at_zero = get_relaxation("heaviside", value=0.0)  # x > 0
    assert at_zero.needs_refinement(lower, upper).tolist() == [True, True, False, False, False,
                                                               False, True]  # fmt: skip


def test_lines_across_the_jump():
    """On [-1, 2]: lower lines through (0, -1) with slopes in [0, 1] (to (2, 1)), upper through
    (0, 1) with slopes in [0, 2] (from (-1, -1)); on [0, 2] the lower chord `x / 2`, the upper
    1; on [-1, 0] the lower -1, the upper chord `x` (`t' = 1`) or 0 (`t' = 0`)."""
    lower = torch.tensor([-1.0, 0.0, -1.0], dtype=D)
    upper = torch.tensor([2.0, 2.0, 0.0], dtype=D)
    ones = torch.ones(3, 2, dtype=D)
    full = sign.linear_bounds(lower, upper, ones)
    flat = sign.linear_bounds(lower, upper, torch.zeros(3, 2, dtype=D))
    close = lambda a, b: torch.testing.assert_close(a, torch.tensor(b, dtype=D))  # noqa: E731
    close(full.lower_slope, [1.0, 0.5, 0.0])
    close(full.lower_intercept, [-1.0, 0.0, -1.0])
    close(full.upper_slope, [2.0, 0.0, 1.0])
    close(full.upper_intercept, [1.0, 1.0, 0.0])
    close(flat.lower_slope, [0.0, 0.0, 0.0])
    close(flat.upper_slope, [0.0, 0.0, 0.0])
    close(flat.upper_intercept, [1.0, 1.0, 0.0])
    default = sign.default_params(lower, upper)
    assert default.tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]


def test_slopes_stay_finite_over_tiny_widths():
    lower = torch.tensor([0.0, -5e-324, -1e-300, -1.0], dtype=D)
    upper = torch.tensor([5e-324, 5e-324, 1e-300, 1e-30], dtype=D)
    for params in (torch.ones(4, 2, dtype=D), torch.zeros(4, 2, dtype=D)):
        lb = sign.linear_bounds(lower, upper, params)
        for t in (lb.lower_slope, lb.lower_intercept, lb.upper_slope, lb.upper_intercept):
            assert torch.isfinite(t).all() and (t.abs() < 1e9).all()


@pytest.mark.parametrize(("name", "options"), STEPS, ids=IDS)
def test_constraints_are_the_hull(name, options):
    """Away from boxes so narrow that the slopes across the jump are capped (there the
    polygon is larger: valid, looser)."""
    relaxation = get_relaxation(name, **options)
    lower, upper = boxes(special=JUMP_BOXES)
    keep = (upper - lower) > 1e-5
    critical = step_critical(*levels(relaxation))
    assert_constraints_are_the_hull(relaxation, lower[keep], upper[keep], critical)


def test_interval_and_pieces():
    lower = torch.tensor([-1.0, 0.0, -3.0, 0.0], dtype=D)
    upper = torch.tensor([1.0, 2.0, -1.0, 0.0], dtype=D)
    low, up = sign.interval(lower, upper)
    assert low.tolist() == [-1.0, 0.0, -1.0, 0.0] and up.tolist() == [1.0, 1.0, -1.0, 0.0]
    assert [(p.start, p.end, p.intercept) for p in sign.pieces] == [
        (-torch.inf, 0.0, -1.0), (0.0, 0.0, 0.0), (0.0, torch.inf, 1.0)
    ]  # fmt: skip
    assert sign.monotone and not sign.convex and not sign.split_at_zero


@pytest.mark.parametrize(("name", "options"), STEPS[:2], ids=IDS[:2])
def test_methods_sound(name, options):
    check_methods_sound(get_relaxation(name, **options), scale=3.0)


def test_lp_and_milp_sound():
    """The MILP over the closed pieces is the closure's (sign(0) may be -1, 0 or 1): sound."""
    assert_lp_milp_sound(sign, scale=3.0)


BAD = [
    ("heaviside", {"value": 2.0}, ["value", "[0, 1]"]),
    ("heaviside", {"value": float("nan")}, ["value", "finite"]),
    ("heaviside", {"value": "1"}, ["value", "real number"]),
    ("sign", {"value": 0.5}, ["sign", "value"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "options", "fragments"), BAD, ids=lambda v: str(v)[:20])
def test_bad_options_are_refused(name, options, fragments):
    with raises_where(ValueError, *fragments):
        get_relaxation(name, **options)
