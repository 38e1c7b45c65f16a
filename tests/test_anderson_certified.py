"""The Anderson dual's certified value (bounds/dual/anderson/certified.py): at any duals and
cuts it is at most the solvers' float64 value and within rounding of it; it recomputes the
cuts' constants itself, so a solver working with wrong constants cannot make a reported bound
unsound; and the public Anderson methods contain exact values on the float-trap zoo."""

from __future__ import annotations

import pytest
import torch

import bounds.dual.anderson.cuts as anderson
import verify
from bounds.dual.active_set import ActiveSetConfig, big_m_from_slopes, solve
from bounds.dual.anderson.certified import certified_anderson_value
from bounds.dual.anderson.cuts import no_cuts
from bounds.dual.anderson.evaluation import AndersonDuals as Duals
from bounds.dual.anderson.evaluation import dual_value
from bounds.dual.anderson.problem import anderson_slopes, problem_from_graph
from bounds.methods.crown import crown_intervals, output_functional
from bounds.types import Interval
from tests.model_zoo import make
from tests.soundness import assert_contains, box_samples, spec_values
from tests.test_rounding import assert_trap_contained

D = torch.float64


def _setup(name: str, dtype=D, eps: float = 0.2, seed: int = 0):
    net, shape = make(name, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(2, *shape, generator=gen, dtype=dtype)
    graph = verify.network_graph(net, shape)
    box = Interval(x - eps, x + eps)
    C = torch.randn(2, 3, *graph.output.shape, generator=gen, dtype=dtype)
    c = output_functional(graph, C)
    p = problem_from_graph(graph, box, crown_intervals(graph, box), c)
    return p, big_m_from_slopes(p, anderson_slopes(p, None))


@pytest.mark.parametrize("name", ["mlp", "deep_mlp", "conv"])
def test_certified_matches_the_dual_value(name):
    """At the Big-M start, at random non-negative duals and at an active-set result with its
    cuts: certified <= the float64 value, and equal within 1e-9 relative."""
    p, init = _setup(name)
    H = p.layers.hidden
    gen = torch.Generator().manual_seed(1)
    noisy = Duals(*(tuple(t + torch.rand(t.shape, generator=gen, dtype=D) * t.abs().mean()
                          for t in part) for part in init))  # fmt: skip
    result = solve(p, ActiveSetConfig(iterations=60, big_m_iterations=20, cut_frequency=20), init)
    for duals, cuts in ((init, ()), (noisy, ()), (result.duals, result.cuts)):
        full = cuts or tuple(no_cuts(p, k) for k in range(H))
        q = dual_value(p, full, duals)
        cert = certified_anderson_value(p, cuts, duals)
        assert (cert <= q).all()
        assert (q - cert <= 1e-9 * (1 + q.abs())).all(), (q - cert).max()


def test_wrong_cut_constants_in_the_solver_do_not_reach_the_bound(monkeypatch):
    """The solvers' cut constants made too tight (kappa and zeta lowered by 1): their value is
    then too high, and the reported active-set bound must still contain sampled outputs."""
    honest = anderson.cut_terms

    def tight(*args, **kwargs):
        t = honest(*args, **kwargs)
        return t._replace(kappa=t.kappa - 1.0, zeta=t.zeta - 1.0)

    monkeypatch.setattr(anderson, "cut_terms", tight)
    monkeypatch.setattr("bounds.dual.active_set.cut_terms", tight, raising=False)
    net, shape = make("mlp")
    x = torch.rand(2, *shape, dtype=D)
    C = torch.randn(2, 3, net(x).shape[-1], dtype=D)
    b = verify.bounds(net, 0.3, x=x, C=C, method="active-set", iterations=120,
                      big_m_iterations=30, cut_frequency=30)  # fmt: skip
    reported = torch.cat([b.lower, -b.upper], 1)
    assert (b.stats["dual_value"] > reported + 0.1).any()  # the solver's value was wrong
    values = spec_values(net, box_samples(x - 0.3, x + 0.3, 2000), C)
    assert_contains(b.lower, b.upper, values)


@pytest.mark.parametrize("method", ["big-m", "active-set", "sp-fw"])
@pytest.mark.parametrize("name", ["huge_weights", "deep_narrow", "thin_box"])
def test_float_traps_contain_the_exact_values(name, method):
    assert_trap_contained(name, method, torch.float32, count=20, iterations=40)
