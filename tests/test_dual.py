"""Lagrangian-decomposition solvers on chain nets: never above the Planet LP (float64, same
intermediate bounds), never below their CROWN start, converging to the LP, anytime-valid,
warm-startable (DAGs: tests/test_dual_dag.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

import verify
from bounds.dual import (
    Duals,
    decompose,
    evaluate,
    initial_duals,
    problem_from_intervals,
    proximal,
    supergradient,
)
from bounds.lp.lp import planet_lp
from bounds.methods.crown import crown, output_functional
from bounds.types import Budget, Interval
from tests.model_zoo import make
from tests.soundness import assert_contains, box_samples, spec_values

D = torch.float64
SOLVERS = {
    "supergradient": (supergradient.solve, supergradient.SupergradientConfig),
    "prox": (proximal.solve, proximal.ProximalConfig),
}
CHAIN_NETS = ["mlp", "deep_mlp", "conv", "normalised", "bn_mlp", "linear"]


def _setup(name, seed=0, eps=0.3, specs=2):
    net, shape = make(name, seed=seed)
    graph = verify.network_graph(net, shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(1, *shape, generator=gen, dtype=D)
    box = Interval(x - eps, x + eps)
    C = torch.randn(1, specs, graph.output.shape[0], generator=gen, dtype=D)
    _, _, intervals = crown(graph, box, C)
    problem = problem_from_intervals(decompose(graph), box, intervals, output_functional(graph, C))
    return net, graph, box, C, intervals, problem


@pytest.fixture(scope="module")
def lp_cache():
    return {}


def _lp(lp_cache, name, seed):
    key = (name, seed)
    if key not in lp_cache:
        _, graph, box, C, intervals, _ = _setup(name, seed)
        lp_cache[key] = planet_lp(graph, box, C, intervals)[2]["raw"]
    return lp_cache[key]


@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("name", CHAIN_NETS)
def test_between_crown_start_and_lp(lp_cache, name, solver):
    _, _, _, _, _, problem = _setup(name)
    solve, config = SOLVERS[solver]
    init = initial_duals(problem)
    start, _ = evaluate(problem, init)
    result = solve(problem, config(iterations=60), init)
    lp = _lp(lp_cache, name, 0)
    assert (result.lower >= start - 1e-10).all()
    assert (result.lower <= lp + 1e-7 * (1 + lp.abs())).all()


@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("name, seed", [("mlp", 3), ("conv", 0)])
def test_converges_to_the_lp(lp_cache, name, seed, solver):
    _, _, _, _, _, problem = _setup(name, seed)
    solve, config = SOLVERS[solver]
    result = solve(problem, config(iterations=1500), initial_duals(problem))
    lp = _lp(lp_cache, name, seed)
    gap = (lp - result.lower) / (1 + lp.abs())
    assert (gap >= -1e-7).all() and (gap <= 1e-3).all(), gap


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_anytime_checkpoints_are_valid_and_monotone(lp_cache, solver):
    _, _, _, _, _, problem = _setup("mlp", 3)
    solve, config = SOLVERS[solver]
    result = solve(problem, config(iterations=100, check_every=5), initial_duals(problem))
    lp = _lp(lp_cache, "mlp", 3)
    values = [v for _, v in result.stats["trajectory"]]
    assert len(values) == 20
    for before, after in itertools.pairwise(values):
        assert (after >= before).all()
    assert (values[-1] <= lp + 1e-7).all()
    times = [t for t, _ in result.stats["trajectory"]]
    assert times == sorted(times)


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_warm_start_from_good_duals_keeps_them(solver):
    _, _, _, _, _, problem = _setup("mlp", 3)
    solve, config = SOLVERS[solver]
    good = solve(problem, config(iterations=800), initial_duals(problem))
    again = solve(problem, config(iterations=5), good.duals)
    assert (again.lower >= good.lower - 1e-10).all()


def test_time_budget_stops_early():
    _, _, _, _, _, problem = _setup("conv")
    config = proximal.ProximalConfig(iterations=100000, check_every=2)
    result = proximal.solve(problem, config, initial_duals(problem), Budget(seconds=0.3))
    assert result.stats["iterations"] < 100000
    assert result.stats["solver_seconds"] < 5


@pytest.mark.parametrize("method", ["supergradient", "prox"])
@pytest.mark.parametrize("intermediate", ["crown", "prox"])
@pytest.mark.parametrize("name", ["mlp", "conv", "normalised"])
def test_public_method_is_sound_on_samples(name, method, intermediate):
    net, shape = make(name, seed=1)
    x = torch.rand(2, *shape, dtype=D)
    result = verify.bounds(net, 0.3, x=x, method=method, intermediate=intermediate, iterations=40)
    crown_result = verify.bounds(net, 0.3, x=x, method="crown")
    assert (result.lower >= crown_result.lower - 1e-10).all()
    assert (result.upper <= crown_result.upper + 1e-10).all()
    points = box_samples(x - 0.3, x + 0.3, 400)
    n_out = result.lower.shape[1]
    C = torch.eye(n_out, dtype=D).expand(2, n_out, n_out)
    assert_contains(result.lower, result.upper, spec_values(net, points, C))
    for node, iv in result.intermediate.items():
        values = verify.network_graph(net, shape).forward(points[0], all_values=True)[node]
        assert (values >= iv.lower[0] - 1e-9).all() and (values <= iv.upper[0] + 1e-9).all()


def test_ld_intermediate_bounds_are_no_looser_than_crown():
    net, shape = make("deep_mlp", seed=2)
    x = torch.rand(1, *shape, dtype=D)
    ld = verify.bounds(net, 0.5, x=x, method="prox", intermediate="prox", iterations=10)
    base = verify.bounds(net, 0.5, x=x, method="crown")
    for node, iv in ld.intermediate.items():
        assert (iv.lower >= base.intermediate[node].lower - 1e-10).all()
        assert (iv.upper <= base.intermediate[node].upper + 1e-10).all()


def test_lp_with_the_same_intermediate_bounds_dominates_prox():
    net, shape = make("mlp", seed=4)
    x = torch.rand(1, *shape, dtype=D)
    kwargs = {"intermediate": "prox", "intermediate_iterations": 30}
    lp = verify.bounds(net, 0.4, x=x, method="lp", **kwargs)
    ld = verify.bounds(net, 0.4, x=x, method="prox", iterations=200, **kwargs)
    assert (ld.lower <= lp.lower + 2e-6 * (1 + lp.lower.abs())).all()


def test_duals_select_and_repeat():
    rho = (torch.arange(6.0).reshape(3, 1, 2), torch.arange(3.0).reshape(3, 1, 1))
    duals = Duals(rho)
    picked = duals.select(torch.tensor([2, 0]))
    assert picked.rho[0].tolist() == [[[4.0, 5.0]], [[0.0, 1.0]]]
    repeated = duals.repeat(2)
    assert repeated.rho[1].reshape(-1).tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    torch.testing.assert_close(duals.dot(duals), (duals.norm() ** 2))


def test_float32_problem_is_checked_in_float64(lp_cache):
    _, _, _, _, _, problem = _setup("mlp", 3)
    result = proximal.solve(problem.to(torch.float32), proximal.ProximalConfig(iterations=200),
                            initial_duals(problem.to(torch.float32)))  # fmt: skip
    assert result.lower.dtype == torch.float32
    lp = _lp(lp_cache, "mlp", 3)
    assert (result.lower.double() <= lp + 1e-6).all()


@pytest.mark.parametrize("method", ["prox", "supergradient"])
@pytest.mark.parametrize("name", ["mlp", "conv", "deep_mlp"])
def test_default_decomposition_is_at_least_as_tight_as_alpha_crown(name, method):
    net, shape = make(name, seed=5)
    x = torch.rand(2, *shape, generator=torch.Generator().manual_seed(5), dtype=D)
    alpha = verify.bounds(net, 0.3, x=x, method="alpha-crown")
    ld = verify.bounds(net, 0.3, x=x, method=method, iterations=30)
    assert (ld.lower >= alpha.lower - 1e-12).all()
    assert (ld.upper <= alpha.upper + 1e-12).all()
    points = box_samples(x - 0.3, x + 0.3, 300)
    n_out = ld.lower.shape[1]
    C = torch.eye(n_out, dtype=D).expand(2, n_out, n_out)
    assert_contains(ld.lower, ld.upper, spec_values(net, points, C))
