"""The Anderson relaxation and its dual solvers (Big-M, active set): validity on sampled
points, the exact references (Big-M LP = Planet LP, the all-cuts LP), the float64 re-check,
warm starts, and the methods through `verify.bounds`."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import verify
from bounds.dual.active_set import ActiveSetConfig, BigMConfig, big_m_from_slopes, solve
from bounds.dual.anderson.cuts import Cuts, cut_terms, no_cuts
from bounds.dual.anderson.evaluation import AndersonDuals as Duals
from bounds.dual.anderson.evaluation import evaluate
from bounds.dual.anderson.problem import anderson_slopes, problem_from_graph
from bounds.dual.anderson.separation import candidates, most_violated
from bounds.errors import UnsupportedOperationError
from bounds.lp.anderson_lp import anderson_lp, anderson_lp_separated
from bounds.lp.lp import LpConfig, planet_lp
from bounds.methods.crown import crown, crown_intervals, output_functional
from bounds.registry import Relaxation, get_method, methods_with
from bounds.types import Interval
from tests.model_zoo import make
from tests.soundness import assert_contains, box_samples, spec_values
from verify.api import network_graph

pytest.importorskip("cvxpy")


def _tiny(seed: int, width: int = 6, depth: int = 2):
    torch.manual_seed(seed)
    sizes = [4] + [width] * depth
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(sizes[-1], 3)).double().eval()
    graph = network_graph(net, (4,))
    x = torch.randn(1, 4, dtype=torch.float64)
    box = Interval(x - 1, x + 1)
    return net, graph, box


def _problem(graph, box, specs: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    C = torch.randn(box.lower.shape[0], specs, 3, generator=gen, dtype=torch.float64)
    intervals = crown_intervals(graph, box)
    c = output_functional(graph, C)
    p = problem_from_graph(graph, box, intervals, c)
    init = big_m_from_slopes(p, anderson_slopes(p, None))
    return p, init, C, intervals


def _true_point(net, graph, p, x):
    """The network's values `(x per layer, z per hidden layer)` `[N, n]` at inputs `x`."""
    layers = p.layers
    xs, zs = [x], []
    for k in range(layers.hidden):
        xh = layers.forward(k, xs[-1])
        zs.append((xh >= 0).double())
        xs.append(torch.relu(xh))
    y = layers.forward(layers.hidden, xs[-1])
    assert torch.allclose(y, net(x), atol=1e-12)  # the dense layers are the network
    return xs, zs


@pytest.mark.parametrize("seed", range(3))
def test_every_anderson_constraint_holds_on_the_network(seed):
    """All `2^fan-in` constraints of every neuron (and the oracle's choice at random points)
    hold at sampled inputs with `z = 1[xh >= 0]`."""
    net, graph, box = _tiny(seed)
    p, _, _, _ = _problem(graph, box)
    x = box_samples(box.lower, box.upper, 300, seed)[0]
    xs, zs = _true_point(net, graph, p, x)
    for k in range(p.layers.hidden):
        W, b = p.layers.dense(k), p.layers.biases[k]
        n_in = W.shape[1]
        WL, WU = p.ends(k, W[None])
        for bits in itertools.product([False, True], repeat=n_in):
            mask = torch.tensor(bits)
            WI = W * mask
            kappa = -(mask * WL[0]).sum(-1)
            zeta = b + ((~mask) * WU[0]).sum(-1) + (mask * WL[0]).sum(-1)
            rhs = xs[k] @ WI.T + kappa + zeta * zs[k]
            assert (xs[k + 1] <= rhs + 1e-9).all()
        lo, up = p.pre_lower[k][0], p.pre_upper[k][0]
        xh = xs[k] @ W.T + b
        assert (xs[k + 1] <= up * zs[k] + 1e-9).all()
        assert (xs[k + 1] <= xh - lo * (1 - zs[k]) + 1e-9).all()
        # the oracle never reports a violation at a point of the network
        every = torch.arange(W.shape[0])[None]
        violation, _ = most_violated(p, k, xs[k][None], xs[k + 1][None], zs[k][None], every)
        assert violation.max() <= 1e-9


