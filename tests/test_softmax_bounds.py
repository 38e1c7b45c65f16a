"""Softmax in networks (bounds/fx_nonlinear.py `softmax`, relaxations/softmax.py): CROWN,
alpha-CROWN (intermediate slopes optimised too), IBP and the LP contain sampled outputs of
small nets ending in softmax, with moderate and huge (+-1e4) logit ranges, in float64 and
float32; softmax over 1, 2 and many entries and over an inner axis; and the ONNX path on an
exported net with Softmax."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import verify
from bounds.graph.graph import build_graph
from tests.soundness import assert_contains, box_samples

D, F = torch.float64, torch.float32


class SoftmaxHead(nn.Module):
    """`softmax(scale * mlp(x), dim)`: `scale` sets the logits' range."""

    def __init__(self, n_in: int, n_out: int, scale: float, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(n_in, 12), nn.ReLU(), nn.Linear(12, n_out))
        self.scale = scale

    def forward(self, x):
        return torch.softmax(self.scale * self.body(x), dim=-1)


class InnerAxis(nn.Module):
    """Softmax over axis 1 of `[B, 4, 3]` (not the last one), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a, self.out = nn.Linear(3, 3), nn.Linear(12, 2)

    def forward(self, x):  # x: [B, 4, 3]
        return self.out(torch.softmax(5.0 * self.a(x), dim=1).flatten(1))


def check(net: nn.Module, shape, eps: float, dtype, methods, samples: int = 3000) -> dict:
    net = net.to(dtype)
    graph = build_graph(net, shape).to(dtype)
    x = torch.rand(1, *shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    lower, upper = x - eps, x + eps
    points = box_samples(lower, upper, samples, seed=2)
    exact = copy.deepcopy(net).double()  # the function itself: float64
    with torch.no_grad():
        values = exact(points[0].double()).reshape(1, points.shape[1], -1)
        ours = graph.forward(points[0]).reshape(values.shape).double()
    # float32 rounds the logit differences by ~1e-7 of the logits' size (1e4 here).
    torch.testing.assert_close(ours, values, rtol=0, atol=1e-12 if dtype == D else 1e-3)
    tol = 1e-9 if dtype == D else 1e-5
    found = {}
    for method in methods:
        options = {"iterations": 15} if method == "alpha-crown" else {}
        result = verify.bounds(graph, lower=lower, upper=upper, method=method, **options)
        assert torch.isfinite(result.lower).all() and torch.isfinite(result.upper).all()
        assert_contains(result.lower, result.upper, values, tol=tol)
        found[method] = result
    return found


@pytest.mark.parametrize("dtype", [D, F], ids=["float64", "float32"])
@pytest.mark.parametrize("scale", [1.0, 30.0, 1e4], ids=["moderate", "large", "huge"])
def test_softmax_head_bounds_contain_samples(dtype, scale):
    found = check(SoftmaxHead(3, 6, scale), (3,), 0.5, dtype, ("ibp", "crown", "alpha-crown"))
    for result in found.values():
        assert (result.lower >= 0).all() and (result.upper <= 1 + 1e-6).all()


def test_huge_logits_ranges_are_bounded_and_tight_where_decided():
    """Logit differences of thousands: bounds stay in [0, 1], and a box where one logit wins by
    far gets that output's lower bound near 1."""
    net = SoftmaxHead(2, 4, 1e4, seed=5).double()
    graph = build_graph(net, (2,)).to(D)
    x = torch.tensor([[0.3, -0.2]], dtype=D)
    for eps in (1e-6, 0.5):
        result = verify.bounds(graph, lower=x - eps, upper=x + eps, method="crown")
        # in [0, 1] up to the outward rounding of the last concretisation (bounds.rounding)
        slack = 8 * torch.finfo(D).eps
        assert (result.lower >= -slack).all() and (result.upper <= 1 + slack).all()
    tight = verify.bounds(graph, lower=x - 1e-6, upper=x + 1e-6, method="crown")
    winner = int(net(x).argmax())
    assert tight.lower[0, winner] > 0.99


def test_lp_bounds_contain_samples():
    check(SoftmaxHead(2, 3, 2.0), (2,), 0.3, D, ("lp",), samples=1000)


def test_one_two_and_inner_axis():
    """One entry (the constant 1), two (a sigmoid of the difference), and an inner axis."""
    check(SoftmaxHead(3, 1, 5.0), (3,), 0.5, D, ("crown", "alpha-crown"))
    check(SoftmaxHead(3, 2, 1e3), (3,), 0.5, D, ("crown", "alpha-crown"))
    check(InnerAxis(), (4, 3), 0.3, D, ("crown", "alpha-crown"))


def test_onnx_softmax_net(tmp_path):
    """An exported net with Softmax loads, follows the module, and its bounds are sound."""
    net = SoftmaxHead(3, 5, 1e4, seed=2).eval()
    path = tmp_path / "softmax.onnx"
    torch.onnx.export(net, (torch.zeros(1, 3),), str(path), dynamo=False, opset_version=13)
    import onnx

    assert any(node.op_type == "Softmax" for node in onnx.load(str(path)).graph.node)
    gm = verify.load_onnx(path)
    check(gm, tuple(gm.input_shape), 0.5, D, ("crown", "alpha-crown"))
