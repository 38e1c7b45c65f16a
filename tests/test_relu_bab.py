"""ReLU-splitting branch and bound: agreement with the exact MILP on tiny nets, soundness of the
split bounds on their halves (sampling), never "unsat" on a violated region, time limits,
out-of-memory batches, the choice of the splitting mode."""

from __future__ import annotations

import copy
import functools
import time

import numpy as np
import pytest
import torch
from torch import nn

import verify
import verify.verifier as verifier
from bounds.methods import beta_crown
from bounds.methods.crown import crown
from bounds.types import Interval
from verify.api import network_graph
from verify.attack import UnsafeSpec, violation
from verify.bab import (
    BabConfig,
    ReluBab,
    ReluDomains,
    ReluSplitConfig,
    solve_region,
    splitting_mode,
)
from verify.bab.branchers import RELU_BRANCHINGS
from verify.bab.common import DeadlineReachedError
from verify.bab.relu.bounder import ReluBounder
from verify.bab.relu.branching import babsr_scores, branchable, side_slopes
from verify.bab.relu.domains import Layout
from verify.cli.main import build_parser
from verify.property import Polytope, Region, VnnlibProperty

D = torch.float64

RELU = BabConfig(splitting="relu")


def mlp(sizes: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).eval()


def milp_minima(net: nn.Module, region: Region, rows: np.ndarray) -> np.ndarray:
    """The exact minimum of each `rows [k, n_out]` `. y` over the region's box (float64 MILP)."""
    twin = copy.deepcopy(net).double()
    lower, upper = (torch.tensor(a)[None] for a in (region.lower, region.upper))
    C = torch.tensor(rows)[None]
    return verify.bounds(twin, lower=lower, upper=upper, C=C, method="milp").lower[0].numpy()


@functools.cache
def milp_case(seed: int) -> tuple[nn.Module, Region, np.ndarray, float]:
    """A net, its box, one output row `c` and the exact minimum of `c . y` over the box."""
    gen = np.random.default_rng(300 + seed)
    sizes = [5, 16, 16, 2] if seed % 2 else [4, 12, 12, 12, 2]
    net = mlp(sizes, seed)
    lower = gen.uniform(-1, 0, sizes[0])
    row = gen.normal(size=sizes[-1])
    box = Region(lower, lower + 1, ())
    return net, box, row, float(milp_minima(net, box, row[None])[0])


def milp_property(seed: int, truth: str) -> tuple[nn.Module, VnnlibProperty]:
    """`c y <= b` with `b` 1% above (sat) or below (unsat) the MILP minimum of `milp_case`."""
    net, box, row, minimum = milp_case(seed)
    offset = 0.01 * (1 + abs(minimum)) * (1 if truth == "sat" else -1)
    poly = Polytope(row[None], np.array([minimum + offset]))
    region = Region(box.lower, box.upper, (poly,))
    return net, VnnlibProperty("<milp>", len(box.lower), len(row), (region,))


def assert_relu_bab_agrees_with_milp(seed: int, truth: str, relu: ReluSplitConfig,
                                    monkeypatch, timeout: float = 30) -> None:  # fmt: skip
    """ReLU splitting with `relu` answers `truth` on `milp_property(seed, truth)`, the root
    attack off (so that the search must prove or find the counterexample itself)."""
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)
    net, prop = milp_property(seed, truth)
    config = BabConfig(splitting="relu", relu=relu)
    result = verify.verify(net, prop, timeout=timeout, config=config)
    assert result.status == truth, (seed, result.status, truth, result.stats)


@pytest.mark.parametrize("seed", [1, 3, 5])
@pytest.mark.parametrize("truth", ["sat", "unsat"])
def test_agrees_with_the_exact_milp(seed, truth, monkeypatch):
    """`c y <= b` with `b` 1% above (sat) or below (unsat) the MILP minimum; the root attack is
    off, so branch and bound must prove or find the counterexample itself."""
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)
    net, prop = milp_property(seed, truth)
    result = verify.verify(net, prop, timeout=10, splitting="relu")
    assert result.status == truth, (seed, result.status, truth, result.stats)


