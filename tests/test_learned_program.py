"""examples/learned_program.py: the program network is max, every certified delta holds on
sampled inputs and the box's corners (float64, no tolerance), and a bug planted near a corner
is found there."""

from __future__ import annotations

import pytest
import torch

import verify
from tests.example_modules import load_example
from tests.soundness import box_samples

learned_program = load_example("learned_program")
D = torch.float64


@pytest.fixture(scope="module")
def net():
    net = learned_program.new_net(seed=1)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    learned_program.train(net, 600, opt, torch.Generator().manual_seed(1))
    return net


@pytest.fixture(scope="module")
def certified(net):
    samples = torch.rand(20_000, 4, generator=torch.Generator().manual_seed(2))
    return learned_program.smallest_delta(net, samples)


def inputs(n: int = 50_000) -> torch.Tensor:
    """`[n + 16, 4]` float64 points of [0, 1]^4: uniform, and the 16 corners."""
    return box_samples(torch.zeros(1, 4, dtype=D), torch.ones(1, 4, dtype=D), n, seed=3)[0]


def test_program_network_is_max():
    x = inputs(2000)
    torch.testing.assert_close(learned_program.MaxProgram()(x)[:, 0], x.max(1).values)
    ties = torch.tensor([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 0.0]], dtype=D)
    assert (learned_program.MaxProgram()(ties)[:, 0] == ties.max(1).values).all()


def test_certified_delta_holds_on_samples_and_corners(net, certified):
    assert certified.calls >= 1
    assert certified.witnessed <= certified.certified
    assert learned_program.errors(net, inputs()).max() < certified.certified
    worst = learned_program.errors(net, certified.worst[None]).item()
    assert worst == pytest.approx(certified.witnessed, rel=1e-12)
    assert certified.certified - certified.witnessed <= 0.011 * certified.certified


def test_grid_delta_holds_on_samples_and_corners(net):
    assert learned_program.errors(net, inputs()).max() <= learned_program.grid_delta(net)


def test_search_without_proofs_falls_back_to_a_sound_delta(net):
    """With no time to prove anything the search still ends, on a delta that holds."""
    samples = torch.rand(1000, 4, generator=torch.Generator().manual_seed(4))
    result = learned_program.smallest_delta(net, samples, timeout=1e-6)
    assert result.certified == learned_program.grid_delta(net)  # every verify timed out
    assert learned_program.errors(net, inputs()).max() <= result.certified
    assert result.witnessed <= result.certified


def test_planted_corner_bug_is_found_at_the_corner(net, certified):
    buggy = learned_program.CornerBump(net, height=0.5, width=0.05)
    uniform = torch.rand(50_000, 4, generator=torch.Generator().manual_seed(5), dtype=D)
    assert learned_program.errors(buggy, uniform).max() < certified.certified  # they miss it
    diff = learned_program.Difference(buggy, learned_program.MaxProgram())
    result = verify.verify(diff, learned_program.within_property(certified.certified), timeout=30)
    assert result.status == "sat"
    x = result.counterexample[0]
    assert x.dtype == D and ((x >= 0) & (x <= 1)).all()
    assert learned_program.errors(buggy, x[None]).item() >= certified.certified
    # the clean net is within the delta everywhere, so only the bump can violate it
    assert 4 - x.sum().item() < buggy.width


def test_within_property_is_both_sides():
    (region,) = learned_program.within_property(0.25).regions
    contains = [any(p.contains([v]) for p in region.unsafe) for v in (-0.3, -0.25, 0.0, 0.2, 0.25)]
    assert contains == [True, True, False, False, True]
