"""The Planet relaxation of ReLU: valid lines, exact argmin, explicit constraints."""

from __future__ import annotations

import torch

from relaxations import get_relaxation
from relaxations.base import polygon_argmin
from tests.relaxation_checks import check_all, check_methods_sound, random_boxes

D = torch.float64
relu = get_relaxation("relu")


def _boxes(n: int = 400, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lower = torch.randn(n, generator=gen, dtype=D)
    upper = lower + torch.rand(n, generator=gen, dtype=D) * 2
    # Degenerate cases: l = u, u <= 0, l >= 0, l = 0, u = 0.
    lower[:5] = torch.tensor([0.3, -1.0, 0.5, 0.0, -2.0], dtype=D)
    upper[:5] = torch.tensor([0.3, -0.2, 1.5, 1.0, 0.0], dtype=D)
    return lower, upper


def _grid(lower, upper, k=101):
    t = torch.linspace(0, 1, k, dtype=D).unsqueeze(1)
    return lower + t * (upper - lower)


def test_linear_bounds_are_valid_for_any_alpha():
    lower, upper = _boxes()
    xh = _grid(lower, upper)
    for alpha in (None, torch.zeros_like(lower), torch.ones_like(lower), torch.rand_like(lower)):
        lb = relu.linear_bounds(lower, upper, alpha)
        low = lb.lower_slope * xh + lb.lower_intercept
        up = lb.upper_slope * xh + lb.upper_intercept
        assert (low <= torch.relu(xh) + 1e-12).all()
        assert (up >= torch.relu(xh) - 1e-12).all()


def test_stable_neurons_are_exact():
    lower = torch.tensor([0.5, -2.0, 0.0], dtype=D)
    upper = torch.tensor([2.0, -0.5, 3.0], dtype=D)
    lb = relu.linear_bounds(lower, upper, torch.full_like(lower, 0.3))
    torch.testing.assert_close(lb.lower_slope, lb.upper_slope)
    torch.testing.assert_close(lb.lower_intercept, lb.upper_intercept)


def _triangle_points(lower, upper, k=41):
    """Points (xh, x) filling the relaxed set (convex combinations of its vertices)."""
    a, b = torch.meshgrid(
        torch.linspace(0, 1, k, dtype=D), torch.linspace(0, 1, k, dtype=D), indexing="ij"
    )
    keep = (a + b) <= 1
    a, b = a[keep].unsqueeze(1), b[keep].unsqueeze(1)
    v1 = (lower, torch.relu(lower))
    v2 = (
        torch.clamp(torch.zeros_like(lower), lower, upper),
        torch.relu(torch.clamp(torch.zeros_like(lower), lower, upper)),
    )
    v3 = (upper, torch.relu(upper))
    xh = a * v1[0] + b * v2[0] + (1 - a - b) * v3[0]
    x = a * v1[1] + b * v2[1] + (1 - a - b) * v3[1]
    return xh, x


def test_argmin_is_the_minimum_over_the_relaxed_set():
    lower, upper = _boxes()
    gen = torch.Generator().manual_seed(5)
    cp, cq = torch.randn(2, lower.numel(), generator=gen, dtype=D)
    xh_star, x_star = relu.argmin(cp, cq, lower, upper)
    best = cp * xh_star + cq * x_star
    xh, x = _triangle_points(lower, upper)
    assert (best <= (cp * xh + cq * x).min(0).values + 1e-12).all()
    # The minimiser is feasible for the explicit constraints.
    cons = relu.constraints(lower, upper)
    assert ((xh_star >= lower - 1e-12) & (xh_star <= upper + 1e-12)).all()
    for s, t in zip(cons.lower_slopes, cons.lower_intercepts):
        assert (x_star >= s * xh_star + t - 1e-12).all()
    for s, t in zip(cons.upper_slopes, cons.upper_intercepts):
        assert (x_star <= s * xh_star + t + 1e-12).all()


def test_constraints_contain_the_relu_graph():
    lower, upper = _boxes()
    xh = _grid(lower, upper)
    x = torch.relu(xh)
    cons = relu.constraints(lower, upper)
    for s, t in zip(cons.lower_slopes, cons.lower_intercepts):
        assert (x >= s * xh + t - 1e-12).all()
    for s, t in zip(cons.upper_slopes, cons.upper_intercepts):
        assert (x <= s * xh + t + 1e-12).all()


def test_protocol_checks():
    lower, upper = random_boxes(special=((0.0, 0.0), (-1.0, 0.0), (0.0, 2.0), (-3.0, -1.0)))
    check_all(relu, lower, upper)


def test_generic_polygon_argmin_matches_the_closed_form():
    lower, upper = _boxes()
    gen = torch.Generator().manual_seed(3)
    cp, cq = torch.randn(2, lower.numel(), generator=gen, dtype=D)
    xh, x = relu.argmin(cp, cq, lower, upper)
    gxh, gx = polygon_argmin(relu.constraints(lower, upper), cp, cq, lower, upper)
    torch.testing.assert_close(cp * gxh + cq * gx, cp * xh + cq * x)


def test_needs_refinement_is_the_ambiguous_set():
    lower = torch.tensor([-1.0, 0.0, -2.0, 0.5], dtype=D)
    upper = torch.tensor([1.0, 1.0, 0.0, 0.5], dtype=D)
    assert relu.needs_refinement(lower, upper).tolist() == [True, False, False, False]


def test_methods_sound_on_a_relu_graph():
    check_methods_sound(relu, methods=("ibp", "crown", "alpha-crown", "lp"))