def test_disjunction_of_multi_row_polytopes_matches_the_milp():
    """Two polytopes of two rows each (the unsafe set is their union). unsat: every row's `b`
    is 5% under its MILP minimum; sat: one row of the second polytope 5% above its minimum and
    the other row never binding."""
    net = mlp([6, 16, 16, 4], 3)
    gen = np.random.default_rng(9)
    lower = gen.uniform(-1, 0, 6)
    box = Region(lower, lower + 1, ())
    rows = gen.normal(size=(4, 4))
    minima = milp_minima(net, box, rows)
    scale = 0.05 * (1 + np.abs(minima))
    loose = minima - scale
    loose_sat = loose.copy()
    loose_sat[2], loose_sat[3] = minima[2] + scale[2], 1e6
    for b, truth in ((loose, "unsat"), (loose_sat, "sat")):
        polys = (Polytope(rows[:2], b[:2]), Polytope(rows[2:], b[2:]))
        prop = VnnlibProperty("<or>", 6, 4, (Region(box.lower, box.upper, polys),))
        result = verify.verify(net, prop, timeout=10, splitting="relu")
        assert result.status == truth, (truth, result.stats)


def random_domains(runner: ReluBab, n: int, depth: int, seed: int) -> ReluDomains:
    """`n` domains from the runner's root with `depth` splits of random ambiguous neurons, the
    signs taken from the activation pattern of a random point of the box (so that no domain
    is empty)."""
    gen = torch.Generator().manual_seed(seed)
    roots, _ = runner.bounder.easy.root(runner._try_points)
    parent = roots.take(torch.zeros(n, dtype=torch.long))
    box = runner.target.box
    x = box.lower + torch.rand(n, *box.lower.shape[1:], generator=gen) * (box.upper - box.lower)
    values = runner.target.graph.forward(x, all_values=True)
    pattern = torch.cat([values[p].flatten(1) for p in runner.target.layout.pres], dim=1) >= 0
    splits = parent.splits.clone()
    for _ in range(depth):
        flat = runner.bounder.easy.flat_intervals(splits)
        mask = branchable(flat.lower, flat.upper, splits).float() + 1e-9
        pick = torch.multinomial(mask, 1, generator=gen).flatten()
        rows = torch.arange(n)
        splits[rows, pick] = pattern[rows, pick].to(torch.int8) * 2 - 1
    fields = (parent.alpha, parent.beta, parent.poly, parent.rows, parent.margin)
    return ReluDomains(splits, *fields, parent.depth + depth, parent.stall)


