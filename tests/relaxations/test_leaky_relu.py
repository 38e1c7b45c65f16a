"""LeakyReLU / PReLU (relaxations/leaky_relu.py): the protocol harness for slopes in [0, 1], above
1 and negative, per-neuron slopes, and strict validity.

Strict validity: for a piecewise-linear (or piecewise-constant) function, `line - f` is linear
between the box ends, the kinks and the jumps, so a line is valid on the box iff it is valid at
those `critical` points (both one-sided values at a jump). `assert_exactly_valid` checks every
line (`linear_bounds` for several parameters, and `constraints`) there with zero slack: lines
computed in float64 in exact rational arithmetic, lines computed in float32 in float64 (exact
for those products). The helpers here are shared by the other piecewise relaxations' tests."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

import relaxations.leaky_relu  # noqa: F401  (registers "leaky_relu")
from relaxations import get_relaxation
from relaxations.base import polygon_argmin
from relaxations.relu import ReluRelaxation
from tests.bad_inputs.conftest import raises_where
from tests.relaxation_checks import (
    activation_graph,
    check_all,
    check_argmin,
    check_constraints,
    check_interval,
    check_lines,
    check_methods_sound,
    check_params,
    random_boxes,
)

D, F32 = torch.float64, torch.float32
DTYPES = pytest.mark.parametrize("dtype", [D, F32], ids=["float64", "float32"])
SLOPES = (0.01, 0.0, 0.5, 1.0, 2.0, -0.5, -3.0, 0.999)
KINK_BOXES = (
    (0.0, 0.0), (-1.0, 0.0), (0.0, 2.0), (-3.0, -1.0), (1.0, 3.0), (-1e4, 1e4), (-1e-7, 1e-7),
    (-1e4, 1e-3), (-1e-3, 1e4), (-1.0, 1.0), (-2.0, 1e-7), (-1e-7, 2.0), (5.0, 5.0), (-5.0, -5.0),
    (-1e-300, 1e-300),
    (-1e-40, 2e-40), (-5e-324, 1e-323), (-3e-39, 1e-45),
)  # fmt: skip


def boxes(dtype=D, special=KINK_BOXES, scale: float = 3.0, seed: int = 0):
    lower, upper = random_boxes(n=300, seed=seed, scale=scale, special=special)
    return lower.to(dtype), upper.to(dtype)


def param_sets(relaxation, lower, upper, seeds=(1, 2)):
    """None (the default), the extremes, and random params, partly outside [0, 1]."""
    default = relaxation.default_params(lower, upper)
    out = [None, torch.zeros_like(default), torch.ones_like(default)]
    for s in seeds:
        gen = torch.Generator().manual_seed(s)
        noise = torch.rand(default.shape, generator=gen, dtype=D) * 1.6 - 0.3
        out.append(noise.to(lower.dtype))
    return out


def all_lines(relaxation, lower, upper):
    """`(slopes, intercepts, side)` of every line: `linear_bounds` for `param_sets`, and every
    row of `constraints` (side -1: lower, +1: upper), each `[*shape]`."""
    lines = []
    for params in param_sets(relaxation, lower, upper):
        lb = relaxation.linear_bounds(lower, upper, params)
        lines += [(lb.lower_slope, lb.lower_intercept, -1), (lb.upper_slope, lb.upper_intercept, 1)]
    cons = relaxation.constraints(lower, upper)
    lines += [(s, i, -1) for s, i in zip(cons.lower_slopes, cons.lower_intercepts)]
    lines += [(s, i, 1) for s, i in zip(cons.upper_slopes, cons.upper_intercepts)]
    return lines


def assert_exactly_valid(relaxation, lower, upper, critical, max_exact: int = 120) -> None:
    """Every line valid at the `critical(lower64, upper64) -> (xs, a, b)` points `xs [K, n]`
    (float64), where the function's exact value is `a x + b`, with zero slack: float32 lines in
    float64 (exact: a float32 slope times a float32 point), float64 lines in rational arithmetic
    (the first `max_exact` boxes and the last 40, where `boxes` puts the special ones)."""
    lines = all_lines(relaxation, lower, upper)
    xs, a, b = critical(lower.double(), upper.double())
    n = lower.numel()
    some = torch.cat([torch.arange(min(max_exact, n)), torch.arange(max(max_exact, n - 40), n)])
    for slope, icpt, side in lines:
        assert torch.isfinite(slope).all() and torch.isfinite(icpt).all()
        slope, icpt = torch.broadcast_to(slope, lower.shape), torch.broadcast_to(icpt, lower.shape)
        if lower.dtype == D:
            _exactly_valid(slope[some], icpt[some], side, xs[:, some], a[:, some], b[:, some])
            continue
        gap = a * xs + b - (slope.double() * xs + icpt.double())
        bad = (side * gap > 0).any(0)
        assert not bad.any(), f"side {side}: boxes {bad.nonzero().flatten()[:5].tolist()}"


def _exactly_valid(slope, icpt, side, xs, a, b) -> None:
    for j, (s, c) in enumerate(zip(slope.tolist(), icpt.tolist())):
        for x, p, q in zip(xs[:, j].tolist(), a[:, j].tolist(), b[:, j].tolist()):
            x = Fraction(x)
            gap = Fraction(p) * x + Fraction(q) - (Fraction(s) * x + Fraction(c))
            assert side * gap <= 0, f"box {j}: line {s} x + {c} side {side} at x = {x}"


def assert_constraints_are_the_hull(relaxation, lower, upper, critical, seed: int = 3) -> None:
    """The constraints' polygon is the hull of the graph: for random objectives its minimum
    (`polygon_argmin`) equals the minimum over the `critical` points, which include every
    vertex of the hull (a convex set is the intersection of its supporting half-planes)."""
    xs, a, b = critical(lower, upper)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        cp, cq = torch.randn(2, lower.numel(), generator=gen, dtype=D)
        gxh, gx = polygon_argmin(relaxation.constraints(lower, upper), cp, cq, lower, upper)
        hull = (cp * xs + cq * (a * xs + b)).amin(0)
        torch.testing.assert_close(cp * gxh + cq * gx, hull, rtol=1e-9, atol=1e-9)


def assert_argmin_is_polygon_argmin(relaxation, lower, upper, seed: int = 4) -> None:
    """A closed-form `argmin` attains `polygon_argmin`'s value over `constraints`."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        cp, cq = torch.randn(2, lower.numel(), generator=gen, dtype=D)
        xh, x = relaxation.argmin(cp, cq, lower, upper)
        gxh, gx = polygon_argmin(relaxation.constraints(lower, upper), cp, cq, lower, upper)
        torch.testing.assert_close(cp * gxh + cq * gx, cp * xh + cq * x, rtol=1e-9, atol=1e-9)


