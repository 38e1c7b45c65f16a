"""No compile past a deadline (kernels.compile_cost): a step whose call would compile runs
eagerly when the compile is predicted to end past the caller's deadline, and compiles when
there is time. A backend that sleeps stands for a slow compile (the H200's first compiles of
the alpha/beta-CROWN steps, 10-17 s, made branch and bound end 1-15 s past 30 s limits)."""

from __future__ import annotations

import time

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import kernels.compile
import verify
from bounds.methods import beta_crown
from bounds.methods.crown import crown
from bounds.types import Budget
from kernels import compile_cost
from kernels.compile import mark_batch_dynamic, step_function
from tests.test_compile_bounds import _alpha, _box, _dual, _problem


def _step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w) + x


class SlowBackend(CompileCounter):
    """Dynamo's graph, run as it is, after `seconds` of sleep: a compile of known cost."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(self, gm, example_inputs):
        time.sleep(self.seconds)
        return super().__call__(gm, example_inputs)


def _slow(monkeypatch, seconds: float) -> SlowBackend:
    torch._dynamo.reset()
    backend = SlowBackend(seconds)
    monkeypatch.setattr(kernels.compile, "BACKEND", backend)
    monkeypatch.setattr(kernels.compile, "_FAILED", set())
    monkeypatch.setattr(compile_cost, "_RECORDS", {})
    return backend


@pytest.fixture
def slow(monkeypatch):
    """A 1.5 s compile, `_step`'s prior 2 s, no start-up cost."""
    backend = _slow(monkeypatch, 1.5)
    monkeypatch.setitem(compile_cost.COMPILE_PRIOR_S["cpu"], compile_cost.step_key(_step), 2.0)
    monkeypatch.setattr(compile_cost, "STARTUP_PRIOR_S", 0.0)
    yield backend
    torch._dynamo.reset()


def _timed(fn, *args):
    tick = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - tick


def test_no_compile_starts_that_would_end_past_the_deadline(slow):
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    step = step_function(_step, True, deadline=time.monotonic() + 1.0)
    out, seconds = _timed(step, x, w)
    assert slow.frame_count == 0 and step.eager_calls == 1 and seconds < 1.0
    torch.testing.assert_close(out, _step(x, w), rtol=0, atol=0)


def test_with_time_it_compiles_and_its_measured_time_replaces_the_prior(slow, monkeypatch):
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    step = step_function(_step, True, deadline=time.monotonic() + 60)
    _, seconds = _timed(step, x, w)
    assert slow.frame_count == 1 and step.eager_calls == 0
    measured = compile_cost.record(_step, slow).measured_s
    assert 1.5 <= measured <= seconds
    assert compile_cost.predicted_seconds(_step, slow, "cpu") == measured
    near = step_function(_step, True, deadline=time.monotonic() + 1.0)
    near(x, w)  # compiled for these arguments: no compile, so no reason to run eagerly
    assert slow.frame_count == 1 and near.eager_calls == 0
    _, seconds = _timed(near, torch.randn(4, 5), torch.randn(5, 5))  # would compile: eager
    assert slow.frame_count == 1 and near.eager_calls == 1 and seconds < 1.0
    monkeypatch.setitem(compile_cost.COMPILE_PRIOR_S["cpu"], compile_cost.step_key(_step), 100.0)
    later = step_function(_step, True, deadline=time.monotonic() + 10 * measured)
    later(torch.randn(4, 6), torch.randn(6, 6))  # the measurement, not the prior of 100 s
    assert slow.frame_count == 2 and later.eager_calls == 0


def test_a_dynamic_batch_counts_as_compiled_for_every_size_but_0_and_1(slow):
    """The stand-in for Dynamo's guards agrees with Dynamo: a batch marked dynamic does not
    recompile for another size above 1, and does for size 1."""
    w = torch.randn(3, 3)
    first = torch.randn(4, 3)
    mark_batch_dynamic(first)
    step_function(_step, True, deadline=time.monotonic() + 60)(first, w)
    assert slow.frame_count == 1
    near = step_function(_step, True, deadline=time.monotonic() + 1.0)
    other = torch.randn(7, 3)
    mark_batch_dynamic(other)
    near(other, w)
    assert slow.frame_count == 1 and near.eager_calls == 0
    near(torch.randn(1, 3), w)
    assert slow.frame_count == 1 and near.eager_calls == 1
    step_function(_step, True)(torch.randn(1, 3), w)  # no deadline: it compiles size 1
    assert slow.frame_count == 2