@pytest.mark.parametrize("seed", range(3))
def test_split_bounds_are_sound_on_their_domains(seed):
    """Sampled inputs that satisfy a domain's split constraints never go below its bound."""
    net = mlp([3, 12, 12, 2], seed)
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),))
    runner = ReluBab(net, region, RELU)
    domains = random_domains(runner, 16, depth=4, seed=seed)
    bounded, _ = runner.bounder.easy.bound(domains, iterations=20)
    x = torch.rand(100_000, 3, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    values = runner.target.graph.forward(x, all_values=True)
    pre = torch.cat([values[p].flatten(1) for p in runner.target.layout.pres], dim=1)  # [X, n]
    y = (values[runner.target.graph.output.name] @ runner.spec.C.T - runner.spec.b)[:, 0]
    checked = 0
    for i in range(len(bounded)):
        s = bounded.splits[i].float()
        inside = ((pre * s) >= 0).all(dim=1)
        if inside.any():
            checked += 1
            assert y[inside].min() >= bounded.rows[i, 0] - 1e-4, (i, seed)
    assert checked == len(bounded)


def test_beta_crown_without_splits_is_crown():
    net = mlp([4, 10, 10, 3], 1)
    graph = verify.network_graph(net, (4,))
    box = Interval(-torch.ones(1, 4), torch.ones(1, 4))
    C = torch.randn(1, 2, 3, generator=torch.Generator().manual_seed(0))
    want, _, intervals = crown(graph, box, C)
    pres = graph.pre_activation_names()
    splits = {p: torch.zeros(1, *graph[p].shape, dtype=torch.int8) for p in pres}
    got = beta_crown.backward(graph, box, C, beta_crown.split_intervals(intervals, splits), splits)
    # CROWN's is computed in float64 with its rounding bounded (bounds.rounding), beta-CROWN's
    # in float32 without: equal up to float32 rounding
    assert torch.allclose(got.lower, want, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_tracked_beta_crown_is_below_the_untracked_and_within_rounding(seed):
    """Random splits, slopes and multipliers on a float64 net: the tracked bound (the recheck's)
    is at most the untracked one and within 1e-9 relative of it; with weights of 1e6 next to
    constants of 1e3 it still contains the domain's sampled values."""
    gen = torch.Generator().manual_seed(seed)
    for scale in (1.0, 1e6):
        net = mlp([4, 10, 10, 3], seed).double()
        with torch.no_grad():
            net[0].weight.mul_(scale)
            net[0].bias.add_(1e3)
        graph = verify.network_graph(net, (4,))
        box = Interval(
            -torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)
        )
        C = torch.randn(3, 2, 3, generator=gen, dtype=torch.float64)
        _, _, intervals = crown(graph, box, C)
        pres = graph.pre_activation_names()
        splits = {}
        for p in pres:  # a few neurons split, so that the domains hold sampled points
            sign = torch.randint(0, 2, (3, *graph[p].shape), generator=gen) * 2 - 1
            chosen = torch.rand(3, *graph[p].shape, generator=gen) < 0.15
            splits[p] = torch.where(chosen, sign, 0).to(torch.int8)
        clamped = beta_crown.split_intervals(intervals, splits)
        names = [n.name for n in graph.nodes if n.inputs and n.inputs[0] in pres
                 and not n.op.is_affine]  # fmt: skip
        alpha = {a: torch.rand(3, 2, *graph[a].shape, generator=gen, dtype=torch.float64)
                 for a in names}  # fmt: skip
        beta = {a: torch.rand(3, 2, *graph[a].shape, generator=gen, dtype=torch.float64)
                for a in names}  # fmt: skip
        plain = beta_crown.backward(graph, box, C, clamped, splits, alpha, beta)
        tracked = beta_crown.backward(graph, box, C, clamped, splits, alpha, beta, tracked=True)
        assert (tracked.lower <= plain.lower).all()
        gap = (plain.lower - tracked.lower).abs()
        assert (gap <= 1e-9 * (1 + plain.lower.abs()) * scale).all(), gap.max()
        x = 2 * torch.rand(4000, 4, generator=gen, dtype=torch.float64) - 1  # the boxes' points
        values = graph.forward(x, all_values=True)
        checked = 0
        for b in range(3):
            inside = torch.ones(len(x), dtype=torch.bool)
            for p in pres:
                s = splits[p][b].reshape(-1)
                pre = values[p].reshape(len(x), -1)
                inside &= ((s == 0) | ((s > 0) & (pre >= 0)) | ((s < 0) & (pre <= 0))).all(1)
            if inside.any():
                y = values[graph.output.name][inside] @ C[b].T
                assert (y >= tracked.lower[b]).all()
                checked += 1
        assert checked


def test_fully_split_domain_is_exact_with_optimised_multipliers():
    """All ambiguous neurons split on a tiny net: the bound approaches the domain's minimum."""
    net = mlp([2, 6, 2], 4)
    region = Region(-np.ones(2), np.ones(2), (Polytope(np.array([[1.0, 0.0]]), np.zeros(1)),))
    runner = ReluBab(net, region, RELU)
    roots, _ = runner.bounder.easy.root(runner._try_points)
    flat = runner.bounder.easy.flat_intervals(roots.splits)
    ambiguous = branchable(flat.lower, flat.upper, roots.splits)[0].nonzero().flatten()
    assert len(ambiguous) >= 2
    grid = torch.stack(torch.meshgrid(*[torch.linspace(-1, 1, 401)] * 2, indexing="ij"), -1)
    x = grid.reshape(-1, 2)
    values = runner.target.graph.forward(x, all_values=True)
    pre = values[runner.target.layout.pres[0]]
    pattern = (pre[:, ambiguous] >= 0).to(torch.int8) * 2 - 1
    split = pattern[0]  # the activation pattern of one corner: a non-empty domain
    inside = (pattern == split).all(dim=1)
    splits = roots.splits.clone()
    splits[0, ambiguous] = split
    domain = ReluDomains(splits, roots.alpha, roots.beta, roots.poly, roots.rows, roots.margin,
                         roots.depth, roots.stall)  # fmt: skip
    bounded, _ = runner.bounder.easy.bound(domain, iterations=400)
    truth = float(values[runner.target.graph.output.name][inside, 0].min())
    assert bounded.rows[0, 0] <= truth + 1e-5
    assert bounded.rows[0, 0] >= truth - 0.02 * (1 + abs(truth))


def test_children_start_at_their_parents_bound_where_the_lower_line_was_used():
    """`_with_split`'s multipliers reproduce the parent's functional for a neuron whose
    coefficient is >= 0 (lower line, no intercept): both children's one-pass bounds equal the
    parent's."""
    net = mlp([4, 16, 16, 2], 2)
    region = Region(-np.ones(4), np.ones(4), (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),))
    runner = ReluBab(net, region, RELU)
    parent = random_domains(runner, 1, depth=3, seed=2)
    parent = runner.bounder.easy.bound(parent, iterations=10)[0]
    C = runner.spec.C[runner.target.rows_of[parent.poly]]
    before = runner.bounder.easy.one_pass(parent.splits, parent.alpha, parent.beta, C).lower
    lam = runner.bounder.easy.coefficients(parent)
    flat = runner.bounder.easy.flat_intervals(parent.splits)
    usable = branchable(flat.lower, flat.upper, parent.splits)[0] & (lam[0, 0] > 0)
    assert usable.any()
    for neuron in usable.nonzero().flatten()[:5]:
        children = runner.brancher.split(parent, neuron.reshape(1), lam)
        C2 = runner.spec.C[runner.target.rows_of[children.poly]]
        after = runner.bounder.easy.one_pass(
            children.splits, children.alpha, children.beta, C2
        ).lower
        assert torch.allclose(after, before.expand_as(after), atol=1e-5), (neuron, after, before)