def assert_lp_milp_sound(relaxation, seed: int = 0, scale: float = 2.0) -> None:
    """The LP (`constraints`) and, where `pieces` exist, the exact MILP contain sampled outputs,
    and the MILP lies within the LP, on a small `activation_graph` (quick with cvxpy)."""
    import verify
    from tests.soundness import assert_contains, box_samples

    graph = activation_graph(relaxation, sizes=(2, 5, 5, 2), seed=seed, scale=scale)
    lower, upper = torch.full((1, 2), -1.0, dtype=D), torch.full((1, 2), 1.0, dtype=D)
    values = graph.forward(box_samples(lower, upper, 2000, seed=seed)[0]).unsqueeze(0)
    lp = verify.bounds(graph, lower=lower, upper=upper, method="lp")
    assert_contains(lp.lower, lp.upper, values)
    if relaxation.pieces is not None:
        milp = verify.bounds(graph, lower=lower, upper=upper, method="milp")
        assert_contains(milp.lower, milp.upper, values, tol=1e-6)
        assert (milp.lower >= lp.lower - 1e-6).all() and (milp.upper <= lp.upper + 1e-6).all()


def kink_critical(slope: float):
    """Critical points of a function linear on each side of 0 (`slope` left of it): the ends
    and the kink, with the piece each lies on."""

    def critical(lower, upper):
        xs = torch.stack([lower, upper, torch.minimum(lower.clamp(min=0), upper)])
        a = torch.where(xs >= 0, 1.0, xs.new_tensor(slope))
        return xs, a, torch.zeros_like(xs)

    return critical


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
