"""Max pooling with padding (and ceil mode) in bounds/fx_nonlinear.py `max_pool2d`: padded
positions never win (torch's `-inf` padding), the graph computes `nn.MaxPool2d` exactly, and
IBP, CROWN and alpha-CROWN bounds contain sampled outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import verify
from bounds.errors import UnsupportedOperationError, VerificationInputError
from bounds.graph.graph import build_graph
from tests.soundness import assert_contains, box_samples

D = torch.float64
POOLS = {
    "k2_pad1": dict(kernel_size=2, padding=1),
    "k3_s2_pad1": dict(kernel_size=3, stride=2, padding=1),
    "k3_s1_pad1": dict(kernel_size=3, stride=1, padding=1),
    "k2x3_pad0x1": dict(kernel_size=(2, 3), stride=(2, 1), padding=(0, 1)),
    "k3_dil2_pad1": dict(kernel_size=3, stride=1, padding=1, dilation=2),
    "k2_ceil": dict(kernel_size=2, ceil_mode=True),
    "k3_s2_pad1_ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
}


def pool_net(pool: dict, shape=(2, 5, 6)) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(shape[0], 2, 3, padding=1), nn.MaxPool2d(**pool), nn.Flatten())
    with torch.no_grad():
        out = net(torch.zeros(1, *shape)).shape[1]
    return nn.Sequential(*net, nn.Linear(out, 3)).double()


@pytest.mark.parametrize("name", sorted(POOLS))
def test_graph_computes_padded_max_pool(name):
    """All inputs negative: a zero-padded pool would output 0 at the borders, torch's -inf
    padding gives the window's largest input."""
    pool = nn.MaxPool2d(**POOLS[name])
    graph = build_graph(pool, (2, 5, 6))
    x = -torch.rand(4, 2, 5, 6, dtype=D) - 0.5
    torch.testing.assert_close(graph.forward(x), pool(x), rtol=0, atol=1e-15)
    x = torch.randn(4, 2, 5, 6, dtype=D)
    torch.testing.assert_close(graph.forward(x), pool(x), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_padded_max_pool_bounds_contain_samples(name):
    net = pool_net(POOLS[name])
    graph = build_graph(net, (2, 5, 6))
    x = torch.randn(1, 2, 5, 6, generator=torch.Generator().manual_seed(1), dtype=D)
    lower, upper = x - 0.3, x + 0.3
    points = box_samples(lower, upper, 1000, seed=2)
    with torch.no_grad():
        values = net(points[0]).unsqueeze(0)
    for method in ("ibp", "crown", "alpha-crown"):
        options = {"iterations": 10} if method == "alpha-crown" else {}
        found = verify.bounds(graph, lower=lower, upper=upper, method=method, **options)
        assert_contains(found.lower, found.upper, values)


def test_padding_over_half_the_window_is_refused():
    """torch refuses it when the network runs: a typed error, not a crash."""
    with pytest.raises(VerificationInputError, match="half of"):
        build_graph(nn.Sequential(nn.Conv2d(1, 1, 1), nn.MaxPool2d(2, padding=2)), (1, 5, 5))


def test_return_indices_is_refused():
    net = nn.Sequential(nn.Conv2d(1, 1, 1), nn.MaxPool2d(2, padding=1, return_indices=True))
    with pytest.raises(UnsupportedOperationError) as info:
        build_graph(net, (1, 5, 5))
    assert info.value.operation == "max_pool2d"