@pytest.mark.parametrize("branching", RELU_BRANCHINGS.names())
def test_both_branchings_prove_an_unsat_case(branching, monkeypatch):
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)
    net, box, row, minimum = milp_case(3)
    poly = Polytope(row[None], np.array([minimum - 0.01 * (1 + abs(minimum))]))
    prop = VnnlibProperty(
        "<milp>", len(box.lower), len(row), (Region(box.lower, box.upper, (poly,)),)
    )
    config = BabConfig(splitting="relu", relu=ReluSplitConfig(branching=branching))
    result = verify.verify(net, prop, timeout=10, config=config)
    assert result.status == "unsat" and result.stats["regions"][0]["domains"] > 3


def test_cli_accepts_the_splitting_mode():
    args = build_parser().parse_args(["run", "n.onnx", "p.vnnlib", "--timeout", "1",
                                      "--splitting", "relu"])  # fmt: skip
    assert args.splitting == "relu"
    assert build_parser().parse_args(["run", "n", "p", "--timeout", "1"]).splitting == "auto"


def test_babsr_scores_only_ambiguous_free_neurons():
    lower = torch.tensor([[-1.0, 0.5, -2.0, -1.0]])
    upper = torch.tensor([[1.0, 1.0, -0.5, 3.0]])
    splits = torch.tensor([[0, 0, 0, 1]], dtype=torch.int8)
    mask = branchable(lower, upper, splits)
    assert mask.tolist() == [[True, False, False, False]]
    lam = torch.tensor([[-2.0, 1.0, 1.0, 1.0]])
    score, gain = babsr_scores(lam, lower, upper, torch.zeros(4), mask)
    # intercept gain: min(lam, 0) u l / (u - l) = -2 * (1 * -1) / 2 = 1
    assert gain[0, 0] == pytest.approx(1.0) and score[0, 0] == pytest.approx(1.0)
    assert torch.isinf(score[0, 1:]).all()


