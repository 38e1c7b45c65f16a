"""alpha-CROWN's ascent: intersected bounds are differentiated as the slopes' own bounds, so a
larger learning rate does not freeze the slopes (it made the bounds looser: issue 13)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import verify
from bounds.methods.alpha_crown import straight_through
from bounds.methods.crown import scatter_bounds
from bounds.types import Interval


def test_straight_through_keeps_the_value_and_takes_the_surrogates_gradient():
    a = torch.tensor([1.0, -3.0, 2.0], requires_grad=True)
    fixed = torch.tensor([0.0, 0.0, 5.0])
    value = straight_through(torch.maximum(a, fixed), 2 * a)
    assert torch.equal(value.detach(), torch.tensor([1.0, 0.0, 5.0]))
    (grad,) = torch.autograd.grad(value.sum(), a)
    assert torch.equal(grad, torch.full((3,), 2.0))  # the intersection's would be [1, 0, 0]


def test_straight_through_is_the_value_exactly_beside_a_far_surrogate():
    """A valid bound stays bit for bit what it was: `s + (value - s)` would round `value - s`
    (here 3.14159 - (-1e6) in float32) and could come out above it."""
    gen = torch.Generator().manual_seed(0)
    value = torch.rand(1000, generator=gen) * 10
    surrogate = (-torch.rand(1000, generator=gen) * 1e7).requires_grad_(True)
    out = straight_through(value, surrogate)
    assert torch.equal(out.detach(), value)
    assert not torch.equal(surrogate.detach() + (value - surrogate.detach()), value)


def test_straight_through_falls_back_to_the_value_where_the_surrogate_is_infinite():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    value = straight_through(a * 3, torch.tensor([-torch.inf, 0.0]) + a)
    assert torch.equal(value.detach(), torch.tensor([3.0, 6.0]))
    (grad,) = torch.autograd.grad(value.sum(), a)
    assert torch.equal(grad, torch.tensor([3.0, 1.0]))


def test_tightened_is_the_intersection_with_the_new_bounds_gradient():
    prior = Interval(torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[1.0, 1.0, 1.0]]))
    low = torch.tensor([[-2.0, 0.5]], requires_grad=True)  # looser, tighter
    up = torch.tensor([[0.5, 3.0]], requires_grad=True)
    iv = scatter_bounds(prior, torch.tensor([0, 2]), low, up, straight=True)
    assert torch.equal(iv.lower, torch.tensor([[-1.0, -1.0, 0.5]]))
    assert torch.equal(iv.upper, torch.tensor([[0.5, 1.0, 1.0]]))
    g_low, g_up = torch.autograd.grad((iv.lower - iv.upper).sum(), (low, up))
    assert torch.equal(g_low, torch.ones(1, 2)) and torch.equal(g_up, -torch.ones(1, 2))


def _deep_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    sizes = [5, 40, 40, 40, 40, 3]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).double()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_larger_learning_rate_is_not_looser(seed):
    """Before the fix (intersections differentiated as such) lr 0.5 was 5% and lr 1.0 25% looser
    than lr 0.1 on these nets; now all three are within 1-2% of each other."""
    net, x = _deep_mlp(seed), torch.zeros(1, 5, dtype=torch.float64)
    total = {
        lr: float(verify.bounds(net, 1.0, x=x, method="alpha-crown", lr=lr).lower.sum())
        for lr in (0.1, 0.5, 1.0)
    }
    scale = abs(total[0.1])
    assert total[0.5] >= total[0.1] - 0.02 * scale, total
    assert total[1.0] >= total[0.1] - 0.05 * scale, total


def _slopes_after(net: nn.Module, x: torch.Tensor, iterations: int, lr_decay: float) -> list:
    result = verify.bounds(
        net, 1.0, x=x, method="alpha-crown", iterations=iterations, lr=0.5, lr_decay=lr_decay,
        tolerance=0.0, check_every=100,
    )  # fmt: skip
    return list(result.stats["final_slopes"].values())


def test_the_learning_rate_decays_by_lr_decay_per_step():
    """With lr_decay 1e-6 the third Adam step moves no slope by more than 1e-12 (Adam's step
    is at most about lr); without decay it moves them visibly."""
    net, x = _deep_mlp(0), torch.zeros(1, 5, dtype=torch.float64)
    for decay, moved in ((1e-6, False), (1.0, True)):
        one, two = _slopes_after(net, x, 2, decay), _slopes_after(net, x, 3, decay)
        change = max(float((a - b).abs().max()) for a, b in zip(one, two))
        assert (change > 1e-3) == moved, (decay, change)


def test_lr_decay_outside_the_unit_interval_is_refused():
    from bounds.methods.alpha_crown import AlphaCrownConfig

    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="lr_decay"):
            AlphaCrownConfig(lr_decay=bad)
