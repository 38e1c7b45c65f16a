"""Warm starts of the active-set hard bounder from the parent's Anderson duals and cuts
(`verify.bab.relu.hard_bounder`, `verify.bab.relu.warm`): batch surgery of the duals and cuts, the
store, the children's bounds (never below the parent's duals' or the slopes' start on the
child's relaxation, and sound on sampled points of the child), the domain bookkeeping through
chunking and out-of-memory retries, and branch and bound against the exact MILP."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import verify
import verify.verifier as verifier
from bounds.dual.active_set import ActiveSetConfig, big_m_from_slopes, solve
from bounds.dual.anderson.cuts import no_cuts
from bounds.dual.anderson.evaluation import dual_value
from bounds.dual.anderson.problem import anderson_slopes, problem_from_graph, problem_from_layers
from bounds.methods.crown import crown_intervals, output_functional
from bounds.types import Interval
from tests.test_bab_stratified import small_runner
from tests.test_distributed import answer_of, sharded_in_process
from tests.test_relu_bab import milp_property, random_domains
from verify.bab import BabConfig, ReluSplitConfig
from verify.bab.relu.hard_bounder import AndersonStart, anderson_split_bounds
from verify.bab.relu.warm import WarmStarts, compact, nbytes
from verify.cli.main import build_parser
from verify.cli.options import bab_config
from verify.cli.suite import settings_of
from verify.distributed.searches import ReluShard

WARM = ReluSplitConfig(
    prox_iterations=60, hard_bounder="active-set", hard_stall=1, stall_gain=0.5,
    hard_warm_start=True,
)  # fmt: skip
COLD = dataclasses.replace(WARM, hard_warm_start=False)


# ----- Duals and Cuts: select, repeat, padded -----


def _solved(boxes: int = 3, specs: int = 2, seed: int = 0):
    """A 4-6-6-3 ReLU net, `boxes` input boxes and the active set's result on them."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6), torch.nn.ReLU(),
        torch.nn.Linear(6, 3),
    ).double()  # fmt: skip
    graph = verify.network_graph(net, (4,))
    x = torch.randn(boxes, 4, dtype=torch.float64)
    C = torch.randn(boxes, specs, 3, dtype=torch.float64)

    def problem(index: torch.Tensor):
        box = Interval(x[index] - 1, x[index] + 1)
        return problem_from_graph(graph, box, crown_intervals(graph, box),
                                  output_functional(graph, C[index]))  # fmt: skip

    p = problem(torch.arange(boxes))
    init = big_m_from_slopes(p, anderson_slopes(p, None))
    config = ActiveSetConfig(iterations=80, big_m_iterations=10, cut_frequency=10)
    return problem, p, solve(p, config, init)


def test_select_and_repeat_give_each_problem_its_own_duals_and_cuts():
    problem, p, result = _solved()
    assert sum(int(c.active.sum()) for c in result.cuts) > 0  # cuts to carry
    index = torch.tensor([2, 0, 2])
    duals, cuts = result.duals.select(index), tuple(c.select(index) for c in result.cuts)
    assert all(t.shape[0] == 3 for t in (*duals.flat(), *(t for c in cuts for t in c)))
    want = dual_value(p, result.cuts, result.duals)
    torch.testing.assert_close(dual_value(problem(index), cuts, duals), want[index])
    twice, twice_cuts = result.duals.repeat(2), tuple(c.repeat(2) for c in result.cuts)
    assert all(t.shape[0] == 6 for t in (*twice.flat(), *(t for c in twice_cuts for t in c)))
    pairs = torch.arange(3).repeat_interleave(2)
    torch.testing.assert_close(dual_value(problem(pairs), twice_cuts, twice), want[pairs])
    # a warm start from the selected duals returns their bound (no iteration)
    again = solve(problem(index), ActiveSetConfig(iterations=0), duals, cuts=cuts)
    torch.testing.assert_close(again.lower, result.lower[index], rtol=0, atol=1e-12)


def test_padding_adds_inactive_cuts_that_change_no_value():
    _, p, result = _solved()
    slots = tuple(c.rows.shape[2] + 5 for c in result.cuts)
    cuts = tuple(c.padded(s) for c, s in zip(result.cuts, slots))
    duals = result.duals.padded(slots)
    assert all(c.rows.shape[2] == s and not c.active[:, :, -5:].any() for c, s in zip(cuts, slots))
    torch.testing.assert_close(dual_value(p, cuts, duals), dual_value(p, result.cuts, result.duals))
    with pytest.raises(ValueError):
        result.cuts[0].padded(result.cuts[0].rows.shape[2] - 1)


# ----- the store -----


def _start(result) -> AndersonStart:
    given = torch.ones(result.lower.shape[0], dtype=torch.bool)
    return AndersonStart(result.duals, result.cuts, given)


