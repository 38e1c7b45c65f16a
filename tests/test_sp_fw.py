"""Saddle-point Frank-Wolfe on the Anderson relaxation (`bounds.dual.sp_fw`): the dual value
from the betas' sums against `dual_value`, the dual LMO against brute force over every subset,
the exact references (Big-M start, all-cuts LP, Planet LP), the float64 re-check, and the
method through `verify.bounds` (budget, typed refusals). Zoo soundness on sampled points,
float32 nets and exact affine bounds are tested with the other Anderson methods in
`tests/test_active_set.py`."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

import verify
from bounds.dual import sp_fw
from bounds.dual.active_set import BigMConfig
from bounds.dual.active_set import solve as active_set_solve
from bounds.dual.anderson.cuts import Cuts, no_cuts
from bounds.dual.anderson.evaluation import AndersonDuals as Duals
from bounds.dual.anderson.evaluation import dual_value
from bounds.dual.sp_fw import SpFwConfig, statistics_from_duals, statistics_value
from bounds.errors import UnsupportedOperationError
from bounds.lp.anderson_lp import anderson_lp
from tests.model_zoo import make
from tests.test_active_set import _problem, _tiny

pytest.importorskip("cvxpy")


def _random_cuts(p, per: int, seed: int) -> tuple[tuple[Cuts, ...], tuple[torch.Tensor, ...]]:
    """`per` random Anderson constraints per problem and layer (random neurons and subsets),
    with random nonnegative multipliers."""
    gen = torch.Generator().manual_seed(seed)
    B, S = p.c.shape[:2]
    cuts, betas = [], []
    for k in range(p.layers.hidden):
        n, n_in = p.layers.width(k), p.x_lower[k].shape[-1]
        rows = torch.randint(0, n, (B, S, per), generator=gen)
        mask = torch.rand(B, S, per, n_in, generator=gen) < 0.5
        cuts.append(Cuts(rows, mask, torch.ones(B, S, per, dtype=torch.bool)))
        betas.append(torch.rand(B, S, per, generator=gen, dtype=p.c.dtype))
    return tuple(cuts), tuple(betas)


@pytest.mark.parametrize("seed", range(3))
def test_the_value_from_the_sums_is_the_dual_value(seed):
    """`statistics_value` at the sums of any duals (Big-M's, perturbed, and random cuts with
    repeated neurons) equals `anderson.dual_value` at those duals, minimiser included."""
    _, graph, box = _tiny(seed)
    p, init, _, _ = _problem(graph, box)
    gen = torch.Generator().manual_seed(seed)
    cuts, betas = _random_cuts(p, 5, seed)

    def jitter(ts):
        return tuple(t + torch.rand(t.shape, generator=gen, dtype=t.dtype) for t in ts)

    d = Duals(jitter(init.alpha), jitter(init.beta_u), jitter(init.beta_l), betas)
    expected = dual_value(p, cuts, d)
    value, x = statistics_value(p, statistics_from_duals(p, cuts, d))
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    # and at the Big-M start alone
    H = p.layers.hidden
    empty = tuple(no_cuts(p, k) for k in range(H))
    start, _ = statistics_value(p, statistics_from_duals(p, empty, init))
    torch.testing.assert_close(start, dual_value(p, empty, init), rtol=1e-12, atol=1e-12)
    assert all(((t == 0) | (t == 1)).all() for t in x.z)


def _brute_force_violation(p, k, x_in, x_out, z):
    """Per neuron `[B, S, n_k]`: the largest violation over Big-M's two constraints and every
    `A_I` (all `2^fan-in` subsets) at the point."""
    W, b = p.layers.dense(k), p.layers.biases[k]
    WL, WU = p.ends(k, W.expand(p.c.shape[0], *W.shape))
    lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
    xh = x_in @ W.T + b
    best = torch.maximum(x_out - up * z, x_out - xh + lo * (1 - z))
    ambiguous = ((lo < 0) & (up > 0)).expand_as(best)
    for bits in itertools.product([False, True], repeat=W.shape[1]):
        mask = torch.tensor(bits, dtype=W.dtype)
        kappa = -(mask * WL).sum(-1).unsqueeze(1)
        zeta = (b + ((1 - mask) * WU).sum(-1) + (mask * WL).sum(-1)).unsqueeze(1)
        rhs = x_in @ (W * mask).T + kappa + zeta * z
        best = torch.where(ambiguous, torch.maximum(best, x_out - rhs), best)
    return best


@pytest.mark.parametrize("seed", range(2))
def test_the_dual_lmo_is_the_best_vertex(seed):
    """At a random fractional primal point, the beta LMO's vertex gains `M_beta` times the
    largest violation over every constraint of the neuron (brute force over all subsets), and
    the alpha LMO's `M_alpha` times the positive part of `xh - x`: the Lagrangian's dual
    gradient, evaluated through the vertex's sums."""
    _, graph, box = _tiny(seed)
    p, *_ = _problem(graph, box)
    gen = torch.Generator().manual_seed(seed)
    B, S = p.c.shape[:2]
    H = p.layers.hidden

    def uniform(lo, up):
        t = torch.rand(B, S, lo.shape[-1], generator=gen, dtype=lo.dtype)
        return lo.unsqueeze(1) + t * (up - lo).unsqueeze(1)

    x = tuple(uniform(lo, up) for lo, up in zip(p.x_lower, p.x_upper))
    z = tuple(torch.rand(B, S, p.layers.width(k), generator=gen, dtype=p.c.dtype) for k in range(H))
    m_alpha = tuple(torch.rand(t.shape, generator=gen, dtype=t.dtype) + 0.5 for t in z)
    m_beta = tuple(torch.rand(t.shape, generator=gen, dtype=t.dtype) + 0.5 for t in z)
    rows = tuple(sp_fw.candidate_rows(p, k) for k in range(H))
    vertex = sp_fw.dual_vertex(p, rows, x, z, m_alpha, m_beta, chunk=64)  # several chunks
    for k in range(H):
        xh = p.layers.forward(k, x[k])
        gain = (vertex.beta[k] * x[k + 1] - vertex.beta_kappa[k] - vertex.beta_zeta[k] * z[k]).sum(
            -1
        ) - (vertex.beta_W[k] * x[k]).sum(-1)
        expected = m_beta[k] * _brute_force_violation(p, k, x[k], x[k + 1], z[k]).clamp_min(0)
        torch.testing.assert_close(gain, expected.sum(-1), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(vertex.alpha[k], m_alpha[k] * (xh > x[k + 1]))
        assert ((vertex.beta[k] == 0) | (vertex.beta[k] == m_beta[k])).all()


@pytest.mark.parametrize("seed", range(3))
def test_sp_fw_is_between_its_big_m_start_and_the_all_cuts_lp(seed):
    _, graph, box = _tiny(seed)
    p, init, _, _ = _problem(graph, box)
    hull = anderson_lp(p, all_cuts=True)
    config = SpFwConfig(iterations=600, big_m_iterations=100)
    result = sp_fw.solve(p, config, init)
    big_m = active_set_solve(p, BigMConfig(iterations=100), init).lower  # the same start
    torch.testing.assert_close(result.big_m.lower, big_m, rtol=0, atol=0)
    assert (result.lower <= hull + 1e-7).all()
    assert (result.lower >= big_m).all()
    assert (result.lower > big_m + 1e-4).float().mean() >= 0.5  # it moves
    assert result.stats["iterations"] == 600


def test_sp_fw_goes_strictly_beyond_the_planet_lp():
    """Where the hull is well above the Planet LP, SP-FW from Big-M gets above the Planet LP's
    optimum (which no Planet method, Big-M included, can pass) on most specifications."""
    _, graph, box = _tiny(2)
    p, init, _, _ = _problem(graph, box)
    hull = anderson_lp(p, all_cuts=True)
    planet = anderson_lp(p, all_cuts=False)
    result = sp_fw.solve(p, SpFwConfig(iterations=1000), init)
    tighter = hull > planet + 1e-3
    assert tighter.sum() >= 3
    assert (result.lower[tighter] > planet[tighter] + 1e-3).float().mean() >= 0.6
    assert (result.lower <= hull + 1e-7).all()


def test_the_float64_recheck_is_the_value_at_the_returned_sums():
    _, graph, box = _tiny(1)
    p, init, _, _ = _problem(graph, box)
    p32 = p.to(torch.float32)
    result = sp_fw.solve(p32, SpFwConfig(iterations=300), init.to(torch.float32))
    value, _ = statistics_value(p32.to(torch.float64), result.duals)
    assert result.lower.dtype == torch.float32
    assert (result.lower.double() <= value).all()  # rounded down, never up
    assert (torch.nextafter(result.lower, torch.tensor(torch.inf)).double() > value).all()
    assert (result.lower.double() <= anderson_lp(p, all_cuts=True) + 1e-5).all()
    assert all((t >= 0).all() for t in (*result.duals.alpha, *result.duals.beta))
    # linear memory: the sums are [B, S, n] per layer, no tensor per constraint
    widths = {p.layers.width(k) for k in range(p.layers.hidden)} | {box.lower.shape[-1]}
    assert all(t.dim() == 3 and t.shape[-1] in widths for t in result.duals.flat())


def test_the_seconds_budget_holds():
    net, shape = make("deep_mlp")
    x = torch.rand(8, *shape, dtype=torch.float64)
    tick = time.monotonic()
    verify.bounds(net, 0.3, x=x, method="sp-fw", iterations=10**6, budget=1.0)
    assert time.monotonic() - tick < 2.0


@pytest.mark.parametrize("name", ["sigmoid_mlp", "residual"])
def test_other_graphs_get_a_typed_refusal(name):
    net, shape = make(name)
    x = torch.rand(1, *shape, dtype=torch.float64)
    with pytest.raises(UnsupportedOperationError, match=r"Anderson|chain"):
        verify.bounds(net, 0.1, x=x, method="sp-fw")


@pytest.mark.parametrize(
    "options, match",
    [({"gamma_start": 0.5}, "gamma_start"), ({"m_factor": 0.9}, "m_factor"),
     ({"iterations": -1}, "iterations"), ({"chunk": 0}, "chunk")],
)  # fmt: skip
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        SpFwConfig(**options)


def test_the_best_iterate_is_kept():
    """SP-FW is not monotone; the best dual point is kept, so the recorded bound never
    decreases and the result is the best recorded."""
    _, graph, box = _tiny(0)
    p, init, _, _ = _problem(graph, box)
    result = sp_fw.solve(p, SpFwConfig(iterations=300, check_every=5), init)
    values = [v for _, v in result.stats["trajectory"]]
    assert len(values) == 60
    for earlier, later in itertools.pairwise(values):
        assert (later >= earlier).all()
    assert (values[-1] > values[0]).any()
    assert (result.lower >= values[-1] - 1e-12).all()
