"""The attack's view of a network (`verify.attack_mode`): forward values unchanged, surrogate
gradients through piecewise-constant activations, a final softmax peeled, and the binarised
counterexamples they find that the plain gradient does not."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from relaxations.sign import SignRelaxation
from verify import attack
from verify.attack import AttackConfig, UnsafeSpec, find_counterexample, pgd, validate, violation
from verify.attack_mode import AttackMode, attack_outputs, uses_surrogates
from verify.property import Polytope, Region


class Binarised(nn.Module):
    """Linear -> sign -> linear (weights +-10) -> softmax over 10 classes: the softmax
    saturates and sign has no gradient, as in VNN-COMP's traffic-sign nets."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # the biases
        self.l1, self.l2 = nn.Linear(30, 200), nn.Linear(200, 10)
        with torch.no_grad():
            self.l1.weight.copy_(torch.randn(200, 30, generator=gen))
            self.l1.bias.zero_()
            self.l2.weight.copy_(torch.randn(10, 200, generator=gen).sign() * 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.l2(torch.sign(self.l1(x))), 1)


def robustness_region(net: nn.Module, eps: float, seed: int) -> Region:
    """The box of radius `eps` around a random point; unsafe: another class scores at least
    as high as the point's (one polytope per class, `y_c - y_k <= 0`)."""
    x0 = torch.randn(1, 30, generator=torch.Generator().manual_seed(seed + 1))
    label = int(net(x0).argmax())
    polytopes = []
    for k in range(10):
        if k != label:
            A = np.zeros((1, 10))
            A[0, label], A[0, k] = 1.0, -1.0
            polytopes.append(Polytope(A, np.zeros(1)))
    x = x0[0].double().numpy()
    return Region(x - eps, x + eps, tuple(polytopes))