def test_compaction_drops_only_cuts_without_multiplier():
    _, p, result = _solved()
    start = _start(result)
    small = compact(start)
    assert nbytes(small) <= nbytes(start)
    assert sum(c.rows.shape[2] for c in small.cuts) < sum(c.rows.shape[2] for c in start.cuts)
    torch.testing.assert_close(dual_value(p, small.cuts, small.duals),
                               dual_value(p, start.cuts, start.duals))  # fmt: skip
    capped = compact(start, max_cuts=1)
    assert all(c.rows.shape[2] <= 1 for c in capped.cuts)
    assert all((b >= 0).all() for b in capped.duals.flat())  # still a dual point


def test_the_store_returns_each_id_its_start_and_forgets_dead_ones():
    problem, p, result = _solved()
    store = WarmStarts(max_bytes=1e9)
    ids = store.add(_start(result))
    other = store.add(_start(result))  # a second block
    query = torch.tensor([ids[2], -1, other[0], ids[0], 10_000])
    got = store.get(query)
    assert got.given.tolist() == [True, False, True, True, False]
    want = dual_value(p, result.cuts, result.duals)
    found = torch.tensor([0, 2, 3])
    value = dual_value(problem(torch.tensor([2, 0, 0])), tuple(c.select(found) for c in got.cuts),
                       got.duals.select(found))  # fmt: skip
    torch.testing.assert_close(value, want[[2, 0, 0]])
    assert all(not c.active[1].any() and not c.active[4].any() for c in got.cuts)
    store.keep(torch.tensor([ids[1]]))
    assert len(store) == 1 and store.get(query) is None
    assert store.get(torch.tensor([ids[1]])).given.all()
    tiny = WarmStarts(max_bytes=1)  # over the cap: nothing kept, every domain starts cold
    assert tiny.get(tiny.add(_start(result))) is None


# ----- children of a branch-and-bound search -----


def _children(config: ReluSplitConfig, n: int = 6, seed: int = 0):
    """A search on a 3-12-12-2 net; `n` parents of depth 2 bounded by both stages (their duals
    stored), and their children (split on the brancher's choice, bounded by alpha-beta-CROWN)."""
    runner = small_runner(config, seed)
    easy, hard = runner.bounder.easy, runner.bounder.hard
    parents, _ = easy.bound(random_domains(runner, n, 2, seed))
    parents = hard.bound(parents)
    choice, lam = runner.brancher.choose(parents, easy)
    keep = (choice >= 0).nonzero().flatten()
    children = runner.brancher.split(parents.take(keep), choice[keep], lam[keep])
    children, _ = easy.bound(children)
    return runner, parents, children


def _inputs(runner, d):
    """What `HardBounder.bound_rows` gives the bounder for the domains `d`."""
    t, hard = runner.target, runner.bounder.hard
    rows = t.rows_of[d.poly]
    n = len(d)
    box = Interval(t.box.lower.expand(n, -1), t.box.upper.expand(n, -1))
    c = t.spec.C[rows].reshape(n, rows.shape[1], *t.graph.output.shape)
    views = t.layout.views(d.alpha, t.layout.acts)
    slopes = tuple(views[a] for a in t.layout.acts)
    return hard.layers, box, runner.bounder.easy.intervals(d.splits), c, slopes


@pytest.mark.parametrize("iterations", [1, 30])
def test_children_start_from_the_better_of_their_parents_duals_and_their_slopes(iterations):
    """On each child's relaxation (split-clamped intervals, the cuts' terms recomputed) the
    warm-started bound is at least the parent's duals' value and the slopes' start value;
    in this planted case the parent's duals beat the slopes on some children, by more than a
    one-iteration cold solve gains (so an ignored warm start fails the test)."""
    runner, parents, children = _children(WARM)
    store = runner.bounder.hard.starts
    assert (parents.warm >= 0).all()
    assert set(children.warm.tolist()) <= set(parents.warm.tolist())  # the parent's start
    start = store.get(children.warm)
    assert start.given.all()
    args = _inputs(runner, children)
    p = problem_from_layers(args[0], args[1], args[2], args[3])
    parent = dual_value(p, start.cuts, start.duals)
    slope = dual_value(p, tuple(no_cuts(p, k) for k in range(p.layers.hidden)),
                       big_m_from_slopes(p, anderson_slopes(p, dict(zip(args[0].act_names,
                                                                        args[4])))))  # fmt: skip
    warm = anderson_split_bounds(*args, iterations, warm=start)
    cold = anderson_split_bounds(*args, iterations)
    assert (warm.lower >= torch.maximum(parent, slope) - 1e-9).all()
    assert (cold.lower >= slope - 1e-9).all()
    assert warm.warm.any() and torch.equal(warm.warm, parent > slope)
    if iterations == 1:
        assert (parent > cold.lower + 1e-6).any()


