"""The forward method (`bounds.methods.forward`): its intervals are IBP's intersected with the
forward functions' range (never looser than IBP's, at every node), its functions hold at
sampled points, and input splitting with it answers as with CROWN."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import verify
from bounds.graph.graph import build_graph
from bounds.methods.forward import (
    concretize,
    forward_intervals,
    input_functions,
    node_functions,
    sizes,
)
from bounds.types import Interval
from tests.model_zoo import ZOO, make
from tests.soundness import box_samples
from verify.bab.config import BabConfig
from verify.bab.input.search import RegionBab
from verify.property import Polytope, Region

D = torch.float64


@pytest.mark.parametrize("name", list(ZOO))
def test_never_looser_than_ibp(name):
    net, shape = make(name)
    x = torch.rand(2, *shape, generator=torch.Generator().manual_seed(1), dtype=D)
    forward = verify.bounds(net, 0.1, x=x, method="forward")
    ibp = verify.bounds(net, 0.1, x=x, method="ibp")
    assert bool((forward.lower >= ibp.lower).all() and (forward.upper <= ibp.upper).all())
    for node, iv in forward.intermediate.items():
        other = ibp.intermediate[node]
        assert bool((iv.lower >= other.lower).all() and (iv.upper <= other.upper).all()), node


@pytest.mark.parametrize("name", ["mlp", "conv", "residual", "normalised", "tanh_mlp"])
def test_functions_hold_at_sampled_points(name):
    """At every node with functions, `F_low(x) - slack <= v(x) <= F_up(x) + slack` at sampled
    points and corners (float64, no tolerance), and their range contains the values."""
    net, shape = make(name)
    graph = build_graph(net, shape)
    gen = torch.Generator().manual_seed(2)
    centre = torch.rand(1, *shape, generator=gen, dtype=D)
    box = Interval(centre - 0.3, centre + 0.3)
    intervals = forward_intervals(graph, box)
    points = box_samples(box.lower, box.upper, 300)[0]
    values = graph.forward(points, all_values=True)
    functions = {graph.input.name: input_functions(box)}
    flat = points.flatten(1)
    checked = 0
    for node in graph.nodes[1:]:
        inputs = [functions.get(i) for i in node.inputs]
        if any(f is None for f in inputs):
            continue
        found = node_functions(graph, node, inputs, box, intervals, True)
        if found is None:
            continue
        functions[node.name] = found
        n = flat.shape[1]
        low = torch.einsum("bk...,pk->p...", found.low[:, :n], flat) + found.low[:, n]
        up = torch.einsum("bk...,pk->p...", found.up[:, :n], flat) + found.up[:, n]
        v = values[node.name]
        assert bool((low - found.slack <= v).all() and (v <= up + found.slack).all()), node.name
        iv = concretize(found, box)
        assert bool((iv.lower <= v).all() and (v <= iv.upper).all()), node.name
        assert bool((sizes(found, box) >= v.abs()).all()), node.name
        checked += 1
    assert checked >= 3


def test_input_splitting_with_forward_bounds():
    """'unsat' above the sampled minimum by a margin and 'sat' below it, as with CROWN."""
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(3, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(),
                        nn.Linear(12, 2))  # fmt: skip
    lower, upper = -torch.ones(3, dtype=D), torch.ones(3, dtype=D)
    C = torch.tensor([[1.0, -1.0]], dtype=D)
    points = box_samples(lower[None].float(), upper[None].float(), 20000, 0)[0]
    with torch.no_grad():
        low = float((net(points) @ C.float().T).min())
    config = BabConfig(splitting="input", method="forward")
    for threshold, expect in ((low - 0.05, "unsat"), (low + 0.05, "sat")):
        region = Region(lower.numpy(), upper.numpy(),
                        (Polytope(C.numpy(), torch.tensor([threshold], dtype=D).numpy()),))  # fmt: skip
        outcome = RegionBab(net, region, config).run(time.monotonic() + 20)
        assert outcome.status == expect