def _chord_scores(lam, lower, upper, bias, a, c):
    """BaBSR for `f = a x (x < 0), c x (x > 0)` computed from its chord, neuron by neuron."""
    scores, gains = [], []
    for lm, l, u, b, ai, ci in zip(lam, lower, upper, bias, a, c):
        s = (ci * u - ai * l) / (u - l)  # the chord through (l, a l) and (u, c u)
        intercept = ai * l - s * l
        gain = -min(lm * intercept, 0.0)  # the chord is used where it bounds on lam's side
        worse = min(lm * b * (ci - s), lm * b * (ai - s))
        scores.append(abs(gain + worse))
        gains.append(gain)
    return scores, gains


@pytest.mark.parametrize("a, c", [(0.0, 1.0), (0.1, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_babsr_scores_use_the_activations_own_slopes(a, c):
    """ReLU (0, 1), LeakyReLU (0.1, 1), a concave LeakyReLU of slope 2 and Abs (-1, 1): the
    scores are those of each function's chord (computed neuron by neuron), and ReLU's are the
    default."""
    gen = torch.Generator().manual_seed(0)
    lower = -torch.rand(1, 6, generator=gen, dtype=D) - 0.1
    upper = torch.rand(1, 6, generator=gen, dtype=D) + 0.1
    lam = torch.randn(1, 6, generator=gen, dtype=D)
    bias = torch.randn(6, generator=gen, dtype=D)
    mask = torch.ones(1, 6, dtype=torch.bool)
    slopes = (torch.full((6,), a, dtype=D), torch.full((6,), c, dtype=D))
    score, gain = babsr_scores(lam, lower, upper, bias, mask, slopes)
    want_score, want_gain = _chord_scores(*(t.flatten().tolist() for t in (lam, lower, upper)),
                                          bias.tolist(), [a] * 6, [c] * 6)  # fmt: skip
    assert score[0].tolist() == pytest.approx(want_score, abs=1e-12)
    assert gain[0].tolist() == pytest.approx(want_gain, abs=1e-12)
    if (a, c) == (0.0, 1.0):
        default = babsr_scores(lam, lower, upper, bias, mask)
        assert torch.equal(default[0], score) and torch.equal(default[1], gain)


def test_side_slopes_read_each_activation():
    """Per-neuron slopes below and above 0 for ReLU, LeakyReLU and per-channel PReLU."""
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2), nn.LeakyReLU(0.2),
                        nn.Linear(2, 2), nn.PReLU(2)).double()  # fmt: skip
    with torch.no_grad():
        net[5].weight.copy_(torch.tensor([0.3, 1.5]))
    graph = network_graph(net, (2,))
    layout = Layout.of(graph, graph.split_pairs())
    below, above = side_slopes(graph, layout, torch.zeros(1, dtype=D))
    assert below.tolist() == pytest.approx([0, 0, 0, 0.2, 0.2, 0.3, 1.5])
    assert above.tolist() == pytest.approx([1.0] * 7)


def barely_violated(net: nn.Module, n_in: int, seed: int) -> Region:
    """`y_0 - y_1 <= b` with `b` 0.01 above the minimum of 20000 samples: violated."""
    x = torch.rand(20_000, n_in, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    with torch.no_grad():
        y = net(x)
    row = np.array([[1.0, -1.0]])
    value = float((y[:, 0] - y[:, 1]).min()) + 0.01
    return Region(-np.ones(n_in), np.ones(n_in), (Polytope(row, np.array([value])),))


def test_pruning_alone_never_proves_a_violated_region(monkeypatch):
    monkeypatch.setattr(ReluBab, "_try_points", lambda self, points: None)
    monkeypatch.setattr(ReluBab, "_attack", lambda self, children: None)
    for seed in range(4):
        net = mlp([3, 16, 16, 2], seed)
        region = barely_violated(net, 3, seed)
        outcome = solve_region(net, region, time.monotonic() + 0.5, RELU)
        assert outcome.status in ("timeout", "unknown"), (seed, outcome.stats)


def hard_instance() -> tuple[nn.Module, VnnlibProperty]:
    net = mlp([12, 64, 64, 64, 2], 7)
    region = barely_violated(net, 12, 0)
    shifted = Polytope(region.unsafe[0].A, region.unsafe[0].b - 0.3)
    return net, VnnlibProperty("<hard>", 12, 2, (Region(region.lower, region.upper, (shifted,)),))


def test_time_limit_is_honoured():
    net, prop = hard_instance()
    for timeout in (0.5, 2.0):
        start = time.monotonic()
        result = verify.verify(net, prop, timeout=timeout, splitting="relu")
        elapsed = time.monotonic() - start
        assert elapsed < timeout + 0.5, (timeout, elapsed, result.status)


def test_deadline_is_checked_between_chunks():
    net, prop = hard_instance()
    runner = ReluBab(net, prop.regions[0], RELU)
    domains = random_domains(runner, 4, depth=1, seed=0)
    runner.deadline = time.monotonic() - 1
    with pytest.raises(DeadlineReachedError):
        runner.bounder.easy.bound(domains, iterations=5)


def test_out_of_memory_halves_the_batch(monkeypatch):
    net = mlp([3, 12, 12, 2], 0)
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),))
    runner = ReluBab(net, region, BabConfig(splitting="relu", batch_size=64, max_batch=64))
    domains = random_domains(runner, 40, depth=2, seed=1)
    want, _ = runner.bounder.easy.bound(domains, iterations=0)
    real, sizes = ReluBounder.bound_chunk, []

    def limited(self, chunk, iterations):
        sizes.append(len(chunk))
        if len(chunk) > 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, chunk, iterations)

    monkeypatch.setattr(ReluBounder, "bound_chunk", limited)
    got, _ = runner.bounder.easy.bound(domains, iterations=0)
    assert torch.allclose(got.rows, want.rows)
    assert sizes[0] == 40 and runner.sizer.size == 8 and max(sizes[-3:]) <= 8


