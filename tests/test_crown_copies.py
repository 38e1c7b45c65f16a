"""CROWN's intervals bound a copied pre-activation through its source (bounds/methods/copies.py):
attention's broadcast operands, padding and reshapes before an activation. The intervals are
those of bounding every copy (the same backward passes, up to the copies' rounding terms),
fewer neurons are bounded, and sampled values of every node lie inside, with no tolerance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bounds.methods.crown as crown_module
from bounds.graph.graph import build_graph
from bounds.methods.copies import copy_chain
from bounds.methods.crown import crown_intervals
from bounds.types import Interval

D = torch.float64


class Attention(nn.Module):
    """One head of self-attention on 3 tokens of width 4, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.inner, self.out = nn.Linear(4, 4), nn.Linear(12, 2)

    def forward(self, x):  # x: [B, 3, 4]
        h = torch.relu(self.inner(x))
        s = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / 2.0, dim=-1)
        return self.out((s @ self.v(h)).flatten(1))


class Padded(nn.Module):
    """A hidden layer reshaped, padded with a constant and permuted before its ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a, self.b, self.out = nn.Linear(6, 6), nn.Linear(6, 12), nn.Linear(20, 2)

    def forward(self, x):  # x: [B, 6]
        h = self.b(torch.relu(self.a(x))).reshape(-1, 3, 4)
        h = F.pad(h, (0, 1, 1, 0), value=0.25).permute(0, 2, 1)
        return self.out(torch.relu(h).flatten(1))


def _intervals(net: nn.Module, shape, eps: float, copies: bool, monkeypatch):
    graph = build_graph(net.double(), shape).to(D)
    x = torch.rand(1, *shape, generator=torch.Generator().manual_seed(2), dtype=D)
    box = Interval(x - eps, x + eps)
    counted: list[int] = []
    original = crown_module.bound_neurons

    def counting(graph_, name, index, *args, **kwargs):
        counted.append(index.numel())
        return original(graph_, name, index, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(crown_module, "bound_neurons", counting)
        if not copies:
            patch.setattr(crown_module, "copy_chain", lambda graph_, name: None)
        found = crown_intervals(graph, box)
    return graph, box, found, sum(counted)


@pytest.mark.parametrize(
    "net, shape, fewer", [(Attention(), (3, 4), True), (Padded(), (6,), False)]
)
def test_copies_bound_like_every_copy_with_fewer_neurons(net, shape, fewer, monkeypatch):
    graph, box, fast, n_fast = _intervals(net, shape, 0.3, True, monkeypatch)
    _, _, slow, n_slow = _intervals(net, shape, 0.3, False, monkeypatch)
    assert any(copy_chain(graph, n) is not None for n in graph.pre_activation_names())
    # broadcasts copy an element many times; padding and permutes once each
    assert n_fast < n_slow if fewer else n_fast == n_slow
    for name in graph.pre_activation_names():
        a, b = fast[name], slow[name]
        scale = 1 + torch.maximum(b.lower.abs(), b.upper.abs())
        # the same passes: equal but for the copies' rounding terms (tiny, and only tighter)
        assert ((b.lower - a.lower) / scale).max() <= 1e-12, name
        assert ((a.upper - b.upper) / scale).max() <= 1e-12, name
        assert ((a.lower - b.lower) / scale).max() <= 1e-9, name
        assert ((b.upper - a.upper) / scale).max() <= 1e-9, name
    # every node's sampled values inside its interval, corners included
    n_in = box.lower.numel()
    points = box.lower + (box.upper - box.lower) * torch.rand(
        4000, n_in, generator=torch.Generator().manual_seed(3), dtype=D
    ).reshape(-1, *shape)
    corners = torch.where(torch.rand(64, *shape, dtype=D) < 0.5, box.lower, box.upper)
    values = graph.forward(torch.cat([points, corners]), all_values=True)
    for name, iv in fast.items():
        v = values[name]
        assert (v >= iv.lower).all() and (v <= iv.upper).all(), name


def test_copy_chain_maps_padding_to_constants():
    graph = build_graph(Padded().double(), (6,)).to(D)
    chains = [copy_chain(graph, n) for n in graph.pre_activation_names()]
    chain = next(c for c in chains if c is not None)
    assert [type(n.op).__name__ for n in chain.nodes][-1] == "PermuteOp"
    # [3, 4] padded to [4, 5]: the 12 source elements once each, 8 constants
    held = chain.index[chain.index >= 0]
    assert sorted(held.tolist()) == list(range(12))
    assert int((chain.index == -1).sum()) == 8
    # the map is the chain itself: applying it to the source's values gives the copy's values
    x = torch.rand(2, 6, dtype=D, generator=torch.Generator().manual_seed(4))
    values = graph.forward(x, all_values=True)
    source, copy = values[chain.source].flatten(1), values[chain.nodes[-1].name].flatten(1)
    kept = chain.index >= 0
    assert torch.equal(copy[:, kept], source[:, chain.index[kept]])
    assert (copy[:, ~kept] == 0.25).all()
