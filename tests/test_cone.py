"""The output cone (`bounds.graph.cone`): CROWN bounds only the neurons a specification's rows
depend on; the bounds on those rows are the same as with every neuron bounded, and the
intervals stay sound."""

from __future__ import annotations

import torch
from torch import nn

from bounds.graph.cone import output_cone, spec_cone
from bounds.graph.graph import build_graph
from bounds.methods import crown
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.types import Interval
from tests.soundness import box_samples


class Blocks(nn.Module):
    """Convolutions with a residual sum, pooling and a 1x1 head, one output map per class."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)
        self.pool, self.c3 = nn.AvgPool2d(2), nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Conv2d(3, 2, 1)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        h = torch.relu(h + self.c2(h))
        return self.head(torch.relu(self.c3(self.pool(h)))).flatten(1)


def _setup(eps: float = 0.4):
    torch.manual_seed(0)
    net = Blocks().double().eval()
    graph = build_graph(net, (2, 12, 12))
    gen = torch.Generator().manual_seed(1)
    center = torch.randn(2, 2, 12, 12, dtype=torch.float64, generator=gen)
    box = Interval(center - eps, center + eps)
    C = torch.zeros(2, 2, 72, dtype=torch.float64)
    C[:, 0, 7] = 1.0  # class 0 at (1, 1) of the 6 x 6 map
    C[:, 1, 36 + 7], C[:, 1, 7] = 1.0, -1.0
    return net, graph, box, C


def test_the_cone_is_the_receptive_field():
    """Position (1, 1) of the 6 x 6 head: rows and columns 0..2 of c3's input (the pooled
    map), 0..5 of the residual sum, 0..6 of c1's output (c2 reads one more), 0..7 of the
    input."""
    _, graph, _, C = _setup()
    cone = spec_cone(graph, C)
    counts = {n.name: int(cone[n.name].sum()) for n in graph.nodes}
    assert counts[graph.input.name] == 2 * 8 * 8
    first = graph.consumers(graph.input.name)[0].name  # c1
    assert counts[first] == 3 * 7 * 7
    assert spec_cone(graph, C) is cone  # cached on the graph


def test_every_output_weighed_means_no_cone():
    _, graph, _, _ = _setup()
    assert spec_cone(graph, torch.ones(1, 1, 72, dtype=torch.float64)) is None


def test_cancelling_weights_do_not_hide_a_neuron():
    """A difference kernel `[1, -1]` on a constant functional sums to zero: the random draws
    keep both inputs in the cone."""
    net = nn.Sequential(
        nn.Conv2d(1, 1, (1, 2), bias=False), nn.ReLU(), nn.Conv2d(1, 1, (1, 2), bias=False)
    )
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[[[1.0, -1.0]]]]))
        net[2].weight.copy_(torch.tensor([[[[1.0, 1.0]]]]))
    graph = build_graph(net.double().eval(), (1, 1, 4))
    outputs = torch.tensor([False, True])
    cone = output_cone(graph, outputs)
    assert cone[graph.input.name].tolist() == [False, True, True, True]


def test_bounds_with_the_cone_equal_bounds_without():
    """CROWN and alpha-CROWN on the rows: the same bounds as with every neuron bounded (the
    neurons outside the cone have zero coefficients), and fewer neurons bounded."""
    _, graph, box, C = _setup()
    cone = spec_cone(graph, C)
    full = crown.crown_intervals(graph, box)
    low, up = crown.output_bounds(graph, box, C, full, True)
    got_low, got_up, intervals = crown.crown(graph, box, C)
    torch.testing.assert_close(got_low, low, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_up, up, rtol=1e-12, atol=1e-12)
    left_out = sum(
        int((intervals[n].upper - intervals[n].lower > full[n].upper - full[n].lower).sum())
        for n in crown.needs_crown(graph)
    )
    assert left_out > 0
    for n in crown.needs_crown(graph):  # inside the cone: CROWN's intervals
        inside = cone[n]
        torch.testing.assert_close(
            intervals[n].lower.flatten(1)[:, inside], full[n].lower.flatten(1)[:, inside]
        )
    config = AlphaCrownConfig(iterations=3, compile=False)
    a_low = alpha_crown(graph, box, C, config)[0]
    assert (a_low >= got_low - 1e-9).all()


def test_intervals_with_the_cone_contain_samples():
    _, graph, box, C = _setup(eps=0.6)
    _, _, intervals = crown.crown(graph, box, C)
    points = box_samples(box.lower, box.upper, 200)
    values = graph.forward(points.flatten(0, 1), all_values=True)
    for node in graph.nodes[1:]:
        v = values[node.name].reshape(2, -1, *node.shape)
        iv = intervals[node.name]
        assert (iv.lower.unsqueeze(1) <= v).all() and (v <= iv.upper.unsqueeze(1)).all(), node.name