@pytest.mark.parametrize("seed", range(3))
def test_warm_started_bounds_hold_on_sampled_points_of_the_children(seed):
    runner, _, children = _children(WARM, n=8, seed=seed)
    hard, t = runner.bounder.hard, runner.target
    values, _, ids = hard.bound_rows(children)
    assert runner.stats["hard_warm_used"] > 0 and (ids >= 0).all()
    x = torch.rand(100_000, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = x * 2 - 1
    out = t.graph.forward(x, all_values=True)
    pre = torch.cat([out[p].flatten(1) for p in t.layout.pres], dim=1)
    y = out[t.graph.output.name] @ runner.spec.C.T - runner.spec.b
    checked = 0
    for i in range(len(children)):
        inside = ((pre * children.splits[i].double()) >= 0).all(dim=1)
        if inside.any():
            checked += 1
            rows = t.rows_of[children.poly[i]]
            assert (y[inside][:, rows].amin(0) >= values[i] - 1e-7).all(), (seed, i)
    assert checked >= len(children) // 2


def test_the_ids_follow_their_domains_through_chunks_and_out_of_memory(monkeypatch):
    """Bounded in chunks of 2 with one out-of-memory retry, each domain's stored duals give its
    own bound on its own relaxation; take/put/cat carry the ids."""
    runner, _, children = _children(WARM, n=6)
    hard, t = runner.bounder.hard, runner.target
    low = children.rows.new_full(children.rows.shape, -1e9)  # rows = the hard bounds
    d = type(children)(children.splits, children.alpha, children.beta, children.poly, low,
                       children.margin, children.depth, children.stall, children.warm)  # fmt: skip
    t.sizer.size = 4
    calls, rows = [], hard.bound_rows

    def flaky(part):
        calls.append(len(part))
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (injected)")
        return rows(part)

    monkeypatch.setattr(hard, "bound_rows", flaky)
    bounded = hard.bound(d)
    assert calls[0] == 4 and set(calls[1:]) == {2} and t.sizer.size == 2
    assert len(set(bounded.warm.tolist())) == len(d) and (bounded.warm >= 0).all()
    args = _inputs(runner, bounded)
    p = problem_from_layers(args[0], args[1], args[2], args[3])
    start = hard.starts.get(bounded.warm)
    value = dual_value(p, start.cuts, start.duals) - t.spec.b[t.rows_of[bounded.poly]]
    torch.testing.assert_close(value, bounded.rows, rtol=0, atol=1e-9)
    index = torch.tensor([3, 0])
    mixed = type(d).cat([bounded.take(index), d]).put(torch.tensor([1]), bounded.take(index[:1]))
    assert mixed.warm[:3].tolist() == [bounded.warm[3], bounded.warm[3], d.warm[0]]


def test_a_step_drops_the_starts_of_closed_domains_and_shards_drop_the_ids():
    runner, _, children = _children(WARM, n=6)
    store = runner.bounder.hard.starts
    before = store.next_id
    runner.deadline = float("inf")
    open_, _ = runner.step(children)
    assert store.next_id > before and (open_.warm >= 0).any()
    assert all(torch.isin(block.ids, open_.warm).any() for block in store.blocks)
    assert store.get(open_.warm).given[open_.warm >= 0].all()
    shard = ReluShard(runner.net, runner.region, runner.config)
    assert (shard.receive(open_).warm == -1).all()


# ----- branch and bound -----


@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.parametrize("truth", ["sat", "unsat"])
def test_warm_started_branch_and_bound_agrees_with_the_exact_milp(seed, truth, monkeypatch):
    """The stratified active-set bounder with warm starts answers the MILP's answer; on the
    unsat cases some children start from their parent's duals."""
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)
    net, prop = milp_property(seed, truth)
    result = verify.verify(net, prop, timeout=30, config=BabConfig(splitting="relu", relu=WARM))
    assert result.status == truth, (seed, result.stats)
    stats = result.stats["regions"][0]
    if truth == "unsat":
        assert stats["hard_warm_used"] > 0, stats


def test_warm_started_shards_in_threads_give_the_exact_answer():
    net, prop = milp_property(1, "unsat")
    config = BabConfig(splitting="relu", relu=WARM)
    results, state = sharded_in_process(net, prop.regions[0], config, 2, 30.0)
    assert answer_of(results, state) == "unsat", (results, state)


def test_the_cli_switches_warm_starts():
    base = ["run", "n.onnx", "p.vnnlib", "--timeout", "1"]
    assert bab_config(build_parser().parse_args(base)).relu.hard_warm_start is True
    off = build_parser().parse_args([*base, "--no-hard-warm-start"])
    assert bab_config(off).relu.hard_warm_start is False
    assert small_runner(COLD).bounder.hard.starts is None
    with pytest.raises(ValueError, match="hard_warm_memory_gb"):
        ReluSplitConfig(hard_warm_memory_gb=0)


def test_run_all_over_ray_carries_the_warm_start_switch():
    base = ["run-all", "i.csv", "--out", "o.csv"]
    assert settings_of(build_parser().parse_args(base)).hard_warm_start is True
    off = settings_of(build_parser().parse_args([*base, "--no-hard-warm-start"]))
    assert off.hard_warm_start is False
