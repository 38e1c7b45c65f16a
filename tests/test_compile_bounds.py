"""Compiled bound solvers: each step is one graph (fullgraph), compiled == eager, and no
recompile across iterations, budgets or batch sizes (Dynamo's frame counter)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import bounds.compile
import kernels.compile
import verify
from bounds.dual import decompose, initial_duals, problem_from_intervals, proximal, supergradient
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown, output_functional
from bounds.types import Budget, Interval
from tests.model_zoo import make
from tests.test_dual_dag import _split_concat

D = torch.float64


def _box(name: str, batch: int, seed: int = 0, eps: float = 0.3):
    net, shape = make(name, seed=seed)
    graph = verify.network_graph(net, shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, *shape, generator=gen, dtype=D)
    C = torch.randn(batch, 2, graph.output.shape[0], generator=gen, dtype=D)
    return graph, Interval(x - eps, x + eps), C


def _problem(name: str, batch: int, seed: int = 0):
    if name == "split_concat":  # a DAG: sources with several shares, targets with several sources
        net, shape = _split_concat(seed)
        graph = verify.network_graph(net, shape)
        gen = torch.Generator().manual_seed(seed)
        x = torch.rand(batch, *shape, generator=gen, dtype=D)
        box = Interval(x - 0.5, x + 0.5)
        C = torch.randn(batch, 2, graph.output.shape[0], generator=gen, dtype=D)
    else:
        graph, box, C = _box(name, batch, seed)
    _, _, intervals = crown(graph, box, C)
    return problem_from_intervals(decompose(graph), box, intervals, output_functional(graph, C))


def _dual(solver: str, problem, compile_mode, budget=None, iterations=8):
    module = {"prox": proximal, "supergradient": supergradient}[solver]
    config_type = {
        "prox": proximal.ProximalConfig,
        "supergradient": supergradient.SupergradientConfig,
    }
    config = config_type[solver](iterations=iterations, compile=compile_mode, check_every=2)
    return module.solve(problem, config, initial_duals(problem), budget)


def _alpha(graph, box, C, compile_mode, budget=None, iterations=6, intermediate=True):
    config = AlphaCrownConfig(
        iterations=iterations, compile=compile_mode, tolerance=0,
        optimize_intermediate=intermediate,
    )  # fmt: skip
    return alpha_crown(graph, box, C, config, budget)


@pytest.fixture
def counter(monkeypatch):
    """Compile with a counting backend (Dynamo only, eager kernels: fast) from a clean cache."""
    torch._dynamo.reset()
    backend = CompileCounter()
    monkeypatch.setattr(kernels.compile, "BACKEND", backend)
    monkeypatch.setattr(kernels.compile, "_FAILED", set())
    yield backend
    torch._dynamo.reset()


@pytest.mark.compile
def test_a_failing_compile_falls_back_to_eager_with_a_warning(counter, monkeypatch):
    """One graph allowed per step: the second architecture cannot compile, and runs eagerly."""
    monkeypatch.setattr(kernels.compile, "RECOMPILE_LIMIT", 1)
    _dual("prox", _problem("mlp", 2), True)
    problem = _problem("deep_mlp", 2)
    with pytest.warns(RuntimeWarning, match="running it eagerly"):
        fallback = _dual("prox", problem, True)
    eager = _dual("prox", problem, False)
    torch.testing.assert_close(fallback.lower, eager.lower, rtol=0, atol=0)


def test_a_malformed_compiled_state_falls_back_to_eager(monkeypatch):
    """A compiled step whose NamedTuple output has lost items (torch 2.11 + CUDA with
    `_replace`) is caught at once: the step reruns eagerly, with a warning."""
    monkeypatch.setattr(kernels.compile, "_FAILED", set())

    def broken(*args, **kwargs):
        state = proximal.sweep_step(*args, **kwargs)
        return tuple.__new__(type(state), tuple(state)[:2])

    monkeypatch.setattr(kernels.compile, "compiled", lambda step: broken)
    problem = _problem("mlp", 2)
    state, scale = proximal.initial_state(problem, initial_duals(problem))
    factor = torch.ones((), dtype=D)
    step = kernels.compile.step_function(proximal.sweep_step, True)
    with pytest.warns(RuntimeWarning, match="malformed NamedTuple"):
        out = step(problem, state, factor, scale)
    expected = proximal.sweep_step(problem, state, factor, scale)
    assert len(out) == len(proximal.ProxState._fields)
    for a, b in zip(out.xhA, expected.xhA):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert proximal.sweep_step in kernels.compile._FAILED


@pytest.mark.compile
@pytest.mark.parametrize("solver", ["prox", "supergradient"])
def test_dual_solvers_compile_once_across_iterations_budgets_and_batches(counter, solver):
    for batch in (2, 3, 5):
        problem = _problem("mlp", batch)
        _dual(solver, problem, True)
        _dual(solver, problem, True, Budget(iterations=3))
        _dual(solver, problem, True, Budget(seconds=30.0))
    steps = {"prox": 2, "supergradient": 1}[solver]  # prox: the sweep and the anchor move
    assert counter.frame_count == steps


@pytest.mark.compile
@pytest.mark.parametrize("name", ["residual", "split_concat"])
@pytest.mark.parametrize("solver", ["prox", "supergradient"])
def test_dag_steps_are_one_graph_and_equal_eager(counter, solver, name):
    """On DAGs (a residual net; Split, Concat with a constant block, shares from several
    sources) each step is still one Dynamo graph (fullgraph), once across batches, and equals
    eager (Dynamo's graph run by the counting backend: Inductor's CPU build of these is minutes
    on a shared machine; the chain cases above run Inductor)."""
    for batch in (2, 3):
        problem = _problem(name, batch, seed=3)
        eager = _dual(solver, problem, False)
        fused = _dual(solver, problem, True)
        torch.testing.assert_close(fused.lower, eager.lower, rtol=1e-9, atol=1e-9)
        for a, b in zip(fused.duals.rho, eager.duals.rho):
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    assert counter.frame_count == {"prox": 2, "supergradient": 1}[solver]


@pytest.mark.parametrize("name", ["mlp", "residual", "split_concat"])
def test_start_duals_are_not_views(name):
    """The start duals become the anchor: a view among a compiled step's inputs makes it
    specialise on the view and recompile once the anchor moves (measured: seconds per solve)."""
    problem = _problem(name, 2)
    assert all(r._base is None for r in initial_duals(problem).rho)
    state, _ = proximal.initial_state(problem, initial_duals(problem))
    assert all(t._base is None for t in (*state.anchor, *state.previous, *state.best_rho))


@pytest.mark.compile
def test_alpha_crown_compiles_once_across_iterations_and_batches(counter):
    for batch in (2, 3):
        graph, box, C = _box("deep_mlp", batch)
        _alpha(graph, box, C, True)
        _alpha(graph, box, C, True, Budget(iterations=2))
    assert counter.frame_count == 1


@pytest.mark.compile
@pytest.mark.parametrize("solver", ["prox", "supergradient"])
def test_compiled_dual_solver_equals_eager(solver):
    problem = _problem("mlp", 2, seed=3)
    eager = _dual(solver, problem, False)
    fused = _dual(solver, problem, True)
    torch.testing.assert_close(fused.lower, eager.lower, rtol=1e-9, atol=1e-9)
    for a, b in zip(fused.duals.rho, eager.duals.rho):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.compile
def test_compiled_alpha_crown_equals_eager():
    graph, box, C = _box("mlp", 2, seed=1)
    eager = _alpha(graph, box, C, False, intermediate=False)  # small graph: short compile
    fused = _alpha(graph, box, C, True, intermediate=False)
    for a, b in zip(fused[:2], eager[:2]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_auto_compiles_on_cuda_only_unless_measured():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not bounds.compile.should_compile("auto", cpu)
    assert bounds.compile.should_compile("auto", cpu, cpu_default=True)
    assert bounds.compile.should_compile("auto", cuda)
    assert bounds.compile.should_compile(True, cpu) and not bounds.compile.should_compile(
        False, cuda
    )
    with pytest.raises(ValueError, match="compile must be"):
        proximal.ProximalConfig(compile="yes")
    with pytest.raises(ValueError, match="compile must be"):
        AlphaCrownConfig(compile=1.0)


def test_public_api_takes_the_compile_option():
    net, shape = make("mlp")
    x = torch.zeros(1, *shape, dtype=D)
    eager = verify.bounds(net, 0.1, x=x, method="prox", iterations=4, compile=False)
    assert torch.isfinite(eager.lower).all()
    with pytest.raises(ValueError, match="compile must be"):
        verify.bounds(net, 0.1, x=x, method="prox", compile="sometimes")


@pytest.mark.compile
def test_the_beta_crown_step_is_one_graph_and_equals_eager(counter):
    """alpha-beta-CROWN's step (`beta_step`) on split domains: one Dynamo graph (fullgraph)
    across iterations and batch sizes, with the same bounds and iterates as eager."""
    from bounds.methods import beta_crown

    for batch in (3, 5):
        graph, box, C = _box("mlp", batch, seed=2)
        _, _, intervals = crown(graph, box, C)
        pres = graph.pre_activation_names()
        gen = torch.Generator().manual_seed(batch)
        splits = {
            p: torch.randint(-1, 2, (batch, *graph[p].shape), generator=gen).to(torch.int8)
            for p in pres
        }
        clamped = beta_crown.split_intervals(intervals, splits)
        alpha = beta_crown.default_alpha(graph, clamped, C.shape[1])
        beta = {a: torch.full_like(t, 0.1) for a, t in alpha.items()}
        runs = []
        for mode in (False, True):
            config = beta_crown.BetaCrownConfig(iterations=6, tolerance=0, compile=mode)
            runs.append(beta_crown.optimise(graph, box, C, clamped, splits, alpha, beta, config,
                                            keep_best=True))  # fmt: skip
        eager, fused = runs
        torch.testing.assert_close(fused.lower, eager.lower, rtol=1e-9, atol=1e-9)
        for k in eager.beta:
            torch.testing.assert_close(fused.beta[k], eager.beta[k], rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(fused.best_alpha[k], eager.best_alpha[k], rtol=1e-7,
                                       atol=1e-9)  # fmt: skip
    assert counter.frame_count == 1
