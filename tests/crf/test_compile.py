"""Compiled solver steps (crf/compile.py): every step traces whole (fullgraph), iterations never
recompile, a new image size recompiles once and then not again, compiled == eager; the
``compile=`` option; the solvers on the Triton kernels (interpreter on CPU) == the reference."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from crf_testlib import smooth_image
from torch._dynamo.testing import CompileCounter

import crf
import crf.compile
import kernels.compile
import kernels.compile_cost
from crf.compile import should_compile
from crf.solvers import SOLVERS
from kernels import backend
from tests.kernels import needs_triton

METHODS = ["meanfield", "qp", "dc-neg", "lp"]
STEPS_PER_METHOD = {"meanfield": 1, "qp": 1, "dc-neg": 1, "lp": 3}  # lp: anchor, primal, dual


def _instance(h: int, w: int, m: int = 4, seed: int = 0, **kwargs) -> crf.DenseCRF:
    rng = np.random.default_rng(seed)
    unary = crf.unary_from_probs(rng.dirichlet(np.ones(m), size=(h, w)))
    return crf.DenseCRF(smooth_image(h, w, seed), unary, **kwargs)


@pytest.fixture
def counting_compile(monkeypatch):
    """Compile every step with Dynamo and a counting backend (no Inductor: fast); yields the
    counter (``frame_count`` = graphs compiled)."""
    counter = CompileCounter()
    torch._dynamo.reset()
    monkeypatch.setattr(kernels.compile, "BACKEND", counter)
    monkeypatch.setattr(kernels.compile, "_FAILED", set())
    yield counter
    torch._dynamo.reset()


def _close(a: crf.MapResult, b: crf.MapResult, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(a.stats["marginals"], b.stats["marginals"], atol=atol)
    np.testing.assert_allclose(a.energy, b.energy, rtol=1e-6)


@pytest.mark.compile
@pytest.mark.parametrize("method", METHODS)
def test_steps_trace_whole_and_never_recompile_across_iterations(method, counting_compile):
    small = _instance(9, 11)
    res = small.map(method, init="unary", iterations=6, compile=True, tol=0.0)
    assert res.stats["iterations"] >= 3
    assert counting_compile.frame_count == STEPS_PER_METHOD[method]  # all iterations, 1 graph
    _close(res, small.map(method, init="unary", iterations=6, compile=False, tol=0.0))
    small.map(method, init="unary", iterations=3, compile=True, tol=0.0)  # repeated call
    assert counting_compile.frame_count == STEPS_PER_METHOD[method]
    for h, w in ((12, 10), (7, 13)):  # the second size recompiles (sizes go dynamic), not the third
        _instance(h, w, seed=1).map(method, init="unary", iterations=3, compile=True, tol=0.0)
    assert counting_compile.frame_count == 2 * STEPS_PER_METHOD[method]


@pytest.mark.compile
def test_exact_kernels_and_float64_compile(counting_compile):
    from crf_testlib import tiny_crf

    c = tiny_crf(2, normalize="symmetric", strength=3.0)
    for method in METHODS:
        _close(c.map(method, iterations=5, compile=True), c.map(method, iterations=5), 1e-12)
    assert counting_compile.frame_count == sum(STEPS_PER_METHOD.values())


@pytest.mark.compile
@pytest.mark.slow
def test_inductor_compiled_equals_eager():
    """Real Inductor code (C++ on CPU) against eager, every method (lp chains dc-neg and
    mean-field, so their compiled steps run twice with different inits)."""
    c = _instance(14, 17, m=5, seed=3)
    for method in METHODS:
        _close(
            c.map(method, iterations=4, compile=True), c.map(method, iterations=4, compile=False)
        )


def test_compile_option_is_validated_and_resolved():
    c = _instance(5, 6)
    with pytest.raises(crf.ConfigError):
        c.map("meanfield", compile="yes")
    with pytest.raises(crf.ConfigError):
        crf.solvers.MeanFieldConfig(compile=1)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert should_compile("auto", cuda) and not should_compile("auto", cpu)
    assert should_compile("auto", cpu, cpu_default=True)
    assert should_compile(True, cpu) and not should_compile(False, cuda)
    for solve, config_cls in SOLVERS.values():
        assert config_cls().compile is False and isinstance(config_cls.cpu_compile_default, bool)
        assert callable(solve)


@pytest.mark.compile
def test_compiled_wrappers_are_cached_per_step():
    from crf.solvers.meanfield import step

    assert crf.compile.compiled(step) is crf.compile.compiled(step)
    assert crf.compile.step_function(step, False) is step


@needs_triton
@pytest.mark.parametrize("method", METHODS)
def test_solvers_on_triton_kernels_equal_reference(method):
    """The wiring: with every kernel on Triton (the interpreter on CPU), each solver gives the
    reference (CSR / torch) result."""
    c = _instance(6, 7, m=3, seed=2)
    ref = c.map(method, init="unary", iterations=3)
    with backend.kernel_backend("triton"):
        tri = c.map(method, init="unary", iterations=3)
    _close(tri, ref)


@pytest.mark.compile
@needs_triton
def test_compiled_steps_call_the_triton_custom_ops(counting_compile):
    """With the Triton backend, the compiled steps trace through the custom ops (their fake
    implementations) whole, and equal the reference."""
    c = _instance(5, 6, m=3, seed=4)
    ref = c.map("qp", init="unary", iterations=3)
    with backend.kernel_backend("triton"):
        tri = c.map("qp", init="unary", iterations=3, compile=True)
    assert counting_compile.frame_count == 1
    _close(tri, ref)


@pytest.mark.compile
@pytest.mark.parametrize("method", METHODS)
def test_a_seconds_budget_holds_when_a_compile_would_not_fit(method, monkeypatch):
    """Compiles of 3 s (a sleeping backend) against a 1 s budget: the steps run eagerly and
    the call ends in time (within 5% or 1 s); without a budget they compile."""
    from tests.test_compile_deadline import SlowBackend

    torch._dynamo.reset()
    backend = SlowBackend(3.0)
    monkeypatch.setattr(kernels.compile, "BACKEND", backend)
    monkeypatch.setattr(kernels.compile, "_FAILED", set())
    monkeypatch.setattr(kernels.compile_cost, "_RECORDS", {})
    small = _instance(9, 11)
    try:
        tick = time.monotonic()
        small.map(method, init="unary", iterations=10_000, compile=True, tol=0.0, seconds=1.0)
        assert time.monotonic() - tick <= 2.0 and backend.frame_count == 0
        small.map(method, init="unary", iterations=2, compile=True, tol=0.0)
        assert backend.frame_count >= 1
    finally:
        torch._dynamo.reset()
