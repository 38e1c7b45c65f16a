"""hardtanh / clip (relaxations/hardtanh.py): the protocol harness for finite, one-sided and
equal limits, strict validity at the ends and kinks, the triangle and quadrilateral hulls, and
the methods."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import relaxations.hardtanh  # noqa: F401  (registers "hardtanh")
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
    param_sets,
)

D = torch.float64
INF = math.inf
LIMITS = [(-1.0, 1.0), (0.0, 6.0), (-INF, 2.0), (0.0, INF), (-INF, INF), (0.5, 0.5), (-3.0, -2.0),
          (-1e-7, 1e-7), (-0.1, 100.0)]  # fmt: skip
KINK_BOXES = (
    (0.0, 0.0), (-1.0, 1.0), (-2.0, 2.0), (-1.0, 0.5), (-0.5, 1.0), (1.0, 3.0), (-3.0, -1.0),
    (-1e4, 1e4), (-1 - 1e-7, -1 + 1e-7), (1 - 1e-7, 1 + 1e-7), (1.0, 1.0), (-1.0, -1.0),
    (0.5, 0.5), (-2.0, 0.5), (0.5, 2.0), (0.0, 6.0), (-1.0, 7.0), (5.0, 7.0), (-1e4, -1e3),
    (-1e-300, 1e-300), (0.5, 0.5 + 1e-12),
    (-1e-40, 2e-40), (-5e-324, 1e-323), (-3e-39, 1e-45),
)  # fmt: skip


def clip(low: float, high: float):
    return get_relaxation("hardtanh", min=low, max=high)


def clip_critical(low: float, high: float):
    """The ends and the kinks clamped into the box, with the piece each lies on."""

    def critical(lower, upper):
        kinks = [torch.minimum(lower.clamp(min=v), upper) for v in (low, high)]
        xs = torch.stack([lower, upper, *kinks])
        inside = (xs >= low) & (xs <= high)
        a = inside.to(xs.dtype)
        b = torch.where(inside, 0.0, torch.where(xs < low, xs.new_tensor(low), high))
        if low == high:
            a, b = torch.zeros_like(xs), torch.full_like(xs, low)
        return xs, a, b

    return critical


@pytest.mark.parametrize(("low", "high"), LIMITS)
@pytest.mark.parametrize("scale", [3.0, 1e-3])
def test_protocol_checks(low, high, scale):
    check_all(clip(low, high), *boxes(special=KINK_BOXES, scale=scale))


@DTYPES
@pytest.mark.parametrize(("low", "high"), LIMITS)
def test_lines_exactly_valid(dtype, low, high):
    """In float32 the function is the float32 network's: its limits rounded to float32."""
    lower, upper = boxes(dtype, special=KINK_BOXES)
    rounded = (float(torch.tensor(v, dtype=dtype)) for v in (low, high))
    assert_exactly_valid(clip(low, high), lower, upper, clip_critical(*rounded))


@pytest.mark.parametrize(("low", "high"), [(-1.0, 1.0), (0.0, 6.0), (-INF, 2.0), (0.0, INF)])
def test_forward_is_torch_clamp(low, high):
    x = torch.linspace(-8, 8, 161, dtype=D)
    expected = torch.clamp(x, None if low == -INF else low, None if high == INF else high)
    assert clip(low, high).forward(x).equal(expected)
    if math.isfinite(low) and math.isfinite(high):
        assert clip(low, high).forward(x).equal(F.hardtanh(x, low, high))


def test_one_sided_clamp_is_a_shifted_relu():
    """`clamp(x, min=0)` is ReLU: the same lines for the same alpha (up to the chord's pad),
    and the same default on ambiguous neurons."""
    lower, upper = boxes(special=KINK_BOXES)
    relu, relu_clip = get_relaxation("relu"), clip(0.0, INF)
    scale = 1e-14 * (1 + lower.abs() + upper.abs())
    for alpha in param_sets(relu, lower, upper)[1:]:
        params = torch.stack([alpha, torch.zeros_like(alpha)], -1)
        a, b = (
            relu.linear_bounds(lower, upper, alpha),
            relu_clip.linear_bounds(lower, upper, params),
        )
        pairs = zip((a.lower_slope, a.lower_intercept, a.upper_slope, a.upper_intercept),
                    (b.lower_slope, b.lower_intercept, b.upper_slope, b.upper_intercept))  # fmt: skip
        for x, y in pairs:
            assert ((x - y).abs() <= scale).all()
    assert relu_clip.needs_refinement(lower, upper).equal(relu.needs_refinement(lower, upper))
    default = relu_clip.default_params(lower, upper)[..., 0]
    ambiguous = relu.needs_refinement(lower, upper)
    assert default[ambiguous].equal(relu.default_params(lower, upper)[ambiguous])