def test_splitting_mode_follows_the_input_size_unless_forced():
    small, large = mlp([5, 8, 2], 0), mlp([40, 8, 2], 0)
    poly = (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),)
    r5, r40 = (Region(-np.ones(n), np.ones(n), poly) for n in (5, 40))
    assert splitting_mode(small, r5, BabConfig()) == "input"
    assert splitting_mode(large, r40, BabConfig()) == "relu"
    assert splitting_mode(large, r40, BabConfig(splitting="input")) == "input"
    assert splitting_mode(small, r5, BabConfig(splitting="relu")) == "relu"
    with pytest.raises(ValueError, match="splitting"):
        BabConfig(splitting="neurons")


def test_counterexamples_are_validated():
    net = mlp([6, 16, 16, 2], 5)
    region = barely_violated(net, 6, 1)
    prop = VnnlibProperty("<sat>", 6, 2, (region,))
    result = verify.verify(net, prop, timeout=10, splitting="relu")
    assert result.status == "sat"
    x, y = result.counterexample
    spec = UnsafeSpec.of(region, torch.float64)
    assert float(violation(y[None], spec)[0]) <= 0
    assert (x >= torch.tensor(region.lower)).all() and (x <= torch.tensor(region.upper)).all()


PROX = ReluSplitConfig(prox_iterations=40)
ACTIVE_SET = ReluSplitConfig(prox_iterations=60, hard_bounder="active-set")


