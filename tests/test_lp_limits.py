"""The LP and MILP honour a seconds budget: solves left when it runs out keep the output's
interval bound, which is sound; without a budget every solve finishes."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import verify
from tests.soundness import assert_contains, box_samples, spec_values

pytest.importorskip("cvxpy")
D = torch.float64


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(20, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10)
    ).double()


@pytest.mark.parametrize("method", ["lp", "milp"])
def test_budget_holds_and_the_fallback_is_sound(method):
    net = _net()
    x = torch.rand(3, 20, dtype=D, generator=torch.Generator().manual_seed(0))
    start = time.monotonic()
    result = verify.bounds(net, 0.3, x=x, method=method, budget=2.0)
    took = time.monotonic() - start
    assert took < 2.0 * 1.05 + 1.0
    assert result.stats["unsolved"] > 0  # the budget did cut the solves short
    points = box_samples(x - 0.3, x + 0.3, 2000)
    values = spec_values(net, points, torch.eye(10, dtype=D).expand(3, 10, 10))
    assert_contains(result.lower, result.upper, values)


def test_without_a_budget_every_solve_finishes():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).double()
    result = verify.bounds(net, 0.2, x=torch.zeros(1, 3, dtype=D), method="lp")
    assert result.stats["unsolved"] == 0 and result.stats["solves"] == 4


def test_milp_with_a_pre_activation_fixed_at_zero():
    """A neuron whose pre-activation interval is exactly [0, 0] (zero weights and bias) made the
    old big-M encoding infeasible (z >= 1 from lo >= 0, z <= 0 from up > 0 false); big-M now
    forces z = 1 there, and the pieces encoding takes the line of a piece that covers [0, 0]."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
        net[0].bias.zero_()
        net[2].weight.fill_(1.0)
        net[2].bias.zero_()
    x = torch.zeros(1, 2, dtype=D)
    result = verify.bounds(net, 0.5, x=x, method="milp", intermediate="ibp")
    # y = relu(x0 - x1) on [-0.5, 0.5]^2: from 0 to 1
    torch.testing.assert_close(result.lower, torch.zeros(1, 1, dtype=D), atol=1e-5, rtol=0)
    torch.testing.assert_close(result.upper, torch.ones(1, 1, dtype=D), atol=1e-5, rtol=0)