def test_quadrilateral_lines():
    """Crossing both kinks of clamp(-1, 1) on [-3, 2]: the lower lines pass through (-1, -1) with
    slopes in [0, 2/3] (the chord to (2, 1)), the upper through (1, 1) with slopes in [0, 1/2]
    (the chord from (-3, -1))."""
    relaxation = clip(-1.0, 1.0)
    lower, upper = torch.tensor([-3.0], dtype=D), torch.tensor([2.0], dtype=D)
    for t, low_slope, up_slope in ((0.0, 0.0, 0.0), (1.0, 2 / 3, 0.5), (0.5, 1 / 3, 0.25)):
        params = torch.full((1, 2), t, dtype=D)
        lb = relaxation.linear_bounds(lower, upper, params)
        torch.testing.assert_close(lb.lower_slope, torch.tensor([low_slope], dtype=D))
        torch.testing.assert_close(lb.upper_slope, torch.tensor([up_slope], dtype=D))
        torch.testing.assert_close(
            lb.lower_slope * -1 + lb.lower_intercept, -torch.ones(1, dtype=D)
        )
        torch.testing.assert_close(lb.upper_slope * 1 + lb.upper_intercept, torch.ones(1, dtype=D))
    default = relaxation.default_params(lower, upper)
    assert default.tolist() == [[1.0, 1.0]]  # right of -1 is longer; left of 1 is longer


@pytest.mark.parametrize(("low", "high"), [(-1.0, 1.0), (0.0, 6.0), (-INF, 2.0), (0.5, 0.5)])
def test_constraints_are_the_hull(low, high):
    lower, upper = boxes(special=KINK_BOXES)
    assert_constraints_are_the_hull(clip(low, high), lower, upper, clip_critical(low, high))
    assert_argmin_is_polygon_argmin(clip(low, high), lower, upper)


def test_needs_refinement_is_crossing_a_kink():
    relaxation = clip(-1.0, 1.0)
    lower = torch.tensor([-2.0, -0.5, 0.5, -2.0, -1.0, 1.0, -3.0, 0.0], dtype=D)
    upper = torch.tensor([0.0, 2.0, 0.9, 2.0, 1.0, 4.0, -1.0, 0.0], dtype=D)
    expected = [True, True, False, True, False, False, False, False]
    assert relaxation.needs_refinement(lower, upper).tolist() == expected
    assert not clip(0.5, 0.5).needs_refinement(lower, upper).any()


def test_pieces():
    assert [(p.start, p.end, p.slope, p.intercept) for p in clip(-1.0, 2.0).pieces] == [
        (-INF, -1.0, 0.0, -1.0), (-1.0, 2.0, 1.0, 0.0), (2.0, INF, 0.0, 2.0)
    ]  # fmt: skip
    assert len(clip(0.0, INF).pieces) == 2 and len(clip(-INF, INF).pieces) == 1


def test_traits():
    assert clip(0.0, INF).convex and not clip(-1.0, 1.0).convex and not clip(-INF, 0.0).convex
    assert clip(-1.0, 1.0).monotone and not clip(-1.0, 1.0).split_at_zero


@pytest.mark.parametrize(("low", "high"), [(-1.0, 1.0), (0.0, 6.0)])
def test_methods_sound(low, high):
    check_methods_sound(clip(low, high), scale=3.0)


def test_lp_and_milp_sound():
    assert_lp_milp_sound(clip(-0.5, 0.5), scale=3.0)


BAD_LIMITS = [
    ({"min": 1.0, "max": -1.0}, ["min <= max", "1.0", "-1.0"]),
    ({"min": float("nan")}, ["min", "NaN"]),
    ({"max": float("nan")}, ["max", "NaN"]),
    ({"min": "0"}, ["min", "real number"]),
    ({"max": True}, ["max", "real number"]),
    ({"min": INF, "max": INF}, ["infinity"]),
    ({"min": -INF, "max": -INF}, ["infinity"]),
    ({"low": 0.0}, ["hardtanh", "low"]),
]  # fmt: skip


@pytest.mark.parametrize(("options", "fragments"), BAD_LIMITS, ids=lambda v: str(v)[:30])
def test_bad_limits_are_refused(options, fragments):
    with raises_where(ValueError, *fragments):
        get_relaxation("hardtanh", **options)


def test_tensor_limits_of_one_element_are_accepted():
    relaxation = get_relaxation("hardtanh", min=torch.tensor(-2.0), max=torch.tensor([3.0]))
    assert (relaxation.min, relaxation.max) == (-2.0, 3.0)
