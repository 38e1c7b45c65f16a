"""Exact validity checks of the piecewise-linear relaxations (leaky ReLU, abs, hardtanh, sign,
floor): every line at the ends, kinks and both sides of each jump, in exact arithmetic; shared by
their test files."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

import relaxations.leaky_relu  # noqa: F401  (registers "leaky_relu")
from relaxations.base import polygon_argmin
from tests.relaxation_checks import (
    activation_graph,
    random_boxes,
)

D, F32 = torch.float64, torch.float32
DTYPES = pytest.mark.parametrize("dtype", [D, F32], ids=["float64", "float32"])


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
        # the MILP's optimum is loosened by 1e-6 (1 + |value|) (a reference); the LP's is certified
        slack_l, slack_u = 2e-6 * (1 + milp.lower.abs()), 2e-6 * (1 + milp.upper.abs())
        assert (milp.lower >= lp.lower - slack_l).all() and (milp.upper <= lp.upper + slack_u).all()


def kink_critical(slope: float):
    """Critical points of a function linear on each side of 0 (`slope` left of it): the ends
    and the kink, with the piece each lies on."""

    def critical(lower, upper):
        xs = torch.stack([lower, upper, torch.minimum(lower.clamp(min=0), upper)])
        a = torch.where(xs >= 0, 1.0, xs.new_tensor(slope))
        return xs, a, torch.zeros_like(xs)

    return critical