def test_the_big_m_start_reproduces_crowns_bound():
    _, graph, box = _tiny(0)
    p, init, C, intervals = _problem(graph, box)
    H = p.layers.hidden
    terms = tuple(cut_terms(p, k, no_cuts(p, k)) for k in range(H))
    value, _ = evaluate(p, terms, tuple(no_cuts(p, k) for k in range(H)), init)
    lower, upper, _ = crown(graph, box, C, intervals)
    torch.testing.assert_close(value[:, :3], lower, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(-value[:, 3:], upper, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed", range(3))
def test_big_m_converges_to_the_planet_lp(seed):
    _, graph, box = _tiny(seed)
    p, init, C, intervals = _problem(graph, box)
    big_m_lp = anderson_lp(p, all_cuts=False)
    lower, upper, _ = planet_lp(graph, box, C, intervals, LpConfig())
    planet = torch.cat([lower, -upper], 1)
    torch.testing.assert_close(big_m_lp, planet, rtol=1e-5, atol=1e-5)  # same optimum
    start = solve(p, BigMConfig(iterations=0), init).lower
    converge = {"initial_step": 0.1, "final_step": 1e-3}
    result = solve(p, BigMConfig(iterations=1500, **converge), init).lower
    assert (result <= big_m_lp + 1e-7).all()
    assert (result >= start - 1e-12).all()
    gap = (big_m_lp - start).clamp_min(1e-12)
    assert ((big_m_lp - result) <= 0.1 * gap + 1e-4).all()  # 90% of the gap closed


@pytest.mark.parametrize("seed", range(3))
def test_active_set_is_between_big_m_and_the_all_cuts_lp(seed):
    _, graph, box = _tiny(seed)
    p, init, _, _ = _problem(graph, box)
    hull = anderson_lp(p, all_cuts=True)
    planet = anderson_lp(p, all_cuts=False)
    big_m = solve(p, BigMConfig(iterations=300), init).lower
    converge = ActiveSetConfig(
        iterations=1500, big_m_iterations=60, cut_frequency=40, max_cuts=8, restrict=None,
        initial_step=0.1, final_step=1e-3,
    )  # fmt: skip
    result = solve(p, converge, init)
    assert (result.lower <= hull + 1e-7).all()
    assert (result.lower >= big_m - 1e-6).all()
    # beyond Planet: strictly above the Planet LP where the hull is
    tighter = hull > planet + 1e-3
    assert tighter.any()
    assert (result.lower[tighter] > planet[tighter]).all()
    assert sum(result.stats["cuts"]) > 0


@pytest.mark.parametrize("seed", range(3))
def test_cutting_planes_reach_the_all_cuts_lp(seed):
    _, graph, box = _tiny(seed)
    p, _, _, _ = _problem(graph, box)
    hull = anderson_lp(p, all_cuts=True)
    separated, stats = anderson_lp_separated(p)
    torch.testing.assert_close(separated, hull, rtol=1e-6, atol=1e-6)
    shared, _ = anderson_lp_separated(p, share_cuts=True)  # cuts valid for every objective
    torch.testing.assert_close(shared, hull, rtol=1e-6, atol=1e-6)
    planet = anderson_lp(p, all_cuts=False)
    tighter = hull > planet + 1e-3
    assert tighter.any() and (stats["cuts"][tighter.numpy()] > 0).all()
    with pytest.raises(RuntimeError, match="rounds"):
        anderson_lp_separated(p, max_rounds=0)


def test_the_float64_recheck_is_the_dual_value_at_the_returned_duals():
    _, graph, box = _tiny(1)
    p, init, _, _ = _problem(graph, box)
    p32 = p.to(torch.float32)
    result = solve(p32, ActiveSetConfig(iterations=300), init.to(torch.float32))
    p64 = p32.to(torch.float64)
    H = p.layers.hidden
    terms = tuple(cut_terms(p64, k, result.cuts[k]) for k in range(H))
    value, _ = evaluate(p64, terms, result.cuts, result.duals.to(torch.float64))
    assert result.lower.dtype == torch.float32
    assert (result.lower.double() <= value).all()  # rounded down, never up
    assert (torch.nextafter(result.lower, torch.tensor(torch.inf)).double() > value).all()
    assert (result.lower.double() <= anderson_lp(p, all_cuts=True) + 1e-5).all()
    assert all((t >= 0).all() for t in result.duals.flat())


def test_a_warm_start_from_a_converged_point_returns_that_point():
    _, graph, box = _tiny(2)
    p, init, _, _ = _problem(graph, box)
    first = solve(p, ActiveSetConfig(iterations=600), init)
    again = solve(p, ActiveSetConfig(iterations=0), first.duals, cuts=first.cuts)
    torch.testing.assert_close(again.lower, first.lower, rtol=0, atol=1e-12)
    more = solve(p, ActiveSetConfig(iterations=100), first.duals, cuts=first.cuts)
    assert (more.lower >= first.lower - 1e-12).all()


ZOO_OPTIONS = {  # per Anderson method: the options of the zoo soundness tests
    "big-m": {"iterations": 120, "big_m_iterations": 30, "cut_frequency": 30},
    "active-set": {"iterations": 120, "big_m_iterations": 30, "cut_frequency": 30},
    "sp-fw": {"iterations": 150, "big_m_iterations": 30},
}
FLOAT32_OPTIONS = {"active-set": {"iterations": 100},
                   "sp-fw": {"iterations": 100, "big_m_iterations": 20}}  # fmt: skip


@pytest.mark.parametrize("name", ["linear", "mlp", "deep_mlp", "conv", "normalised"])
@pytest.mark.parametrize("method", list(ZOO_OPTIONS))
def test_the_methods_contain_sampled_outputs_on_zoo_nets(name, method):
    net, shape = make(name)
    x = torch.rand(2, *shape, dtype=torch.float64)
    C = torch.randn(2, 3, net(x).shape[-1], dtype=torch.float64)
    result = verify.bounds(net, 0.1, x=x, C=C, method=method, **ZOO_OPTIONS[method])
    start = verify.bounds(net, 0.1, x=x, C=C, method="alpha-crown")
    values = spec_values(net, box_samples(x - 0.1, x + 0.1, 500), C)
    assert_contains(result.lower, result.upper, values)
    assert (result.lower >= start.lower - 1e-9).all()  # never below its alpha-CROWN start


@pytest.mark.parametrize("method", list(FLOAT32_OPTIONS))
def test_float32_nets_are_bounded_soundly(method):
    net, shape = make("deep_mlp", dtype=torch.float32)
    x = torch.rand(4, *shape)
    result = verify.bounds(net, 0.2, x=x, method=method, **FLOAT32_OPTIONS[method])
    values = spec_values(net, box_samples(x - 0.2, x + 0.2, 1000), torch.eye(2).expand(4, 2, 2))
    assert_contains(result.lower, result.upper, values, tol=1e-5)


@pytest.mark.parametrize("name", ["sigmoid_mlp", "residual"])
def test_other_graphs_get_a_typed_refusal(name):
    net, shape = make(name)
    x = torch.rand(1, *shape, dtype=torch.float64)
    with pytest.raises(UnsupportedOperationError, match=r"Anderson|chain"):
        verify.bounds(net, 0.1, x=x, method="active-set")


def test_the_seconds_budget_holds():
    import time

    net, shape = make("deep_mlp")
    x = torch.rand(8, *shape, dtype=torch.float64)
    tick = time.monotonic()
    verify.bounds(net, 0.3, x=x, method="active-set", iterations=10**6, budget=1.0)
    assert time.monotonic() - tick < 2.0


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="restrict"):
        ActiveSetConfig(restrict=0)
    with pytest.raises(ValueError, match="cut_frequency"):
        ActiveSetConfig(cut_frequency=0)


@pytest.mark.parametrize("prune", [False, True])
def test_restrict_caps_the_cuts_per_round(prune):
    _, graph, box = _tiny(0, width=8)
    p, init, _, _ = _problem(graph, box)
    config = ActiveSetConfig(
        iterations=60, big_m_iterations=5, cut_frequency=10, restrict=2, prune=prune
    )
    result = solve(p, config, init)
    rounds = result.stats["cut_rounds"]
    assert rounds == config.max_cuts
    for cuts in result.cuts:
        if prune:  # the cuts of earlier rounds whose multipliers stayed 0 are dropped
            assert 2 <= cuts.rows.shape[-1] <= 2 * rounds
        else:
            assert cuts.rows.shape[-1] == 2 * rounds
    slots = sum(c.rows.shape[-1] for c in result.cuts)
    assert (slots < 2 * rounds * len(result.cuts)) == prune
    assert (result.lower <= anderson_lp(p, all_cuts=True) + 1e-7).all()


def test_affine_nets_get_their_exact_bounds():
    net, shape = make("linear")
    x = torch.rand(2, *shape, dtype=torch.float64)
    exact = verify.bounds(net, 0.1, x=x, method="crown")
    for method in ZOO_OPTIONS:
        result = verify.bounds(net, 0.1, x=x, method=method)
        torch.testing.assert_close(result.lower, exact.lower, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(result.upper, exact.upper, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "kind, anderson",
    [
        (k, get_method(k).relaxation is Relaxation.ANDERSON)
        for k in methods_with("root_intermediate")
    ],
)
def test_dual_intermediate_bounds_contain_the_network_and_tighten_alpha_crowns(kind, anderson):
    """The dual solvers' intermediate bounds start from alpha-CROWN's: inside them (and
    CROWN's) and around every sampled pre-activation; the Anderson relaxation's are strictly
    tighter somewhere (prox's relaxation is Planet's, whose optimum alpha-CROWN can reach)."""
    from bounds.registry import intermediate_intervals

    net, shape = make("deep_mlp")
    graph = network_graph(net, shape)
    x = torch.rand(2, *shape, dtype=torch.float64)
    box = Interval(x - 0.3, x + 0.3)
    C = torch.eye(2, dtype=torch.float64).expand(2, 2, 2)
    crown_iv = crown_intervals(graph, box)
    alpha_iv = intermediate_intervals(graph, box, C, "alpha-crown")
    tight = intermediate_intervals(graph, box, C, kind, iterations=60)
    points = box_samples(box.lower, box.upper, 2000)
    values = graph.forward(points.flatten(0, 1), all_values=True)
    gained = False
    for name in graph.pre_activation_names():
        v = values[name].reshape(2, -1, *tight[name].lower.shape[1:])
        assert (v >= tight[name].lower.unsqueeze(1) - 1e-9).all(), name
        assert (v <= tight[name].upper.unsqueeze(1) + 1e-9).all(), name
        for base in (crown_iv, alpha_iv):
            assert (tight[name].lower >= base[name].lower - 1e-12).all(), name
            assert (tight[name].upper <= base[name].upper + 1e-12).all(), name
        gained |= bool((tight[name].lower > alpha_iv[name].lower + 1e-6).any())
    assert gained or not anderson
    with pytest.raises(ValueError, match="start must be"):
        intermediate_intervals(graph, box, C, kind, iterations=1, start="ibp")


def _small_conv():
    torch.manual_seed(5)
    net = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3, stride=2, padding=1),
        nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3),
    ).double().eval()  # fmt: skip
    return net, (1, 8, 8)


