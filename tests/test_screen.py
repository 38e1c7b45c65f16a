"""Regions proven together (`verify.screen`), margins that only float64 sees (`prune_tolerance`,
the root bounded in float64), and the VNN-COMP instances they decide."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import verify
from bounds.graph.graph import build_graph
from verify.attack import UnsafeSpec, violation
from verify.bab import BabConfig, RegionBab
from verify.bab.common import prune_tolerance
from verify.bab.input.bounder import InputBounder
from verify.property import Polytope, Region, VnnlibProperty
from verify.screen import proven, screen

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vnncomp2023"


def mlp(seed: int, n_in: int = 3, n_out: int = 2) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, n_out)).eval()  # fmt: skip


def regions_around(net: nn.Module, n: int, seed: int) -> list[Region]:
    """Small boxes, each with 1-2 polytopes of 1-2 rows whose offsets sit near the outputs
    (some provable, some holding counterexamples, some undecided)."""
    gen = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lower = gen.uniform(-1, 1, 3)
        upper = lower + gen.uniform(0.01, 0.3, 3)
        y = net(torch.tensor((lower + upper) / 2, dtype=torch.float32)[None])[0].detach()
        polys = []
        for _ in range(gen.integers(1, 3)):
            A = gen.normal(size=(gen.integers(1, 3), 2))
            polys.append(Polytope(A, A @ y.double().numpy() + gen.normal(scale=0.2, size=len(A))))
        out.append(Region(lower, upper, tuple(polys)))
    return out


def sampled_violation(net: nn.Module, region: Region, n: int = 4000) -> float:
    """The smallest `violation` over uniform points and the corners of the box, in float64."""
    gen = torch.Generator().manual_seed(0)
    lower, upper = (torch.tensor(a, dtype=torch.float64) for a in (region.lower, region.upper))
    points = lower + torch.rand(n, 3, generator=gen, dtype=torch.float64) * (upper - lower)
    bits = torch.tensor([[(k >> i) & 1 for i in range(3)] for k in range(8)], dtype=torch.bool)
    points = torch.cat([points, torch.where(bits, upper, lower)])
    with torch.no_grad():
        y = net.double()(points)
    net.float()
    return float(violation(y, UnsafeSpec.of(region, torch.float64)).min())


def test_screened_regions_hold_no_counterexample_and_the_rest_are_kept_in_order():
    net = mlp(0)
    regions = regions_around(net, 120, 1)
    graph = build_graph(net, (3,))
    kept = screen(graph, regions, time.monotonic() + 60)
    kept_ids = {id(r) for r in kept}
    assert [r for r in regions if id(r) in kept_ids] == kept
    dropped = [r for r in regions if id(r) not in kept_ids]
    assert dropped and kept  # both kinds occur in this sample
    for region in dropped:
        assert sampled_violation(net, region) > 0
    # and every region holding a sampled counterexample is kept
    for region in regions:
        if sampled_violation(net, region) <= 0:
            assert id(region) in kept_ids


def test_screen_agrees_with_each_regions_own_root_bound():
    net = mlp(1)
    regions = regions_around(net, 40, 2)
    kept = {id(r) for r in screen(build_graph(net, (3,)), regions, time.monotonic() + 60)}
    for region in regions:
        spec = UnsafeSpec.of(region, torch.float64)
        lower, upper = (torch.tensor(a, dtype=torch.float64)[None] for a in (region.lower,
                                                                         region.upper))  # fmt: skip
        bound = verify.bounds(net.double(), lower=lower, upper=upper, C=spec.C[None],
                              method="crown").lower[0]  # fmt: skip
        net.float()
        alone = proven((bound - spec.b)[None], torch.zeros(1, len(spec.b)).double(),
                       spec.owner[None], torch.tensor([spec.n_polytopes]))  # fmt: skip
        assert bool(alone[0]) == (id(region) not in kept)


def test_padding_rows_and_empty_polytope_lists():
    lower = torch.tensor([[1.0, -1.0, 5.0], [1.0, 1.0, 0.5]])  # padding: the 5.0
    b = torch.zeros(2, 3)
    owner = torch.tensor([[0, 1, -1], [0, 0, 1]])
    assert proven(lower, b, owner, torch.tensor([2, 2])).tolist() == [False, True]
    assert proven(lower, b, owner, torch.tensor([0, 1])).tolist() == [False, True]


def test_a_deadline_already_passed_screens_nothing():
    net = mlp(2)
    regions = regions_around(net, 10, 3)
    assert screen(build_graph(net, (3,)), regions, time.monotonic() - 1) == regions


def test_verify_screens_many_regions_and_still_finds_the_one_counterexample():
    net = mlp(3)
    regions = regions_around(net, 60, 4)
    proven_ids = {id(r) for r in regions} - {
        id(r) for r in screen(build_graph(net, (3,)), regions, time.monotonic() + 60)
    }
    holds = [r for r in regions if id(r) in proven_ids]
    result = verify.verify(net, VnnlibProperty("screen", 3, 2, tuple(holds)), timeout=60)
    assert result.status == "unsat" and result.stats["screened"] == len(holds)
    bad = next(r for r in regions if sampled_violation(net, r) <= 0)
    result = verify.verify(net, VnnlibProperty("screen", 3, 2, (*holds, bad)), timeout=60)
    assert result.status == "sat"
    x, _ = result.counterexample
    assert ((x.numpy() >= bad.lower) & (x.numpy() <= bad.upper)).all()


def test_prune_tolerance():
    b = torch.tensor([0.0, -2.0])
    assert prune_tolerance(BabConfig(), b).tolist() == [0.0, 0.0]
    assert torch.equal(prune_tolerance(BabConfig(float64_recheck=False, prune_tol=1e-5), b),
                       1e-5 * torch.tensor([1.0, 3.0]))  # fmt: skip
    assert torch.equal(prune_tolerance(BabConfig(recheck_tol=1e-4), b),
                       1e-4 * torch.tensor([1.0, 3.0]))  # fmt: skip


@pytest.mark.parametrize(("offset", "closes"), [(-5e-4, True), (0.01, False)])
def test_the_root_is_bounded_in_float64(offset, closes, monkeypatch):
    """The float32 rows are pushed 1e-3 below the truth (as rounding could); the root's own
    float64 bound decides: it closes the root when the exact margin is positive (offset -5e-4
    under the CROWN bound of the output's minimum), never when a point violates (offset +0.01
    over the sampled minimum). Bounded in float32 like any domain, the root stays open."""
    net = mlp(4, n_in=2, n_out=1)
    box = (np.zeros(2), np.full(2, 0.05))
    points = torch.rand(2000, 2, generator=torch.Generator().manual_seed(0)) * 0.05
    low = float(net(points).min().detach())
    exact = verify.bounds(net.double(), lower=torch.zeros(1, 2).double(),
                          upper=torch.full((1, 2), 0.05).double(), method="crown")  # fmt: skip
    net.float()
    threshold = (float(exact.lower) if offset < 0 else low) + offset  # unsafe: y <= threshold
    region = Region(*box, (Polytope(np.array([[1.0]]), np.array([threshold])),))
    real = InputBounder.bound_rows
    monkeypatch.setattr(InputBounder, "bound_rows",
                        lambda self, *a, **k: real(self, *a, **k) - 1e-3)  # fmt: skip
    outcome = RegionBab(net, region, BabConfig()).run(time.monotonic() + 30)
    assert outcome.status == ("unsat" if closes else "sat")
    if closes:
        assert outcome.stats["domains"] == 1 and outcome.stats["closed"] == 1
        float32_root = RegionBab(net, region, BabConfig(root_float64=False))
        assert float32_root.run(time.monotonic() + 2).stats["domains"] > 1


def _instance(bench: str, net: str, prop: str) -> tuple[Path, Path]:
    paths = (
        DATA / bench / "onnx" / f"{net}.onnx.gz",
        DATA / bench / "vnnlib" / f"{prop}.vnnlib.gz",
    )
    if not all(p.exists() for p in paths):
        pytest.skip(f"{paths[0].parent.parent} is absent (VNN-COMP 2023 data)")
    return paths


@pytest.mark.parametrize("prop", ["14_ieee_prop1", "14_ieee_prop3", "14_ieee_prop4"])
def test_ml4acopf_margins_of_one_millionth_are_proven(prop):
    """The 2023 winner proves these (unsat); their margins (1e-6 on outputs of size 1) are below
    float32's rounding, so only the root's float64 bound sees them."""
    net, spec = _instance("ml4acopf", "14_ieee_ml4acopf", prop)
    assert verify.verify(net, spec, timeout=60).status == "unsat"


def test_lindex_800_regions_are_proven_together():
    net, spec = _instance("nn4sys", "lindex", "lindex_800")
    result = verify.verify(net, spec, timeout=30)
    assert result.status == "unsat" and result.stats["screened"] == 800


def test_the_screen_keeps_to_its_share_of_the_time(monkeypatch):
    """Bounds that take 20 ms per region: with 1 s left the screen (half of it) stops after
    about 0.5 s, its chunks sized by the time measured, and keeps the regions it did not
    reach open."""
    import verify.screen as screen_module

    net = mlp(5)
    regions = regions_around(net, 400, 6)
    real = screen_module.bounds

    def slow(graph, **kwargs):
        time.sleep(0.02 * len(kwargs["lower"]))
        return real(graph, **kwargs)

    monkeypatch.setattr(screen_module, "bounds", slow)
    start = time.monotonic()
    kept = screen(build_graph(net, (3,)), regions, start + 1.0)
    took = time.monotonic() - start
    assert took < 0.65
    assert len(kept) > 300  # at most ~25 regions bounded in 0.5 s
