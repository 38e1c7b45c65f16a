"""PGD counterexample search: the violation objective, validation, planted counterexamples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import verify
from verify.attack import AttackConfig, UnsafeSpec, min_max, validate, violation
from verify.bab import BabConfig
from verify.property import Polytope, Region, VnnlibProperty


def mlp(n_in: int, hidden: int, n_out: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, n_out),
    )  # fmt: skip
    return net.eval()


def planted(seed: int, n_in: int = 4) -> tuple[nn.Module, Region, torch.Tensor]:
    """A net, and a region whose only polytope contains `net(x0)` with slack 0.01 per row (and
    little else): `x0` is a counterexample."""
    net = mlp(n_in, 16, 3, seed)
    gen = np.random.default_rng(seed)
    lower = gen.uniform(-1, 0, n_in)
    upper = lower + gen.uniform(0.5, 1.5, n_in)
    x0 = torch.tensor(gen.uniform(lower, upper), dtype=torch.float32)
    y0 = net(x0[None]).detach().double().numpy()[0]
    A = np.concatenate([np.eye(3), -np.eye(3)])
    b = A @ y0 + 0.01
    return net, Region(lower, upper, (Polytope(A, b),)), x0


def test_min_max_matches_a_loop_and_empty_polytopes_give_minus_inf():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(7, 6, generator=gen)
    owner = torch.tensor([0, 0, 1, 2, 2, 2])
    got = min_max(values, owner, 3)
    for row, value in zip(values, got):
        want = min(float(row[owner == k].max()) for k in range(3))
        assert float(value) == pytest.approx(want)
    assert torch.isinf(min_max(values, owner, 4)).all()  # polytope 3 has no rows


def test_violation_is_nonpositive_exactly_inside_the_polytopes():
    A1, b1 = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([0.0, 0.0])  # y <= 0
    A2, b2 = np.array([[-1.0, -1.0]]), np.array([-3.0])  # y0 + y1 >= 3
    region = Region(np.zeros(2), np.ones(2), (Polytope(A1, b1), Polytope(A2, b2)))
    spec = UnsafeSpec.of(region, torch.float64)
    y = torch.tensor([[-1.0, -2.0], [2.0, 2.0], [0.5, 0.5], [0.0, 0.0]], dtype=torch.float64)
    inside = [any(p.contains(r.numpy()) for p in region.unsafe) for r in y]
    assert ((violation(y, spec) <= 0).tolist()) == inside == [True, True, False, True]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_counterexample_is_found_and_validated(seed):
    net, region, _ = planted(seed)
    x = verify.find_counterexample(net, region, config=AttackConfig(restarts=64, steps=100))
    assert x is not None and x.dtype == torch.float64
    assert (x >= torch.tensor(region.lower)).all() and (x <= torch.tensor(region.upper)).all()
    y = net.double()(x[None])[0].detach().numpy()
    assert region.unsafe[0].contains(y)


def test_planted_counterexample_as_extra_point():
    net, region, x0 = planted(5)
    config = AttackConfig(restarts=0, steps=0)
    assert verify.find_counterexample(net, region, extra_points=x0[None], config=config) is not None


def test_validate_rejects_safe_points_and_clips_to_the_box():
    net, region, x0 = planted(3)
    assert validate(net, region, x0[None]) is not None
    far = torch.tensor(region.upper, dtype=torch.float32) + 10.0
    found = validate(net, region, far[None])
    if found is not None:  # clipped to the upper corner, which must then violate
        assert torch.equal(found[0], torch.tensor(region.upper))
    lower_y = net(x0[None]).detach().double().numpy()[0] + 5.0  # polytope far from net(x)
    A = np.eye(3)
    safe = Region(region.lower, region.upper, (Polytope(-A, -lower_y),))  # y >= y0 + 5
    assert validate(net, safe, x0[None]) is None


def test_no_counterexample_when_the_bounds_exclude_the_polytope():
    net, region, _ = planted(4)
    lower, upper = (
        torch.tensor(a, dtype=torch.float32)[None] for a in (region.lower, region.upper)
    )
    low = verify.bounds(net, lower=lower, upper=upper, method="crown").lower[0].double()
    safe = Region(region.lower, region.upper, (Polytope(np.eye(3)[:1], low[:1].numpy() - 1),))
    assert verify.find_counterexample(net, safe) is None
    prop = VnnlibProperty("<test>", 4, 3, (safe,))
    assert verify.verify(net, prop, timeout=5).status == "unsat"


def test_a_polytope_without_rows_is_violated_and_no_polytope_holds():
    net, region, _ = planted(6)
    everything = Region(region.lower, region.upper, (Polytope(np.zeros((0, 3)), np.zeros(0)),))
    prop = VnnlibProperty("<all>", 4, 3, (everything,))
    result = verify.verify(net, prop, timeout=5)
    assert result.status == "sat" and result.results_text().startswith("sat\n((X_0 ")
    nothing = VnnlibProperty("<none>", 4, 3, (Region(region.lower, region.upper, ()),))
    assert verify.find_counterexample(net, nothing.regions[0]) is None
    assert verify.verify(net, nothing, timeout=5).status == "unsat"


def test_combined_rows_keep_the_polytopes_and_violation():
    """Midpoints of row pairs (and the mean) are redundant: `violation` is unchanged on random
    outputs, polytopes of one row or over `max_rows` rows get none."""
    gen = np.random.default_rng(0)
    polys = (
        Polytope(gen.normal(size=(4, 5)), gen.normal(size=4)),
        Polytope(gen.normal(size=(1, 5)), gen.normal(size=1)),
        Polytope(gen.normal(size=(8, 5)), gen.normal(size=8)),
    )
    spec = UnsafeSpec.of(Region(np.zeros(3), np.ones(3), polys), torch.float64)
    combined = spec.with_combinations(max_rows=6)
    assert combined.C.shape[0] == spec.C.shape[0] + 6 + 1  # 4 rows: 6 pairs and the mean
    assert (combined.owner[spec.C.shape[0] :] == 0).all()
    y = torch.randn(10_000, 5, dtype=torch.float64) * 3
    torch.testing.assert_close(violation(y, combined), violation(y, spec), rtol=0, atol=1e-12)


def test_combined_rows_exclude_an_empty_polytope_no_single_row_excludes():
    """y = (x, 0.1 - x) on x in [-1, 1] with the unsafe set {y0 <= 0, y1 <= 0} (x <= 0 and
    x >= 0.1: empty). Neither row's bound is positive, their midpoint's is (0.05): the root
    domain is pruned at once."""
    net = nn.Linear(1, 2).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0], [-1.0]]))
        net.bias.copy_(torch.tensor([0.0, 0.1]))
    poly = Polytope(np.eye(2), np.zeros(2))
    prop = VnnlibProperty("<combo>", 1, 2, (Region(-np.ones(1), np.ones(1), (poly,)),))
    result = verify.verify(net, prop, timeout=10, splitting="input")
    assert result.status == "unsat" and result.stats["regions"][0]["domains"] == 1
    plain = verify.verify(
        net, prop, timeout=10, config=BabConfig(combine_rows=False, splitting="input")
    )
    assert plain.status == "unsat" and plain.stats["regions"][0]["domains"] > 1