def test_a_recompile_of_a_recorded_signature_switches_to_exact_sizes():
    rec = compile_cost.StepRecord()
    signature = lambda exact: ("exact" if exact else "bucket",)  # noqa: E731
    compile_cost.note_compile(rec, signature, 2.0)
    assert rec.ready == {("bucket",)} and not rec.exact and rec.measured_s == 2.0
    compile_cost.note_compile(rec, signature, 1.0)  # compiled again: it had specialised
    assert rec.exact and ("exact",) in rec.ready and rec.measured_s == 2.0


def test_signatures_tell_architectures_apart_and_ignore_the_weights():
    graph, box, _ = _box("mlp", 2)
    other, _, _ = _box("deep_mlp", 2)
    same, _, _ = _box("mlp", 2, seed=5)
    sig = lambda *args: compile_cost.call_signature(args, {}, False, {})  # noqa: E731
    assert sig(graph, box) == sig(same, box) != sig(other, box)
    assert sig(graph, box) != sig(graph, box.lower)
    assert sig(torch.zeros(2, 3)) != sig(torch.zeros(2, 3, dtype=torch.float64))
    grad = sig(graph, box)
    with torch.no_grad():
        assert sig(graph, box) != grad  # grad mode is in the key (Dynamo guards on it)


# Each solver with compile=True under a limit: `limit` seconds from now, or None (no limit).
def _alpha_run(limit):
    graph, box, C = _box("deep_mlp", 2)
    budget = None if limit is None else Budget(seconds=limit)
    return _alpha(graph, box, C, True, budget, iterations=40 if limit else 2)


def _beta_run(limit):
    graph, box, C = _box("mlp", 3, seed=2)
    _, _, intervals = crown(graph, box, C)
    gen = torch.Generator().manual_seed(3)
    splits = {
        p: torch.randint(-1, 2, (3, *graph[p].shape), generator=gen).to(torch.int8)
        for p in graph.pre_activation_names()
    }
    clamped = beta_crown.split_intervals(intervals, splits)
    alpha = beta_crown.default_alpha(graph, clamped, C.shape[1])
    beta = {a: torch.full_like(t, 0.1) for a, t in alpha.items()}
    config = beta_crown.BetaCrownConfig(iterations=40 if limit else 2, tolerance=0, compile=True)
    deadline = None if limit is None else time.monotonic() + limit
    return beta_crown.optimise(graph, box, C, clamped, splits, alpha, beta, config, deadline=deadline)  # fmt: skip


def _dual_run(solver):
    def run(limit):
        budget = None if limit is None else Budget(seconds=limit)
        return _dual(solver, _problem("mlp", 2), True, budget, iterations=200 if limit else 2)

    return run


RUNS = {
    "alpha-crown": _alpha_run,
    "beta-crown": _beta_run,
    "prox": _dual_run("prox"),
    "supergradient": _dual_run("supergradient"),
}


@pytest.mark.compile
@pytest.mark.parametrize("name", RUNS)
def test_solvers_keep_their_limit_when_a_compile_would_not_fit(name, monkeypatch):
    """A 3 s compile against a 1.5 s limit: the solver runs eagerly and ends in time (house
    rule: within 5% or 1 s), with the default priors; without a limit it compiles."""
    backend = _slow(monkeypatch, 3.0)
    try:
        limit = 1.5
        _, seconds = _timed(RUNS[name], limit)
        assert backend.frame_count == 0
        assert seconds <= max(1.05 * limit, limit + 1.0), seconds
        RUNS[name](None)
        assert backend.frame_count >= 1
    finally:
        torch._dynamo.reset()


@pytest.mark.compile
def test_branch_and_bound_keeps_its_limit_with_compiling_steps(monkeypatch):
    """The H200's case on the CPU: "auto" made to compile as on CUDA, compiles of 6 s, a 4 s
    limit on a net that gets past the root (tests/test_limits.py): no compile starts, and the
    search ends in time. (Without the prediction the first compile alone passes the limit.)"""
    from bounds.dual import active_set, proximal, sp_fw, supergradient
    from bounds.methods import alpha_crown
    from tests.test_limits import allowed, held_out_like

    def as_on_cuda(mode, device, cpu_default=False, error=ValueError):
        return kernels.compile.should_compile(mode, torch.device("cuda"), cpu_default, error)

    for module in (alpha_crown, beta_crown, proximal, supergradient, active_set, sp_fw):
        monkeypatch.setattr(module, "should_compile", as_on_cuda)
    backend = _slow(monkeypatch, 6.0)
    net, prop = held_out_like(16)
    try:
        result, seconds = _timed(lambda: verify.verify(net, prop, timeout=4.0, splitting="relu"))
    finally:
        torch._dynamo.reset()
    assert seconds <= allowed(4.0), (seconds, result.stats)
    assert backend.frame_count == 0
    assert result.stats["regions"][0]["domains"] > 10  # it branched: beta-CROWN steps ran
