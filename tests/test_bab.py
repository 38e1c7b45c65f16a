"""Input-splitting branch and bound: agreement with exact answers on tiny nets (dense grid with
a Lipschitz margin; the exact MILP), time limits, interruption, out-of-memory batches."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

import verify
import verify.bab.input.bounder as bab
from verify.bab import BabConfig, BatchSizer, Domains, RegionBab, solve_region
from verify.property import Polytope, Region, VnnlibProperty
from verify.specs import region_proven, region_spec


def mlp(sizes: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).double().eval()


def lipschitz(net: nn.Sequential) -> np.ndarray:
    """Per output, a Lipschitz constant w.r.t. the L-inf input norm (product of inf-norms)."""
    weights = [m.weight.detach().abs().numpy() for m in net if isinstance(m, nn.Linear)]
    prod = weights[0]
    for w in weights[1:]:
        prod = w @ prod
    return prod.sum(axis=1)  # |W_k|...|W_1| row sums bound each output's slope


def grid_truth(net: nn.Sequential, region: Region, n: int = 301) -> str | None:
    """ "sat"/"unsat" from a dense grid over the 2-d box, or None when too close to call: the
    objective v moves by at most L h / 2 between a point and its nearest grid point."""
    axes = [np.linspace(lo, up, n) for lo, up in zip(region.lower, region.upper)]
    points = torch.tensor(np.stack(np.meshgrid(*axes), -1).reshape(-1, 2))
    y = net(points).detach()
    spec = verify.attack.UnsafeSpec.of(region, torch.float64)
    value = float(verify.attack.violation(y, spec).min())
    half_step = max((up - lo) / (n - 1) for lo, up in zip(region.lower, region.upper)) / 2
    slope = max(float((np.abs(p.A) @ lipschitz(net)).max()) for p in region.unsafe)
    if value <= 0:
        return "sat"
    return "unsat" if value > slope * half_step else None


def random_region(gen: np.random.Generator, net: nn.Sequential) -> Region:
    """A box and 1-2 polytopes of 1-2 rows with offsets near the outputs' range."""
    lower = gen.uniform(-1, 0.5, 2)
    upper = lower + gen.uniform(0.2, 1.0, 2)
    centre = net(torch.tensor((lower + upper) / 2)[None]).detach().numpy()[0]
    polys = []
    for _ in range(gen.integers(1, 3)):
        A = gen.normal(size=(gen.integers(1, 3), centre.shape[0]))
        b = A @ centre + gen.normal(scale=0.3, size=A.shape[0])
        polys.append(Polytope(A, b))
    return Region(lower, upper, tuple(polys))


def test_agrees_with_a_dense_grid_on_random_properties():
    gen = np.random.default_rng(0)
    answers = []
    for seed in range(12):
        net = mlp([2, 12, 12, 3], seed)
        region = random_region(gen, net)
        truth = grid_truth(net, region)
        if truth is None:
            continue
        prop = VnnlibProperty("<grid>", 2, 3, (region,))
        result = verify.verify(net, prop, timeout=10)
        assert result.status == truth, (seed, result.status, truth, result.stats)
        answers.append(truth)
    assert len(answers) >= 8 and {"sat", "unsat"} <= set(answers)


def barely_violated(net: nn.Sequential, region: Region, depth: float = 0.01) -> Region:
    """`region` with every `b` shifted so that the grid minimum of `v` is `-depth`."""
    axes = [np.linspace(lo, up, 301) for lo, up in zip(region.lower, region.upper)]
    points = torch.tensor(np.stack(np.meshgrid(*axes), -1).reshape(-1, 2))
    spec = verify.attack.UnsafeSpec.of(region, torch.float64)
    shift = float(verify.attack.violation(net(points).detach(), spec).min()) + depth
    polys = tuple(Polytope(p.A, p.b + shift) for p in region.unsafe)
    return Region(region.lower, region.upper, polys)


def test_pruning_alone_never_proves_a_violated_region(monkeypatch):
    """With the counterexample search switched off, branch and bound on barely violated
    regions must run out of time (only unsound pruning could empty the domain list)."""
    monkeypatch.setattr(RegionBab, "_try_points", lambda self, points: None)
    monkeypatch.setattr(RegionBab, "_attack", lambda self, children: None)
    gen = np.random.default_rng(0)
    for seed in range(6):
        net = mlp([2, 12, 12, 3], seed)
        region = barely_violated(net, random_region(gen, net))
        outcome = solve_region(net, region, time.monotonic() + 0.3, BabConfig(splitting="input"))
        assert outcome.status == "timeout", (seed, outcome.stats)
        assert outcome.stats["domains"] > 10


