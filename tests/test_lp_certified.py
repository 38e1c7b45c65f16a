"""The Planet LP's certified bounds (bounds/lp.py, `planet_lp`): within the solver's tolerance
of its optimum, below the exact MILP, and independent of the optimum the solver reports (only
its duals are used, and any duals give a valid bound)."""

from __future__ import annotations

import pytest
import torch

import bounds.lp.lp
import verify
from bounds.lp.lp import milp, planet_lp
from bounds.methods.crown import crown
from bounds.types import Interval
from tests.model_zoo import make, make_trap
from tests.test_rounding import assert_trap_contained

pytest.importorskip("cvxpy")
D = torch.float64


def _case(name: str, seed: int = 0):
    net, shape = make(name, seed=seed)
    graph = verify.network_graph(net, shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(2, *shape, generator=gen, dtype=D)
    box = Interval(x - 0.3, x + 0.3)
    C = torch.randn(2, 2, *graph.output.shape, generator=gen, dtype=D)
    _, _, intervals = crown(graph, box, C)
    return graph, box, C, intervals


@pytest.mark.parametrize("name", ["mlp", "sigmoid_mlp"])
def test_certified_is_the_optimum_within_tolerance_and_below_the_milp(name):
    graph, box, C, intervals = _case(name)
    lower, upper, stats = planet_lp(graph, box, C, intervals)
    raw = stats["raw"]
    both = torch.cat([lower, -upper], 1)
    assert ((raw - both).abs() <= 1e-7 * (1 + raw.abs())).all(), (raw - both).abs().max()
    if name == "mlp":  # piecewise linear: the MILP is the true minimum
        exact_low, exact_up, _ = milp(graph, box, C, intervals)
        assert (lower <= exact_low + 1e-6).all() and (upper >= exact_up - 1e-6).all()


def test_a_wrong_optimum_from_the_solver_does_not_reach_the_bound(monkeypatch):
    """The solver's reported optimum raised by 1: the bounds stay what they were (only the
    LP's duals are read)."""
    graph, box, C, intervals = _case("mlp", seed=2)
    honest_low, honest_up, _ = planet_lp(graph, box, C, intervals)
    solve = bounds.lp.lp._solve

    def wrong(*args, **kwargs):
        value = solve(*args, **kwargs)
        return None if value is None else value + 1.0

    monkeypatch.setattr(bounds.lp.lp, "_solve", wrong)
    lower, upper, stats = planet_lp(graph, box, C, intervals)
    assert (stats["raw"][:, :2] >= honest_low + 0.99).all()  # the solver's values were wrong
    torch.testing.assert_close(lower, honest_low, rtol=0, atol=1e-12)
    torch.testing.assert_close(upper, honest_up, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["huge_weights", "thin_box", "trap"])
def test_float_traps_contain_the_exact_values(name):
    assert_trap_contained(name, "lp", torch.float32, count=20)


def test_a_problem_the_solver_cannot_solve_keeps_the_fallback():
    """deep_narrow's intervals reach 1e30, beyond HiGHS's infinity (1e20): its status is not
    optimal. The LP method warns, counts the solves left unsolved and keeps the interval bound
    (sound) instead of failing."""
    net, low, high = make_trap("deep_narrow", torch.float32)
    with pytest.warns(RuntimeWarning, match="could not solve"):
        b = verify.bounds(net, lower=low, upper=high, method="lp")
    assert b.stats["unsolved"] > 0
    assert torch.isfinite(b.lower).all() and torch.isfinite(b.upper).all()
    with pytest.warns(RuntimeWarning, match="could not solve"):
        assert_trap_contained("deep_narrow", "lp", torch.float32, count=20)