def test_sparse_cuts_on_convolutions_equal_the_dense_ones():
    """Conv rows are kept on their kernel windows (`CutTerms.support`): the oracle picks the
    same constraints and the terms give the same dual value as the dense ones."""
    from bounds.dual.anderson.cuts import layer_support, row_support
    from bounds.dual.anderson.evaluation import dual_value
    from bounds.dual.anderson.separation import select_cuts

    net, shape = _small_conv()
    graph = network_graph(net, shape)
    x = torch.rand(1, *shape, dtype=torch.float64)
    box = Interval(x - 0.2, x + 0.2)
    p, init, _, _ = _problem(graph, box)
    gen = torch.Generator().manual_seed(1)
    cuts = []
    for k in range(p.layers.hidden):
        index = candidates(p, k)
        F = layer_support(p, k, index)
        assert F is not None and p.x_lower[k].shape[-1] >= 4 * F
        support, values = row_support(p.layers.rows(k, index), F)
        S = p.c.shape[1]
        x_in = torch.rand(1, S, p.x_lower[k].shape[-1], generator=gen, dtype=torch.float64)
        x_in = p.x_lower[k][:, None] + x_in * (p.x_upper[k] - p.x_lower[k])[:, None]
        width = p.layers.width(k)
        x_out = torch.rand(1, S, width, generator=gen, dtype=torch.float64)
        x_out = x_out * p.x_upper[k + 1][:, None]
        z = torch.rand(1, S, width, generator=gen, dtype=torch.float64)
        dense = select_cuts(p, k, x_in, x_out, z, index, 4, 0.0)
        sparse = select_cuts(p, k, x_in, x_out, z, index, 4, 0.0, values, support)
        assert torch.equal(dense[0], sparse[0]) and torch.equal(dense[2], sparse[2])
        nonzero = p.layers.rows(k, dense[0]) != 0  # the masks only matter where W_ij != 0
        assert torch.equal(dense[1] & nonzero, sparse[1])
        cuts.append(Cuts(*dense))
    beta = tuple(torch.rand(c.rows.shape, generator=gen, dtype=torch.float64) for c in cuts)
    d = Duals(init.alpha, init.beta_u, init.beta_l, beta)
    torch.testing.assert_close(
        dual_value(p, tuple(cuts), d, sparse=True), dual_value(p, tuple(cuts), d),
        rtol=1e-12, atol=1e-12,
    )  # fmt: skip


def test_active_set_on_a_convolutional_net_is_sound_and_above_its_start():
    net, shape = _small_conv()
    x = torch.rand(2, *shape, dtype=torch.float64)
    C = torch.randn(2, 3, 3, dtype=torch.float64)
    result = verify.bounds(net, 0.2, x=x, C=C, method="active-set", iterations=80)
    start = verify.bounds(net, 0.2, x=x, C=C, method="alpha-crown")
    values = spec_values(net, box_samples(x - 0.2, x + 0.2, 1000), C)
    assert_contains(result.lower, result.upper, values)
    assert (result.lower >= start.lower - 1e-9).all()