def milp_minimum(net: nn.Module, region: Region) -> float:
    lower, upper = (torch.tensor(a)[None] for a in (region.lower, region.upper))
    C = torch.tensor(region.unsafe[0].A)[None]
    return float(verify.bounds(net, lower=lower, upper=upper, C=C, method="milp").lower[0, 0])


@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_the_exact_milp(seed):
    """One row `c y <= b` with `b` 0.05 above or below the exact minimum of `c y` (MILP)."""
    gen = np.random.default_rng(100 + seed)
    net = mlp([3, 10, 10, 2], seed)
    lower = gen.uniform(-1, 0, 3)
    region = Region(lower, lower + 1, (Polytope(gen.normal(size=(1, 2)), np.zeros(1)),))
    minimum = milp_minimum(net, region)
    scale = 0.05 * (1 + abs(minimum))
    for offset, truth in ((scale, "sat"), (-scale, "unsat")):
        poly = Polytope(region.unsafe[0].A, np.array([minimum + offset]))
        prop = VnnlibProperty("<milp>", 3, 2, (Region(region.lower, region.upper, (poly,)),))
        assert verify.verify(net, prop, timeout=10).status == truth


def hard_instance() -> tuple[nn.Module, VnnlibProperty]:
    """A 12-input net and `y_0 <= b` with `b` under the best value a long PGD finds."""
    net = mlp([12, 64, 64, 64, 2], 7).float()
    lower, upper = -np.ones(12), np.ones(12)
    probe = Region(lower, upper, (Polytope(np.array([[1.0, 0.0]]), np.zeros(1)),))
    spec = verify.attack.UnsafeSpec.of(probe)
    box = [torch.tensor(a, dtype=torch.float32)[None] for a in (lower, upper)]
    starts = torch.rand(256, 12, generator=torch.Generator().manual_seed(0)) * 2 - 1
    _, values = verify.attack.pgd(net, *box, spec, starts, steps=200)
    best = float(values.min())
    poly = Polytope(probe.unsafe[0].A, np.array([best - 0.05 * (1 + abs(best))]))
    return net, VnnlibProperty("<hard>", 12, 2, (Region(lower, upper, (poly,)),))


def test_time_limit_is_honoured():
    net, prop = hard_instance()
    start = time.monotonic()
    result = verify.verify(net, prop, timeout=1.0)
    elapsed = time.monotonic() - start
    assert result.status in ("timeout", "unknown") and elapsed < 1.5, (result.status, elapsed)
    assert result.stats["regions"][0]["domains"] > 1


def test_keyboard_interrupt_gives_unknown(monkeypatch):
    net, prop = hard_instance()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bab, "bounds", interrupted)
    result = verify.verify(net, prop, timeout=5)
    assert result.status == "unknown" and result.stats["interrupted"]


def test_out_of_memory_halves_the_batch(monkeypatch):
    real = bab.bounds
    sizes = []

    def limited(net, *, lower, **kwargs):
        sizes.append(lower.shape[0])
        if lower.shape[0] > 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(net, lower=lower, **kwargs)

    net = mlp([3, 10, 10, 2], 1)
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.eye(2), np.zeros(2)),))
    runner = RegionBab(net, region, BabConfig(batch_size=64, max_batch=64))
    lower = torch.rand(100, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    upper = lower + 0.1
    want = real(net, lower=lower, upper=upper, C=runner.spec.C, method="crown").lower
    monkeypatch.setattr(bab, "bounds", limited)
    got = runner.bounder.bound_rows(lower, upper, strong=False)
    assert torch.allclose(got, want - runner.spec.b)
    assert sizes[0] == 64 and runner.sizer.size == 8 and max(sizes[-3:]) <= 8


def test_out_of_memory_everywhere_is_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(bab, "bounds", broken)
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.eye(2), np.zeros(2)),))
    runner = RegionBab(mlp([3, 4, 2], 0), region, BabConfig(batch_size=4, min_batch=1))
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.bounder.bound_rows(
            torch.zeros(4, 3).double(), torch.ones(4, 3).double(), strong=False
        )