class Mixed(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(x * 3.0, dim=1)  # an inner softmax: never peeled
        return torch.floor(x * 2.0) + x.sign() + h[:, :1]


def test_forward_values_are_the_networks_own_and_the_model_is_not_changed():
    torch.manual_seed(0)
    x = torch.randn(64, 30) * 100
    for net in (Binarised(0), Mixed()):
        state = {k: v.clone() for k, v in net.state_dict().items()}
        want = net(x)
        got = attack_outputs(net, x.clone().requires_grad_(True), peel_softmax=False)
        assert torch.equal(got.detach(), want)
        assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_sign_and_floor_pass_surrogate_gradients_and_the_plain_net_does_not():
    x = torch.randn(8, 30, requires_grad=True)
    (plain,) = torch.autograd.grad(Mixed()(x).sum(), x)
    (grad,) = torch.autograd.grad(attack_outputs(Mixed(), x, False).sum(), x)
    inner = torch.autograd.grad(torch.softmax(x * 3.0, 1)[:, 0].sum() * 30, x)[0]
    assert torch.allclose(plain, inner)  # sign and floor contribute nothing
    sign_part = SignRelaxation().attack_derivative(x.detach())
    assert torch.allclose(grad, inner + 2.0 + sign_part)  # floor: identity (x2), sign: sech^2
    assert (sign_part > 0).all() and (sign_part <= 1).all()


def test_only_a_final_softmax_over_the_features_is_peeled():
    net = Binarised(1)
    x = torch.randn(5, 30)
    logits = net.l2(torch.sign(net.l1(x)))
    assert torch.equal(attack_outputs(net, x, peel_softmax=True), logits)
    assert torch.equal(attack_outputs(net, x, peel_softmax=False), net(x))
    mixed = attack_outputs(Mixed(), x, peel_softmax=True)  # its softmax is inside
    assert torch.equal(mixed, Mixed()(x))
    mode = AttackMode()
    with mode:
        y = net(x)
    assert mode.logits_of(y) is not None and mode.logits_of(y.clone()) is None


@pytest.mark.parametrize(
    ("A", "b", "want"),
    [
        ([[1.0, -1.0, 0.0], [0.0, 2.0, -2.0]], [0.0, 0.0], True),
        ([[1.0, -1.0, 0.0]], [0.5], False),  # an offset: not order-invariant
        ([[1.0, -0.5, -0.5]], [0.0], False),  # three outputs
        ([[1.0, 0.0, 0.0]], [0.0], False),  # a threshold on one output
        ([[1.0, -2.0, 0.0]], [0.0], False),  # magnitudes differ
    ],
)
def test_comparisons_only(A, b, want):
    region = Region(np.zeros(1), np.ones(1), (Polytope(np.array(A), np.array(b)),))
    assert UnsafeSpec.of(region).comparisons_only() is want


@pytest.mark.parametrize(("seed", "eps"), [(1, 0.05), (3, 0.05), (4, 0.2)])
def test_binarised_counterexamples_need_the_surrogate(seed, eps, monkeypatch):
    """Counterexamples exist here (found, then validated in float64); with sign's gradient
    left at 0 the same search finds none."""
    net = Binarised(seed).eval()
    region = robustness_region(net, eps, seed)
    config = AttackConfig(restarts=8, samples=64, steps=30)
    x = find_counterexample(net, region, config=config)
    assert x is not None and validate(net, region, x) is not None
    monkeypatch.setattr(SignRelaxation, "attack_derivative", lambda self, xh: None)
    assert find_counterexample(net, region, config=config) is None


def test_untargeted_pgd_values_are_the_violation_at_its_points():
    net = Binarised(2).eval()
    region = robustness_region(net, 0.2, 2)
    spec = UnsafeSpec.of(region)
    lower = torch.tensor(region.lower, dtype=torch.float32)[None]
    upper = torch.tensor(region.upper, dtype=torch.float32)[None]
    starts = lower + torch.rand(6, 30, generator=torch.Generator().manual_seed(0)) * (upper - lower)
    points, values = pgd(net, lower, upper, spec, starts, steps=20, targeted=False)
    assert ((points >= lower) & (points <= upper)).all()
    logits = net.l2(torch.sign(net.l1(points)))
    assert torch.equal(values, violation(logits, spec))


def test_uses_surrogates_only_where_a_surrogate_derivative_is_taken():
    x = torch.randn(1, 30)
    assert uses_surrogates(Binarised(0), x)
    relu = nn.Sequential(nn.Linear(30, 8), nn.ReLU(), nn.Linear(8, 10))
    assert not uses_surrogates(relu, x)


def _scripted(monkeypatch, hit_from: int | None, seconds: float = 0.0) -> list:
    """`verify.attack._attack` replaced: it sleeps `seconds`, records `(seed, deadline)` and
    returns a point from the seed `hit_from` on (never when None)."""
    calls = []

    def fake(net, region, shape, extra, config, seed, deadline):
        time.sleep(seconds)
        calls.append((seed, deadline))
        return None if hit_from is None or seed < hit_from else torch.zeros(30)

    monkeypatch.setattr(attack, "_attack", fake)
    return calls


def test_a_surrogate_network_is_attacked_again_with_the_next_seeds(monkeypatch):
    region = robustness_region(Binarised(0), 0.05, 0)
    calls = _scripted(monkeypatch, hit_from=2)
    start = time.monotonic()
    x = find_counterexample(Binarised(0), region, seed=5, deadline=start + 100)
    assert x is not None and [s for s, _ in calls] == [5]  # found: no retry
    calls.clear()
    x = find_counterexample(Binarised(0), region, seed=0, deadline=start + 100)
    assert x is not None and [s for s, _ in calls] == [0, 1, 2]
    end = calls[1][1]  # the retries are paced against the share's end
    assert calls[0][1] == start + 100 and end <= start + 100 * 0.5 + 1 and calls[2][1] == end


def test_no_retry_without_surrogates_a_deadline_or_a_share(monkeypatch):
    relu = nn.Sequential(nn.Linear(30, 8), nn.ReLU(), nn.Linear(8, 10))
    region = robustness_region(Binarised(0), 0.05, 0)
    calls = _scripted(monkeypatch, hit_from=1)
    assert find_counterexample(relu, region, deadline=time.monotonic() + 100) is None
    assert find_counterexample(Binarised(0), region) is None  # no deadline
    off = AttackConfig(surrogate_share=0.0)
    assert (
        find_counterexample(Binarised(0), region, config=off, deadline=time.monotonic() + 100)
        is None
    )
    assert [s for s, _ in calls] == [0, 0, 0]
    with pytest.raises(ValueError, match="surrogate_share"):
        AttackConfig(surrogate_share=1.5)


def test_retries_end_within_the_share(monkeypatch):
    """Attacks of 0.05 s that never find: retries start only while one more, as long as the
    longest so far, ends within the share (0.5 of 1 s)."""
    region = robustness_region(Binarised(0), 0.05, 0)
    calls = _scripted(monkeypatch, hit_from=None, seconds=0.05)
    start = time.monotonic()
    assert find_counterexample(Binarised(0), region, deadline=start + 1.0) is None
    elapsed = time.monotonic() - start
    assert len(calls) >= 4 and elapsed <= 0.5 + 0.05
