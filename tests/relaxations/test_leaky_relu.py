"""LeakyReLU / PReLU (relaxations/leaky_relu.py): the protocol harness for slopes in [0, 1], above
1 and negative, per-neuron slopes, and strict validity.

Strict validity: for a piecewise-linear (or piecewise-constant) function, `line - f` is linear
between the box ends, the kinks and the jumps, so a line is valid on the box iff it is valid at
those `critical` points (both one-sided values at a jump). `assert_exactly_valid` checks every
line (`linear_bounds` for several parameters, and `constraints`) there with zero slack: lines
computed in float64 in exact rational arithmetic, lines computed in float32 in float64 (exact
for those products). The shared helpers are in `tests/relaxations/strict_piecewise.py`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relaxations.leaky_relu  # noqa: F401  (registers "leaky_relu")
from relaxations import get_relaxation
from relaxations.relu import ReluRelaxation
from tests.bad_inputs.conftest import raises_where
from tests.relaxation_checks import (
    check_all,
    check_argmin,
    check_constraints,
    check_interval,
    check_lines,
    check_methods_sound,
    check_params,
)
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

D, F32 = torch.float64, torch.float32
SLOPES = (0.01, 0.0, 0.5, 1.0, 2.0, -0.5, -3.0, 0.999)


def relaxation_of(slope):
    return get_relaxation("leaky_relu", negative_slope=slope)


@pytest.mark.parametrize("slope", SLOPES)
@pytest.mark.parametrize("scale", [3.0, 1e-3])
def test_protocol_checks(slope, scale):
    check_all(relaxation_of(slope), *boxes(scale=scale))


@DTYPES
@pytest.mark.parametrize("slope", SLOPES)
def test_lines_exactly_valid(dtype, slope):
    """Zero slack at the ends and the kink; in float32 the slope the lines see is float32's."""
    relaxation = relaxation_of(slope)
    lower, upper = boxes(dtype)
    assert_exactly_valid(
        relaxation, lower, upper, kink_critical(float(torch.tensor(slope, dtype=dtype)))
    )


def test_per_neuron_slopes():
    """A tensor slope, one per neuron (PReLU): the harness's checks, and exactness off the
    ambiguous neurons (per neuron, since the slope does not follow a subset of the boxes)."""
    lower, upper = boxes()
    gen = torch.Generator().manual_seed(0)
    slope = torch.rand(lower.shape, generator=gen, dtype=D) * 5 - 2
    slope[:20] = 1.0
    relaxation = relaxation_of(slope)
    assert relaxation.pieces is None and not relaxation.convex and not relaxation.monotone
    for check in (check_interval, check_lines, check_params, check_constraints, check_argmin):
        check(relaxation, lower, upper)
    keep = ~relaxation.needs_refinement(lower, upper)
    lb = relaxation.linear_bounds(lower, upper)
    t = torch.linspace(0, 1, 11, dtype=D).unsqueeze(1)
    xh = lower + t * (upper - lower)
    y = relaxation.forward(xh)
    for s, c in ((lb.lower_slope, lb.lower_intercept), (lb.upper_slope, lb.upper_intercept)):
        assert ((s * xh + c - y)[:, keep].abs() <= 1e-12 * (1 + y[:, keep].abs())).all()
    assert keep[:20].all()  # slope 1: the identity


def test_channel_slopes_broadcast_over_feature_maps():
    """PReLU's `[C, 1, 1]` slopes against `[B, S, C, H, W]` boxes and parameters."""
    gen = torch.Generator().manual_seed(1)
    slope = torch.tensor([0.1, 2.0, -0.5], dtype=D).reshape(3, 1, 1)
    relaxation = relaxation_of(slope)
    lower = torch.randn(2, 1, 3, 4, 5, generator=gen, dtype=D)
    upper = lower + torch.rand(2, 1, 3, 4, 5, generator=gen, dtype=D) * 2
    params = torch.rand(2, 4, 3, 4, 5, generator=gen, dtype=D)
    lb = relaxation.linear_bounds(lower, upper, params)
    assert lb.lower_slope.shape == (2, 4, 3, 4, 5)
    t = torch.linspace(0, 1, 21, dtype=D).reshape(-1, 1, 1, 1, 1, 1)
    xh = lower + t * (upper - lower)
    y = relaxation.forward(xh)
    flat = xh.reshape(-1, 3, 4, 5)
    torch.testing.assert_close(y.reshape(-1, 3, 4, 5), F.prelu(flat, slope.reshape(3)))
    assert (lb.lower_slope * xh + lb.lower_intercept <= y + 1e-12).all()
    assert (lb.upper_slope * xh + lb.upper_intercept >= y - 1e-12).all()


@pytest.mark.parametrize("slope", [0.01, 0.3, 2.0, -0.5])
def test_forward_is_torch_leaky_relu(slope):
    x = torch.linspace(-5, 5, 101, dtype=D)
    torch.testing.assert_close(relaxation_of(slope).forward(x), F.leaky_relu(x, slope))