def test_vectorised_pruning_matches_region_proven():
    gen = np.random.default_rng(3)
    polys = (Polytope(gen.normal(size=(2, 3)), gen.normal(size=2)),
             Polytope(gen.normal(size=(1, 3)), gen.normal(size=1)))  # fmt: skip
    region = Region(np.zeros(2), np.ones(2), polys)
    runner = RegionBab(mlp([2, 4, 3], 0), region, BabConfig(prune_tol=0.0, combine_rows=False))
    _, b, owner = region_spec(region, torch.float64)
    lows = torch.tensor(gen.normal(size=(50, 3)))
    rows = (lows - b).to(runner.dtype)
    margin = verify.attack.min_max(rows, runner.spec.owner, 2)
    assert [bool(m > 0) for m in margin] == [region_proven(lo, b, owner, 2) for lo in lows]


def test_split_children_tile_the_parent():
    region = Region(np.zeros(3), np.array([1.0, 2.0, 4.0]), (Polytope(np.eye(2)[:1], np.zeros(1)),))
    runner = RegionBab(mlp([3, 5, 2], 0), region, BabConfig(branching="widest"))
    lower = runner.root[0]
    upper = torch.tensor([[0.5, 2.0, 1.0]], dtype=lower.dtype)  # normalised 0.5, 1, 0.25
    parent = Domains(lower, upper, torch.zeros(1, 1), torch.zeros(1), torch.zeros(1).long())
    lo, up, depth = runner.brancher.split(parent, runner.brancher.scores(parent).argmax(dim=1))
    assert depth.tolist() == [1, 1]
    assert torch.equal(lo[0], lower[0]) and torch.equal(up[1], upper[0])
    assert up[0, 1] == lo[1, 1] == 1.0
    keep = [0, 2]
    assert torch.equal(up[0, keep], upper[0, keep]) and torch.equal(lo[1, keep], lower[0, keep])


def test_no_trial_split_on_a_dimension_the_root_holds_fixed():
    """5 trial dimensions by default, but a box that varies 2 of its 6 inputs tries only those
    2 (a split along a fixed dimension would bound two copies of its parent)."""
    lower, upper = np.zeros(6), np.zeros(6)
    upper[[1, 4]] = 1.0
    region = Region(lower, upper, (Polytope(np.eye(2)[:1], np.array([-5.0])),))
    runner = RegionBab(mlp([6, 5, 2], 0), region, BabConfig())
    assert BabConfig().trial_dims == 5 and runner.brancher.k == 2
    parent = Domains(runner.root[0], runner.root[1], torch.zeros(1, 1), torch.zeros(1),
                     torch.zeros(1).long())  # fmt: skip
    dims = runner.brancher.scores(parent).topk(runner.brancher.k, dim=1).indices
    assert sorted(dims[0].tolist()) == [1, 4]
    wide = Region(np.zeros(6), np.ones(6), region.unsafe)
    assert RegionBab(mlp([6, 5, 2], 0), wide, BabConfig()).brancher.k == 5


def test_batch_sizer_grows_to_the_cheaper_size_and_respects_time():
    sizer = BatchSizer(BabConfig(batch_size=32, max_batch=128))
    sizer.record(32, 0.32)  # 10 ms per domain
    assert sizer.size == 64
    sizer.record(64, 1.28)  # 20 ms: worse, go back
    assert sizer.size == 32
    assert sizer.allowed(0.2) == 6  # 30% of 0.2 s at the current size's 10 ms per domain


def test_batch_sizer_counts_steps_a_little_under_its_size():
    """Input splitting with k trial dimensions bounds 2k children per parent, so a step of
    size 128 bounds 120 boxes (k = 5): it must still be measured, else the size never moves
    and the pessimistic first estimate caps the batches for the whole run."""
    sizer = BatchSizer(BabConfig(batch_size=128, max_batch=1024))
    sizer.seed(0.05)  # the root: one unbatched domain
    assert sizer.allowed(10.0) == 60
    for _ in range(4):
        n = min(sizer.size, sizer.allowed(10.0)) // 10 * 10  # whole parents of 10 children
        sizer.record(n, 0.001 * n * (1 - 0.01 * n / 1024))  # ~1 ms per domain, less when bigger
    assert sizer.size == 1024 and sizer.allowed(10.0) == 1024
    sizer.record(10, 5.0)  # a tail step: ignored
    assert sizer.allowed(10.0) == sizer.size


def test_the_float32_box_contains_the_exact_box():
    gen = np.random.default_rng(5)
    lower = gen.uniform(-1, 1, 50)
    region = Region(lower, lower + gen.uniform(0, 1e-6, 50), ())
    low, up = bab.outward_box(region, torch.float32)
    assert low.dtype == torch.float32
    assert (low.double()[0] <= torch.tensor(region.lower)).all()
    assert (up.double()[0] >= torch.tensor(region.upper)).all()
