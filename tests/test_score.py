"""`benchmarks/score.py`: the competition's points and its counterexample check."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from benchmarks.score import CORRECT, WRONG, check_counterexample, grade, parse_assignment, score
from verify.property import Polytope, Region, VnnlibProperty


def test_points_per_verdict():
    assert grade("unsat", "unsat") == ("correct", CORRECT)
    assert grade("sat", "sat") == ("correct", CORRECT)
    assert grade("unsat", "sat") == ("wrong", WRONG)
    assert grade("sat", "unsat", counterexample_ok=False) == ("wrong", WRONG)
    assert grade("sat", "unsat", counterexample_ok=True) == ("correct", CORRECT)
    assert grade("timeout", "unsat") == ("unanswered", 0)
    assert grade("unsat", "timeout") == ("extra_unsat", 0)
    assert grade("sat", "timeout") == ("extra_sat", CORRECT)
    truth = {("n", "a"): "unsat", ("n", "b"): "sat", ("n", "c"): "timeout"}
    ours = {("n", "a"): "unsat", ("n", "b"): "unsat", ("n", "c"): "unsat"}
    got = score(ours, truth)
    assert got["score"] == CORRECT + WRONG and got["winner_score"] == 2 * CORRECT
    assert (got["correct"], got["wrong"], got["extra_unsat"]) == (1, 1, 1)


def test_counterexample_check_at_the_competitions_tolerance():
    net = nn.Sequential(nn.Linear(2, 1)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
        net[0].bias.zero_()
    region = Region(np.zeros(2), np.ones(2), (Polytope(np.array([[-1.0]]), np.array([-2.5])),))
    prop = VnnlibProperty("p", 2, 1, (region,))
    x, y = parse_assignment("sat\n((X_0 0.9)\n (X_1 0.9)\n (Y_0 2.7))\n")
    assert x.tolist() == [0.9, 0.9] and check_counterexample(net, prop, x, y)
    assert not check_counterexample(net, prop, x, y + 0.01)  # the stated output is off
    assert not check_counterexample(net, prop, np.array([0.1, 0.1]), np.array([0.3]))  # safe
    assert not check_counterexample(net, prop, np.array([1.1, 0.9]), np.array([2.9]))  # outside
