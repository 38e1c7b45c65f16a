"""Box clipping by linear bounds (`verify.bab.input.clip`) and the smart input-branching score:
every counterexample of the box stays in the clipped box (sampled in float64, and exactly in
rational arithmetic for the rounding), an empty clip is a proof, and the search answers as
before with clipping and with smart branching."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from bounds.graph.graph import build_graph
from bounds.methods.crown import crown
from bounds.types import Interval
from tests.soundness import box_samples
from verify.bab.config import BabConfig
from verify.bab.input.clip import clip_boxes, row_clips
from verify.bab.input.domains import critical_rows
from verify.bab.input.search import RegionBab
from verify.property import Polytope, Region


def _net(seed: int, n_in: int = 4, width: int = 16, n_out: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, n_out),
    ).double()  # fmt: skip
    return net


def _linear(net, lower, upper, C):
    graph = build_graph(net, (lower.shape[1],))
    linear: dict = {}
    crown(graph, Interval(lower, upper), C, linear=linear)
    return linear["A"], linear["lower"]


@pytest.mark.parametrize("seed", range(6))
def test_counterexamples_stay_in_the_clipped_box(seed):
    """Points of the box whose outputs lie in an unsafe polytope (rows `C y <= b`) all lie in
    the clipped box, and a box clipped to empty holds none. The thresholds sit half a
    dimension's reach above CROWN's bound, so each row clips a dimension by half and with one
    polytope the box must shrink; or at a low quantile of the sampled values."""
    net = _net(seed)
    gen = torch.Generator().manual_seed(seed)
    centre = torch.rand(2, 4, generator=gen, dtype=torch.float64)
    lower, upper = centre - 0.3, centre + 0.3
    C = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    points = box_samples(lower, upper, 4000, seed)  # [2, n, 4]
    with torch.no_grad():
        y = net(points.flatten(0, 1)).reshape(2, -1, 3)
    values = torch.einsum("bmo,bno->bnm", C, y)
    A, found = _linear(net, lower, upper, C)
    reach = (A.abs() * (upper - lower).unsqueeze(1)).amax(2)
    for strict, b in ((True, found + 0.5 * reach), (False, values.quantile(0.03, dim=1))):
        r = torch.nextafter(found - b, torch.tensor(-torch.inf, dtype=torch.float64))
        satisfied = values <= b.unsqueeze(1)  # [2, n, m]
        for owner, n_poly in ((torch.tensor([0, 0, 1, 1]), 2), (torch.zeros(4).long(), 1)):
            low, high, empty = clip_boxes(lower, upper, A, r, owner, n_poly)
            inside = torch.stack(
                [satisfied[..., owner == k].all(-1) for k in range(n_poly)], -1
            ).any(-1)  # counterexamples [2, n]
            within = ((points >= low.unsqueeze(1)) & (points <= high.unsqueeze(1))).all(-1)
            assert bool((within | ~inside).all()), "a counterexample fell outside the clip"
            assert not bool((inside.any(1) & empty).any()), "an empty clip had one"
            assert bool((low >= lower).all() and (high <= upper).all())
            if strict and n_poly == 1:
                shrunk = ((high - low) < (upper - lower) - 1e-9).any() | empty.any()
                assert bool(shrunk), "one small polytope: some box must be clipped"


def test_rounding_of_the_thresholds_is_outward():
    """Each threshold is beyond its exact value `l + (-r)/a` (`u - (-r)/|a|`), in rational
    arithmetic, on magnitudes where round to nearest alone would fall inside."""
    gen = torch.Generator().manual_seed(3)
    n = 2000
    lower = (torch.rand(1, n, generator=gen, dtype=torch.float64) - 0.5) * 1e6
    upper = lower + torch.rand(1, n, generator=gen, dtype=torch.float64) * 1e3
    A = torch.randn(1, 1, n, generator=gen, dtype=torch.float64) * 10 ** torch.randint(
        -8, 8, (1, 1, n), generator=gen
    ).double()
    r = -torch.rand(1, 1, generator=gen, dtype=torch.float64) * 7.3
    low, high = row_clips(lower, upper, A, r)
    slack = -Fraction(float(r))
    for j in range(n):
        a = Fraction(float(A[0, 0, j]))
        if a > 0:
            exact = Fraction(float(lower[0, j])) + slack / a
            assert Fraction(float(high[0, 0, j])) >= exact
            assert float(low[0, 0, j]) == -float("inf")
        else:
            exact = Fraction(float(upper[0, j])) + slack / a
            assert Fraction(float(low[0, 0, j])) <= exact
            assert float(high[0, 0, j]) == float("inf")


def test_rows_that_say_nothing_do_not_clip():
    """A zero functional, an unknown bound (-inf) and a 0 / 0 leave the box as it is; a row
    proven positive excludes its polytope even with a zero functional."""
    lower, upper = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    A = torch.tensor([[[0.0, 0.0], [1.0, -1.0], [0.0, 2.0]]], dtype=torch.float64)
    r = torch.tensor([[-1.0, -torch.inf, 0.0]], dtype=torch.float64)
    low, high, empty = clip_boxes(lower, upper, A, r, torch.tensor([0, 0, 1]), 2)
    assert not bool(empty.any())
    assert torch.equal(low, lower) and torch.equal(high, upper)  # polytope 0 spans the box
    r = torch.tensor([[1e-300, -torch.inf, 0.5]], dtype=torch.float64)
    _, _, empty = clip_boxes(lower, upper, A, r, torch.tensor([0, 0, 1]), 2)
    assert bool(empty.all())


def test_critical_rows():
    """The best row of the least excluded polytope."""
    rows = torch.tensor([[-1.0, -3.0, -0.5, -2.0], [0.5, -4.0, -1.0, -2.0]])
    owner = torch.tensor([0, 0, 1, 1])
    assert critical_rows(rows, owner, 2).tolist() == [0, 2]


def _region(lower, upper, C, b) -> Region:
    return Region(lower.numpy(), upper.numpy(), (Polytope(C.numpy(), b.numpy()),))


@pytest.mark.parametrize("branching", ["smart", "smear"])
@pytest.mark.parametrize("clip", [True, False])
def test_search_answers_agree(branching, clip):
    """Input splitting with and without clipping, smart and smear branching: "unsat" where the
    sampled minimum is above the threshold by a margin, "sat" with a validated counterexample
    where it is below."""
    net = _net(11, n_in=3, width=12, n_out=2).float()
    lower = torch.full((3,), -1.0, dtype=torch.float64)
    upper = torch.full((3,), 1.0, dtype=torch.float64)
    C = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    points = box_samples(lower[None].float(), upper[None].float(), 20000, 0)[0]
    with torch.no_grad():
        values = (net(points) @ C.float().T).squeeze(1)
    low = float(values.min())
    config = BabConfig(splitting="input", branching=branching, clip=clip)
    for threshold, expect in ((low - 0.05, "unsat"), (low + 0.05, "sat")):
        region = _region(lower, upper, C, torch.tensor([threshold], dtype=torch.float64))
        outcome = RegionBab(net, region, config).run(deadline_in(20.0))
        assert outcome.status == expect, (threshold, outcome.status)
        if expect == "sat":
            x, _ = outcome.counterexample
            assert bool(((x >= lower) & (x <= upper)).all())
            with torch.no_grad():
                y = net(x.reshape(1, 3).float()).double()
            assert float((y @ C.T).squeeze()) <= threshold


def deadline_in(seconds: float) -> float:
    import time

    return time.monotonic() + seconds
