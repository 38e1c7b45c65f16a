"""The branch-and-bound roles (`verify/bab/protocols.py`): the stratified ReLU bounder and its
hard-subtree predictor, the pure beta-CROWN step and the domain batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bounds.methods import beta_crown
from tests.test_relu_bab import assert_relu_bab_agrees_with_milp, mlp, random_domains
from verify.bab import BabConfig, ReluBab, ReluDomains, ReluSplitConfig
from verify.bab.relu.stratified import HardBounder, StratifiedBounder
from verify.cli.main import build_parser
from verify.cli.options import bab_config
from verify.property import Polytope, Region

STRATIFIED = ReluSplitConfig(
    prox_iterations=60, hard_bounder="active-set", hard_stall=1, stall_gain=0.5
)


def small_runner(relu: ReluSplitConfig, seed: int = 0) -> ReluBab:
    net = mlp([3, 12, 12, 2], seed).double()
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),))
    return ReluBab(net, region, BabConfig(splitting="relu", relu=relu))


def with_margins(d: ReluDomains, margin: list[float], stall: list[int]) -> ReluDomains:
    m = torch.tensor(margin, dtype=d.margin.dtype)
    s = torch.tensor(stall, dtype=d.stall.dtype)
    return ReluDomains(d.splits, d.alpha, d.beta, d.poly, d.rows, m, d.depth, s)


def test_stall_counts_little_improvement_in_a_row():
    """A child whose margin rose by less than `stall_gain * |parent margin|` stalls once more;
    a larger rise resets the count."""
    runner = small_runner(ReluSplitConfig(stall_gain=0.05))
    parents = with_margins(random_domains(runner, 4, 2, 0), [-1.0] * 4, [0, 1, 2, 0])
    new = torch.tensor([-0.99, -0.5, -1.2, -0.96], dtype=parents.margin.dtype)
    assert runner.bounder.easy._stall(parents, new).tolist() == [1, 0, 3, 1]


def test_the_hard_predictor_needs_depth_and_stalls():
    runner = small_runner(ReluSplitConfig(prox_iterations=5, hard_stall=2, prox_min_depth=3))
    d = random_domains(runner, 4, 2, 0)
    depth = torch.tensor([3, 3, 2, 5])
    d = ReluDomains(d.splits, d.alpha, d.beta, d.poly, d.rows, d.margin, depth,
                    torch.tensor([2, 1, 4, 3]))  # fmt: skip
    assert runner.bounder.hard.hard(d).tolist() == [True, False, False, True]


def test_every_domain_is_hard_without_the_stall_rule():
    runner = small_runner(ReluSplitConfig(prox_iterations=5))
    d = random_domains(runner, 3, 2, 0)
    assert runner.bounder.hard.hard(d).all()


def test_the_stratified_bounder_rebounds_only_open_hard_domains():
    """Only the domains alpha-beta-CROWN leaves open and the predictor calls hard go to the
    hard bounder; its bounds never fall below alpha-beta-CROWN's."""
    runner = small_runner(ReluSplitConfig(prox_iterations=30, hard_bounder="active-set",
                                          hard_stall=1, stall_gain=1e9))  # fmt: skip
    bounder = runner.bounder
    assert isinstance(bounder, StratifiedBounder) and isinstance(bounder.hard, HardBounder)
    d = random_domains(runner, 8, 3, 1)
    stall = torch.tensor([0, 1] * 4)  # stall_gain 1e9: bounding adds one to every count
    d = ReluDomains(d.splits, d.alpha, d.beta, d.poly, d.rows, d.margin, d.depth, stall)
    easy, _ = bounder.easy.bound(d)
    mixed, _ = bounder.bound(d)
    want = int(((easy.margin <= 0) & (easy.stall >= 1)).sum())
    assert runner.stats.get("prox_domains", 0) == want > 0
    assert (mixed.rows >= easy.rows).all()
    untouched = easy.margin > 0
    assert torch.equal(mixed.rows[untouched], easy.rows[untouched])


@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.parametrize("truth", ["sat", "unsat"])
def test_stratified_branch_and_bound_agrees_with_the_exact_milp(seed, truth, monkeypatch):
    assert_relu_bab_agrees_with_milp(seed, truth, STRATIFIED, monkeypatch)


def test_bad_stratification_settings_are_refused():
    with pytest.raises(ValueError, match="iteration counts"):
        ReluSplitConfig(hard_stall=-1)
    with pytest.raises(ValueError, match="stall_gain"):
        ReluSplitConfig(stall_gain=float("nan"))


def test_beta_step_is_pure_and_ascends():
    """`beta_step` leaves its state untouched, gives the same result twice, and its bound
    after a few steps is at least the start's."""
    runner = small_runner(ReluSplitConfig())
    d = random_domains(runner, 4, 2, 2)
    easy, t = runner.bounder.easy, runner.target
    layout = t.layout
    rows = t.rows_of[d.poly]
    p = beta_crown.SplitProblem(
        t.graph, t.box, t.spec.C[rows], easy.intervals(d.splits),
        layout.views(d.splits, layout.pres), layout.acts, layout.acts,
    )  # fmt: skip
    params = (
        *layout.views(d.alpha, layout.acts).values(),
        *layout.views(d.beta, layout.acts).values(),
    )
    zeros = tuple(torch.zeros_like(x) for x in params)
    best = torch.full(rows.shape, -torch.inf, dtype=torch.float64)
    state = beta_crown.SplitState(params, zeros, zeros, torch.zeros((), dtype=torch.float64),
                                  best, ())  # fmt: skip
    copies = [x.clone() for x in state.params]
    lrs = tuple(torch.tensor(0.1, dtype=torch.float64) for _ in params)
    one, pass_one = beta_crown.beta_step(p, state, lrs)
    two, pass_two = beta_crown.beta_step(p, state, lrs)
    assert all(torch.equal(a, b) for a, b in zip(state.params, copies))
    assert all(torch.equal(a, b) for a, b in zip(one.params, two.params))
    assert torch.equal(pass_one.lower, pass_two.lower) and int(one.t) == 1
    for _ in range(10):
        one, _ = beta_crown.beta_step(p, one, lrs)
    assert (one.best >= pass_two.lower - 1e-12).all()


def test_domain_batches_put_replaces_rows():
    runner = small_runner(ReluSplitConfig())
    d = random_domains(runner, 5, 1, 0)
    other = with_margins(d.take(torch.tensor([0, 1])), [7.0, 8.0], [3, 4])
    before = d.margin.clone()
    out = d.put(torch.tensor([3, 1]), other)
    assert out.margin[3] == 7.0 and out.margin[1] == 8.0 and out.stall[1] == 4
    assert torch.equal(out.margin[[0, 2, 4]], d.margin[[0, 2, 4]])
    assert torch.equal(d.margin, before)  # the original is unchanged


def test_the_cli_passes_the_stall_rule_to_the_search():
    args = build_parser().parse_args(["run", "n.onnx", "p.vnnlib", "--timeout", "1",
                                      "--prox-sweeps", "7", "--hard-stall", "3"])  # fmt: skip
    relu = bab_config(args).relu
    assert (relu.prox_iterations, relu.hard_stall) == (7, 3)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "n", "p", "--timeout", "1", "--hard-stall", "-1"])