def _stage_on_split_domains(seed: int, relu: ReluSplitConfig, dtype=torch.float64):
    """The open-domain stage (`relu.hard_bounder`) on 8 random split domains of a small net:
    asserts its bound is never above a sampled point that satisfies a domain's splits and at
    least CROWN's at the domain's slopes (its start), and that the solver moved; returns
    `(runner, domains, bound [N], bound64 [N, r] or None)`."""
    net = mlp([3, 12, 12, 2], seed).to(dtype)
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),))
    runner = ReluBab(net, region, BabConfig(splitting="relu", relu=relu))
    domains = random_domains(runner, 8, depth=3, seed=seed)
    tol = 1e-9 if dtype == torch.float64 else 1e-5  # float32: the start's own rounding
    bound, bound64, _ = runner.bounder.hard.bound_rows(domains)
    bound = bound[:, 0]
    x = torch.rand(100_000, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    graph64 = runner.target.graph.to(torch.float64)
    values = graph64.forward(x * 2 - 1, all_values=True)
    pre = torch.cat([values[p].flatten(1) for p in runner.target.layout.pres], dim=1)
    C, b = runner.spec.C.double(), runner.spec.b.double()
    y = (values[graph64.output.name] @ C.T - b)[:, 0]
    for i in range(len(domains)):
        inside = ((pre * domains.splits[i].double()) >= 0).all(dim=1)
        if inside.any():
            assert y[inside].min() >= float(bound[i]) - tol, i
    Cs = runner.spec.C[None].expand(len(domains), -1, -1)
    one_pass = runner.bounder.easy.one_pass(
        domains.splits, domains.alpha, torch.zeros_like(domains.beta), Cs
    )
    start = one_pass.lower[:, 0] - runner.spec.b[0]
    assert (bound >= start - tol).all()
    assert (bound > start + 1e-6).any()  # the solver moved
    return runner, domains, bound, bound64


@pytest.mark.parametrize("seed", range(2))
def test_prox_bounds_of_split_domains_are_sound_and_below_the_lp(seed):
    """The proximal stage's bound on a split domain: sound and at least its start (see
    `_stage_on_split_domains`), and never above the Planet LP (float64) over the same clamped
    intervals."""
    runner, domains, prox, _ = _stage_on_split_domains(seed, PROX)
    C = runner.spec.C[None].expand(len(domains), -1, -1)
    intervals = runner.bounder.easy.intervals(domains.splits)
    lp = verify.bounds(
        runner.target.graph, lower=runner.target.box.lower.expand(len(domains), 3),
        upper=runner.target.box.upper.expand(len(domains), 3), C=C, method="lp", node_bounds=intervals,
    ).lower[:, 0] - runner.spec.b[0]  # fmt: skip
    assert (prox <= lp + 1e-7).all(), (prox, lp)


@pytest.mark.parametrize("seed", range(2))
def test_active_set_bounds_of_split_domains_are_sound_and_at_least_their_start(seed):
    """The active-set stage's bound on a split domain: sound and at least its start (see
    `_stage_on_split_domains`); on a float32 net, the float64 value of its duals (the one that
    closes domains) agrees with the float32 bound."""
    _stage_on_split_domains(seed, ACTIVE_SET)
    _, _, bound, bound64 = _stage_on_split_domains(seed, ACTIVE_SET, torch.float32)
    assert bound64 is not None
    torch.testing.assert_close(bound64[:, 0], bound.double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stage", [PROX, ACTIVE_SET], ids=["prox", "active-set"])
@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.parametrize("truth", ["sat", "unsat"])
def test_with_the_open_domain_stage_agrees_with_the_exact_milp(stage, seed, truth, monkeypatch):
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)
    net, prop = milp_property(seed, truth)
    config = BabConfig(splitting="relu", relu=stage)
    result = verify.verify(net, prop, timeout=20, config=config)
    assert result.status == truth, (seed, result.status, truth, result.stats)
    if truth == "unsat":
        assert result.stats["regions"][0].get("prox_domains", 0) > 0


def test_an_unknown_hard_bounder_is_refused():
    with pytest.raises(ValueError, match="hard_bounder"):
        ReluSplitConfig(hard_bounder="gurobi")
