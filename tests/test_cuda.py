"""CUDA paths (skipped without a GPU): bounds and verification on CUDA networks and inputs give
the CPU's answers, for nets on either device (the graph is built on the CPU and moved)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import verify
from verify.property import Polytope, Region, VnnlibProperty

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
METHODS = (
    ("ibp", {}),
    ("crown", {}),
    ("alpha-crown", {"iterations": 5}),
    ("prox", {"iterations": 10, "init_iterations": 5}),
    ("supergradient", {"iterations": 10}),
)


def mlp(sizes: list[int], seed: int, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(dtype).eval()


def conv_net(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 10),
    ).to(dtype).eval()  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("net_on_cuda", [False, True])
@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_bounds_on_cuda_equal_cpu_bounds(method, options, net_on_cuda, dtype):
    net = conv_net(dtype)
    x = torch.rand(2, 3, 8, 8, dtype=dtype)
    cpu = verify.bounds(net, 0.01, x=x, method=method, compile=False, **options)
    dev_net = conv_net(dtype).to(CUDA) if net_on_cuda else net
    for compile_mode in (False, "auto"):
        dev = verify.bounds(
            dev_net, 0.01, x=x.to(CUDA), method=method, compile=compile_mode, **options
        )
        assert dev.lower.device.type == "cuda"
        # one-pass methods agree to rounding; optimisers follow slightly different paths (sums
        # in another order), so their bounds agree to a looser tolerance, and must be sound
        tol = (1e-6 if dtype == torch.float64 else 2e-3) * (1 + float(cpu.lower.abs().max()))
        tol = tol if method in ("ibp", "crown") else 100 * tol
        torch.testing.assert_close(dev.lower.cpu(), cpu.lower, atol=tol, rtol=0)
        torch.testing.assert_close(dev.upper.cpu(), cpu.upper, atol=tol, rtol=0)
        with torch.no_grad():
            points = x + 0.01 * (2 * torch.rand(256, *x.shape, dtype=dtype) - 1)
            y = net(points.flatten(0, 1)).reshape(256, *cpu.lower.shape)
        slack = 1e-9 if dtype == torch.float64 else 1e-4
        assert bool((y >= dev.lower.cpu() - slack).all() and (y <= dev.upper.cpu() + slack).all())


@pytest.mark.parametrize("splitting", ["input", "relu"])
@pytest.mark.parametrize("side", ["sat", "unsat"])
def test_verify_on_a_cuda_net_matches_cpu(splitting, side):
    """`c y <= b` with `b` between CROWN's lower bound and a sampled value: whatever the truth,
    the CUDA net must reach the CPU's decision."""
    net = mlp([5, 16, 16, 2], 1)
    lower = -np.ones(5) * 0.5
    region = Region(lower, lower + 1, ())
    row = np.array([1.0, -1.0])
    C = torch.tensor(row, dtype=torch.float32)[None, None]
    lo = torch.tensor(lower, dtype=torch.float32)[None]
    crown_lb = float(verify.bounds(net, lower=lo, upper=lo + 1, C=C, method="crown").lower)
    with torch.no_grad():
        samples = lo + torch.rand(4096, 5)
        sampled = float((net(samples) @ torch.tensor(row, dtype=torch.float32)).min())
    b = sampled + 0.05 if side == "sat" else crown_lb + 0.9 * (sampled - crown_lb)
    poly = Polytope(row[None], np.array([b]))
    prop = VnnlibProperty("<cuda>", 5, 2, (Region(region.lower, region.upper, (poly,)),))
    cpu = verify.verify(net, prop, timeout=30, splitting=splitting)
    dev = verify.verify(mlp([5, 16, 16, 2], 1).to(CUDA), prop, timeout=30, splitting=splitting)
    assert cpu.status in ("sat", "unsat"), cpu.stats
    assert dev.status == cpu.status, (dev.status, cpu.status, dev.stats)
