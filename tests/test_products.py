"""Products of two activations (McCormick), quotients, max/min and max pooling: the relaxation
on random and degenerate boxes, and every method's bounds on small nets that use them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import verify
from bounds.graph.graph import build_graph
from bounds.ops import ActivationOp, MultiActivationOp
from relaxations import get_relaxation
from tests.soundness import assert_contains, box_samples

D = torch.float64
product = get_relaxation("product")


def _boxes(n: int = 500, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lows = [torch.randn(n, generator=gen, dtype=D) * 2 for _ in range(2)]
    ups = [lo + torch.rand(n, generator=gen, dtype=D) * 3 for lo in lows]
    for lo, up in zip(lows, ups):  # degenerate: fixed inputs, zero-touching boxes
        up[:20] = lo[:20]
        lo[20:30], up[20:30] = 0.0, 1.0
    return tuple(lows), tuple(ups)


def _samples(lows, ups, k: int = 21):
    t = torch.linspace(0, 1, k, dtype=D)
    a, c = torch.meshgrid(t, t, indexing="ij")
    x = lows[0] + a.reshape(-1, 1) * (ups[0] - lows[0])
    y = lows[1] + c.reshape(-1, 1) * (ups[1] - lows[1])
    return x, y


def test_mccormick_lines_hold_for_any_parameters():
    lows, ups = _boxes()
    x, y = _samples(lows, ups)
    z = x * y
    gen = torch.Generator().manual_seed(1)
    for params in (None, torch.rand(500, 2, generator=gen, dtype=D), torch.zeros(500, 2) - 3):
        lines = product.linear_bounds(lows, ups, params)
        low = lines.lower_slopes[0] * x + lines.lower_slopes[1] * y + lines.lower_intercept
        up = lines.upper_slopes[0] * x + lines.upper_slopes[1] * y + lines.upper_intercept
        assert (low <= z + 1e-9).all() and (up >= z - 1e-9).all()


def test_mccormick_is_exact_when_an_input_is_fixed_and_interval_is_exact():
    lows, ups = _boxes()
    x, y = _samples(lows, ups)
    lines = product.linear_bounds(lows, ups)
    fixed = (ups[0] == lows[0]) | (ups[1] == lows[1])
    low = lines.lower_slopes[0] * x + lines.lower_slopes[1] * y + lines.lower_intercept
    torch.testing.assert_close(low[:, fixed], (x * y)[:, fixed])
    lower, upper = product.interval(lows, ups)
    z = x * y
    torch.testing.assert_close(lower, z.min(0).values)  # corners are on the grid
    torch.testing.assert_close(upper, z.max(0).values)


def test_constraints_contain_the_graph_and_argmin_is_the_minimum():
    lows, ups = _boxes()
    x, y = _samples(lows, ups)
    z = x * y
    cons = product.constraints(lows, ups)
    low = cons.lower_slopes[0] * x.unsqueeze(1) + cons.lower_slopes[1] * y.unsqueeze(1)
    up = cons.upper_slopes[0] * x.unsqueeze(1) + cons.upper_slopes[1] * y.unsqueeze(1)
    assert ((low + cons.lower_intercepts).amax(1) <= z + 1e-9).all()
    assert ((up + cons.upper_intercepts).amin(1) >= z - 1e-9).all()
    gen = torch.Generator().manual_seed(2)
    a, c, e = torch.randn(3, 500, generator=gen, dtype=D)
    (xs, ys), zs = product.argmin((a, c), e, lows, ups)
    best = a * xs + c * ys + e * zs
    # The hull's points: convex combinations of the graph; the graph's grid bounds them.
    assert (best <= (a * x + c * y + e * z).min(0).values + 1e-9).all()
    torch.testing.assert_close(zs, xs * ys)


class _Products(nn.Module):
    """Two branches multiplied, a square, a quotient by a positive branch and max/min."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.a = nn.Linear(3, 6).double()
        self.b = nn.Linear(3, 6).double()
        self.out = nn.Linear(6, 2).double()
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen, dtype=D)

    def forward(self, x):
        u, v = self.a(x), torch.relu(self.b(x))
        return self.out(u * v + torch.maximum(u, v) - torch.minimum(u, 2 * v) + u * (u + 1))


class _Attention(nn.Module):
    """Single-head self-attention scores without softmax: (x Wq)(x Wk)^T, then a value mix."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.q = nn.Linear(4, 3).double()
        self.k = nn.Linear(4, 3).double()
        self.v = nn.Linear(4, 3).double()
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen, dtype=D) * 0.5

    def forward(self, x):  # x: [batch, 2, 4] tokens
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        return (scores @ self.v(x)).flatten(1)


class _Pool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.conv = nn.Conv2d(1, 2, 3, padding=1).double()
        self.fc = nn.Linear(2 * 2 * 2, 2).double()
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen, dtype=D)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        y = self.pool(torch.relu(self.conv(x)))
        return self.fc(F.max_pool2d(y, 1).flatten(1))


NETS = {"products": (_Products, (3,)), "attention": (_Attention, (2, 4)), "pool": (_Pool, (1, 4, 4))}


@pytest.mark.parametrize("name", sorted(NETS))
def test_the_graph_computes_the_module(name):
    net_type, shape = NETS[name]
    net = net_type()
    graph = build_graph(net, shape)
    x = torch.randn(5, *shape, dtype=D)
    torch.testing.assert_close(graph.forward(x), net(x))
    kinds = {type(n.op) for n in graph.nodes}
    assert ActivationOp in kinds or MultiActivationOp in kinds


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown"])
@pytest.mark.parametrize("name", sorted(NETS))
def test_bounds_contain_sampled_outputs(name, method):
    net_type, shape = NETS[name]
    net = net_type()
    x = torch.randn(1, *shape, dtype=D, generator=torch.Generator().manual_seed(3))
    eps = 0.4
    found = verify.bounds(net, eps, x=x, method=method)
    points = box_samples(x - eps, x + eps, 3000, seed=4)
    with torch.no_grad():
        values = net(points[0]).unsqueeze(0)
    assert_contains(found.lower, found.upper, values)


def test_a_fixed_input_gives_exact_products():
    """At eps = 0 every method gives the network's value."""
    net = _Products()
    x = torch.randn(1, 3, dtype=D)
    found = verify.bounds(net, 0.0, x=x, method="crown")
    torch.testing.assert_close(found.lower, net(x).detach())
    torch.testing.assert_close(found.upper, net(x).detach())