def test_slope_zero_is_relu():
    """Slope 0: ReLU's lines for the same alpha (up to the chord's few-ulp pad)."""
    lower, upper = boxes()
    relu, leaky = ReluRelaxation(), relaxation_of(0.0)
    scale = 1e-14 * (1 + lower.abs() + upper.abs())
    for alpha in param_sets(relu, lower, upper):
        a, b = relu.linear_bounds(lower, upper, alpha), leaky.linear_bounds(lower, upper, alpha)
        pairs = zip(
            (a.lower_slope, a.lower_intercept, a.upper_slope, a.upper_intercept),
            (b.lower_slope, b.lower_intercept, b.upper_slope, b.upper_intercept),
        )
        for x, y in pairs:
            assert ((x - y).abs() <= scale).all()
    assert leaky.needs_refinement(lower, upper).equal(relu.needs_refinement(lower, upper))


@pytest.mark.parametrize("slope", [0.2, 2.0, -0.5])
def test_constraints_are_the_triangle(slope):
    lower, upper = boxes()
    assert_constraints_are_the_hull(relaxation_of(slope), lower, upper, kink_critical(slope))
    assert_argmin_is_polygon_argmin(relaxation_of(slope), lower, upper)


@pytest.mark.parametrize("slope", [0.2, 2.0, -0.5])
def test_parameter_spans_the_tangent_side(slope):
    """On an ambiguous box `t = 0` is the slope n, `t = 1` the slope 1, and the chord joins
    `(l, n l)` and `(u, u)`; the default is CROWN's (the longer side)."""
    relaxation = relaxation_of(slope)
    lower, upper = torch.tensor([-1.0, -2.0], dtype=D), torch.tensor([2.0, 1.0], dtype=D)
    convex = slope <= 1
    for t, expected in ((0.0, slope), (1.0, 1.0), (0.5, (slope + 1) / 2)):
        lb = relaxation.linear_bounds(lower, upper, torch.full_like(lower, t))
        tangent, chord = (
            (lb.lower_slope, lb.upper_slope) if convex else (lb.upper_slope, lb.lower_slope)
        )
        torch.testing.assert_close(tangent, torch.full_like(lower, expected))
        intercept = lb.upper_intercept if convex else lb.lower_intercept
        torch.testing.assert_close(chord * lower + intercept, slope * lower, rtol=0, atol=1e-12)
        torch.testing.assert_close(chord * upper + intercept, upper, rtol=0, atol=1e-12)
    default = relaxation.linear_bounds(lower, upper)
    tangent = default.lower_slope if convex else default.upper_slope
    torch.testing.assert_close(tangent, torch.tensor([1.0, slope], dtype=D))


def test_interval_is_exact():
    """The range's ends are attained (at an end or the kink), for monotone and V-shaped slopes."""
    lower, upper = boxes()
    for slope in SLOPES:
        relaxation = relaxation_of(slope)
        low, up = relaxation.interval(lower, upper)
        xh = torch.stack([lower, upper, torch.minimum(lower.clamp(min=0), upper)])
        y = relaxation.forward(xh)
        assert (low == y.amin(0)).all() and (up == y.amax(0)).all()


@pytest.mark.parametrize("slope", [0.01, 2.0, -0.5])
def test_methods_sound(slope):
    check_methods_sound(relaxation_of(slope))


def test_lp_and_milp_sound():
    """The LP (`constraints`) and the exact MILP (`pieces`) contain sampled outputs."""
    assert_lp_milp_sound(relaxation_of(0.2))
    assert_lp_milp_sound(relaxation_of(2.0), seed=1)


def test_methods_sound_with_per_neuron_slopes():
    slope = torch.tensor([0.1, 2.0, -0.5, 0.0, 1.0, 0.7, -2.0, 3.0], dtype=D)
    check_methods_sound(relaxation_of(slope), methods=("ibp", "crown", "alpha-crown", "lp"))


BAD_SLOPES = [
    (True, "negative_slope"), ("0.1", "negative_slope"), (float("nan"), "finite"),
    (float("inf"), "finite"), (torch.tensor([]), "non-empty"),
    (torch.tensor([0.1, float("nan")]), "entry (1,)"), (None, "negative_slope"),
    (torch.tensor([1 + 1j]), "real"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "fragment"), BAD_SLOPES, ids=lambda v: repr(v)[:20])
def test_bad_slopes_are_refused(value, fragment):
    with raises_where(ValueError, fragment):
        get_relaxation("leaky_relu", negative_slope=value)


def test_unknown_option_is_refused():
    with raises_where(ValueError, "leaky_relu", "alpha"):
        get_relaxation("leaky_relu", alpha=0.1)


def test_slope_is_copied_and_traits_follow_it():
    weight = torch.tensor([0.25, 0.5])
    relaxation = relaxation_of(weight)
    weight[0] = 5.0
    assert relaxation.negative_slope[0] == 0.25
    assert relaxation.convex and relaxation.monotone and relaxation.split_at_zero
    assert relaxation_of(torch.tensor([0.3])).negative_slope == pytest.approx(0.3)
    assert relaxation_of(torch.tensor([0.3])).pieces is not None
    assert not relaxation_of(2.0).convex and relaxation_of(2.0).monotone
    assert relaxation_of(-1.0).convex and not relaxation_of(-1.0).monotone
