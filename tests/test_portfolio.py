"""The portfolio of input and ReLU splitting (`verify.bab.portfolio`): answers that agree with
the exact MILP, never "unsat" on a violated region, the time limit, the probe (the favoured
search alone), the shares from measured progress, a search that gives up, a turn that ends on
a predicted deadline without losing domains."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import verify
from tests.test_relu_bab import barely_violated, hard_instance, milp_property, mlp
from verify.bab import BabConfig, PortfolioConfig, RegionBab, ReluBab, solve_region
from verify.bab.common import DeadlineReachedError, RegionOutcome
from verify.bab.input.domains import Domains
from verify.bab.portfolio import Lane, Portfolio, open_mass
from verify.property import Polytope, Region


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("truth", ["sat", "unsat"])
def test_answers_agree_with_the_milp(seed, truth):
    net, prop = milp_property(seed, truth)
    outcome = solve_region(net, prop.regions[0], time.monotonic() + 20.0, BabConfig())
    assert outcome.status == truth, outcome.stats
    assert set(outcome.stats["portfolio"]) == {"input", "relu"}


def test_pruning_alone_never_proves_a_violated_region(monkeypatch):
    for cls in (RegionBab, ReluBab):
        monkeypatch.setattr(cls, "_try_points", lambda self, points: None)
        monkeypatch.setattr(cls, "_attack", lambda self, children: None)
    for seed in range(4):
        net = mlp([3, 16, 16, 2], seed)
        region = barely_violated(net, 3, seed)
        outcome = solve_region(net, region, time.monotonic() + 0.6, BabConfig())
        assert outcome.status in ("timeout", "unknown"), (seed, outcome.stats)


def test_time_limit_is_honoured():
    net, prop = hard_instance()
    for timeout in (0.5, 2.0, 4.0):
        start = time.monotonic()
        result = verify.verify(net, prop, timeout=timeout)
        elapsed = time.monotonic() - start
        assert result.status == "timeout"
        assert elapsed < timeout + 0.5, (timeout, elapsed)


def test_the_favoured_search_runs_alone_during_the_probe():
    net, prop = milp_property(1, "unsat")  # 5 inputs: input splitting is favoured
    outcome = solve_region(net, prop.regions[0], time.monotonic() + 30.0, BabConfig())
    lanes = outcome.stats["portfolio"]
    assert outcome.status == "unsat" and lanes["input"]["seconds"] < 3.0, lanes
    assert lanes["relu"] == {"seconds": 0.0, "closed": 0.0, "ended": None}


def test_after_the_probe_both_run_and_the_deadline_holds():
    net, prop = hard_instance()  # 12 inputs: input splitting favoured
    start = time.monotonic()
    outcome = solve_region(net, prop.regions[0], start + 3.0, BabConfig())
    assert time.monotonic() - start < 3.5
    lanes = outcome.stats["portfolio"]
    assert outcome.status == "timeout"
    assert lanes["input"]["seconds"] > 0.3 and lanes["relu"]["seconds"] > 0.1, lanes


class FakeLane(Lane):
    def __init__(self, name: str, prior: float, seconds: float, depths: list[int]) -> None:
        super().__init__(name, None, prior)  # type: ignore[arg-type]
        self.seconds, self.root_mass = seconds, 1.0
        depth = torch.tensor(depths)
        empty = torch.zeros(len(depths), 1)
        self.open_ = Domains(empty, empty, empty, torch.zeros(len(depths)), depth)


def test_shares_follow_the_measured_progress():
    config = PortfolioConfig()
    # input: half of its tree closed in 1 s; relu: a quarter closed in 1 s
    fast, slow = FakeLane("input", 0.9, 1.0, [2, 2]), FakeLane("relu", 0.1, 1.0, [2, 2, 2])
    assert open_mass(fast.open_) == 0.5 and fast.closed() == 0.5 and slow.closed() == 0.25
    shares = Portfolio([fast, slow], config, True).shares(total=5.0)
    # predicted speeds 0.5 / 0.5 = 1 and 0.25 / 0.75 = 1/3: shares 3/4 and 1/4
    assert shares["input"] == pytest.approx(0.75) and shares["relu"] == pytest.approx(0.25)
    # before each has run a probe's time (10% of 20 s), the priors
    assert Portfolio([fast, slow], config, True).shares(total=20.0) == {"input": 0.9, "relu": 0.1}
    # a search that has closed nothing gets the floor
    stuck = FakeLane("relu", 0.1, 1.0, [0])
    shares = Portfolio([fast, stuck], config, True).shares(total=5.0)
    assert shares["relu"] == pytest.approx(config.floor / (1 + config.floor))
    # neither has closed anything: the priors
    idle = FakeLane("input", 0.9, 1.0, [0])
    assert Portfolio([idle, stuck], config, True).shares(total=5.0) == {"input": 0.9, "relu": 0.1}


def test_a_search_that_gives_up_leaves_the_other(monkeypatch):
    monkeypatch.setattr(RegionBab, "too_many", lambda self, open_: True)
    net, prop = milp_property(2, "unsat")  # 4 inputs: input splitting, favoured, gives up
    outcome = solve_region(net, prop.regions[0], time.monotonic() + 20.0, BabConfig())
    lanes = outcome.stats["portfolio"]
    assert outcome.status == "unsat" and lanes["input"]["ended"] == "unknown", lanes


def test_both_giving_up_is_unknown(monkeypatch):
    for cls in (RegionBab, ReluBab):
        monkeypatch.setattr(cls, "too_many", lambda self, open_: True)
    net, prop = hard_instance()
    outcome = solve_region(net, prop.regions[0], time.monotonic() + 10.0, BabConfig())
    assert outcome.status == "unknown", outcome.stats["portfolio"]


def test_a_step_predicted_past_the_deadline_ends_the_search_in_time(monkeypatch):
    net, prop = hard_instance()
    search = RegionBab(net, prop.regions[0], BabConfig(splitting="input"))
    lane = Lane("input", search, 0.9)
    assert lane.turn(time.monotonic() + 5.0) is None and len(lane.open_) > 0
    monkeypatch.setattr(RegionBab, "step", lambda self, open_: (_ for _ in ()).throw(
        DeadlineReachedError()))  # fmt: skip
    assert lane.turn(time.monotonic() + 5.0).status == "timeout" == lane.ended.status


def test_the_second_search_starts_once_the_first_is_predicted_late():
    config = PortfolioConfig()
    second = FakeLane("relu", 0.1, 0.0, [0])
    second.open_ = None
    on_track = FakeLane("input", 0.9, 2.0, [2])  # 3/4 closed in 2 s: 2/3 s to go
    late = FakeLane("input", 0.9, 2.0, [0, 1])  # open mass 1.5: nothing closed
    now = time.monotonic()
    assert Portfolio([on_track, second], config, True).second_waits(on_track, 10.0, now + 5)
    assert not Portfolio([late, second], config, True).second_waits(late, 10.0, now + 5)
    # during the probe (10% of 40 s), the first runs alone whatever its prediction
    assert Portfolio([late, second], config, True).second_waits(late, 40.0, now + 5)
    assert on_track.eta() == pytest.approx(2.0 / 3.0) and late.eta() == float("inf")


def test_networks_beyond_relu_split_inputs_alone():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 2))
    poly = Polytope(np.array([[1.0, -1.0]]), np.array([-100.0]))
    region = Region(-np.ones(3), np.ones(3), (poly,))
    outcome = solve_region(net.eval(), region, time.monotonic() + 5.0, BabConfig())
    assert outcome.status == "unsat" and "portfolio" not in outcome.stats


def test_config_is_checked():
    with pytest.raises(ValueError, match="probe"):
        PortfolioConfig(probe=0.0)
    with pytest.raises(ValueError, match="prior"):
        PortfolioConfig(prior=0.2)


def test_the_second_search_starts_only_if_its_root_fits():
    config = PortfolioConfig()
    second = FakeLane("relu", 0.1, 0.0, [0])
    second.open_ = None
    first = FakeLane("input", 0.9, 6.0, [0])  # nothing closed: predicted late
    first.root_seconds = 5.0
    portfolio = Portfolio([first, second], config, True)
    now = time.monotonic()
    # probe: 10% of 20 s = 2 s; the root needs 5 s + 2 s
    assert portfolio.second_waits(first, 20.0, now + 6.0)
    assert not portfolio.second_waits(first, 20.0, now + 8.0)
    # the favoured search has ended and too little time is left: nothing runs
    first.ended = RegionOutcome("unknown")
    assert portfolio._next([second], 20.0, now + 6.0) is None
    assert portfolio._next([second], 20.0, now + 8.0) is second
