"""Every method on every zoo net: sampled points and box corners inside the bounds, exact
bounds on linear nets, and the chain CROWN <= alpha-CROWN <= LP <= MILP <= sampled minimum."""

from __future__ import annotations

import itertools

import pytest
import torch

import verify
from bounds.lp.lp import milp, planet_lp
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown
from tests.model_zoo import ZOO, make
from tests.soundness import assert_contains, box_samples, spec_values

D = torch.float64
FAST_METHODS = ["ibp", "crown", "alpha-crown", "forward"]


def _region(shape, batch=2, eps=0.2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, *shape, generator=gen, dtype=D)
    return x, eps


def _spec(net, shape, batch=2, specs=3, seed=0):
    gen = torch.Generator().manual_seed(seed + 7)
    n_out = net(torch.zeros(1, *shape, dtype=D)).shape[-1]
    return torch.randn(batch, specs, n_out, generator=gen, dtype=D)


@pytest.mark.parametrize("method", FAST_METHODS)
@pytest.mark.parametrize("name", list(ZOO))
def test_sampled_points_inside_bounds(name, method):
    net, shape = make(name)
    x, eps = _region(shape)
    C = _spec(net, shape)
    result = verify.bounds(net, eps, x=x, C=C, method=method)
    assert (result.lower <= result.upper).all()
    points = box_samples(x - eps, x + eps, 500)
    assert_contains(result.lower, result.upper, spec_values(net, points, C))


@pytest.mark.parametrize("method", FAST_METHODS)
@pytest.mark.parametrize("name", ["mlp", "conv", "residual", "normalised"])
def test_intermediate_bounds_contain_sampled_pre_activations(name, method):
    net, shape = make(name)
    x, eps = _region(shape, eps=0.3)
    result = verify.bounds(net, eps, x=x, method=method)
    graph = verify.network_graph(net, shape)
    points = box_samples(x - eps, x + eps, 300)[0]
    values = graph.forward(points, all_values=True)
    assert set(result.intermediate) == set(graph.pre_activation_names())
    for node, iv in result.intermediate.items():
        assert (values[node] >= iv.lower[0] - 1e-9).all(), node
        assert (values[node] <= iv.upper[0] + 1e-9).all(), node


@pytest.mark.parametrize("method", ["crown", "alpha-crown", "lp"])
def test_linear_net_bounds_are_exact(method):
    net, shape = make("linear")
    x, eps = _region(shape)
    C = _spec(net, shape)
    W = net[1].weight @ net[0].weight
    bias = net[1].weight @ net[0].bias + net[1].bias
    M = C @ W  # [B, S, n_in]
    center = (M @ x.unsqueeze(-1)).squeeze(-1) + C @ bias
    radius = eps * M.abs().sum(-1)
    result = verify.bounds(net, eps, x=x, C=C, method=method)
    tol = 1e-5 if method == "lp" else 1e-9
    torch.testing.assert_close(result.lower, center - radius, atol=tol, rtol=0)
    torch.testing.assert_close(result.upper, center + radius, atol=tol, rtol=0)


@pytest.mark.parametrize("name", ["mlp", "deep_mlp", "conv", "residual"])
def test_lp_chain(name):
    """With identical intermediate bounds: CROWN <= alpha-CROWN <= LP <= MILP <= samples."""
    net, shape = make(name)
    x, eps = _region(shape, batch=1, eps=0.25)
    C = _spec(net, shape, batch=1, specs=2)
    graph = verify.network_graph(net, shape)
    box = verify.Interval(x - eps, x + eps)
    low_c, up_c, intervals = crown(graph, box, C)
    config = AlphaCrownConfig(iterations=30, optimize_intermediate=False)
    low_a, up_a, _, _ = alpha_crown(graph, box, C, config)
    _, _, lp = planet_lp(graph, box, C, intervals)
    samples = spec_values(net, box_samples(box.lower, box.upper, 2000), C)[0]
    lows = [low_c[0], low_a[0], lp["raw"][0, :2], samples.min(0).values]
    ups = [up_c[0], up_a[0], -lp["raw"][0, 2:], samples.max(0).values]
    n_relu = sum(int(torch.Size(n.shape).numel()) for n in graph.activations())
    if n_relu <= 60:  # the MILP's time grows exponentially with the ReLU count
        _, _, exact = milp(graph, box, C, intervals)
        lows.insert(3, exact["raw"][0, :2])
        ups.insert(3, -exact["raw"][0, 2:])
    for weaker, stronger in itertools.pairwise(lows):
        assert (weaker <= stronger + 1e-6).all(), (lows, name)
    for weaker, stronger in itertools.pairwise(ups):
        assert (weaker >= stronger - 1e-6).all(), (ups, name)


def test_alpha_crown_reaches_the_lp_with_fixed_intermediate_bounds():
    net, shape = make("mlp", seed=3)
    x, eps = _region(shape, batch=1, eps=0.3)
    C = _spec(net, shape, batch=1, specs=2)
    graph = verify.network_graph(net, shape)
    box = verify.Interval(x - eps, x + eps)
    _, _, intervals = crown(graph, box, C)
    config = AlphaCrownConfig(iterations=300, lr=0.05, optimize_intermediate=False, tolerance=0)
    low_a, _, _, _ = alpha_crown(graph, box, C, config)
    _, _, lp = planet_lp(graph, box, C, intervals)
    gap = lp["raw"][0, :2] - low_a[0]
    assert (gap >= -1e-6).all() and (gap <= 1e-3 * (1 + lp["raw"][0, :2].abs())).all()


def test_float32_network_bounds_contain_samples():
    net, shape = make("normalised", dtype=torch.float32)
    x = torch.rand(3, *shape)
    result = verify.bounds(net, 0.05, x=x, method="alpha-crown")
    points = box_samples(x - 0.05, x + 0.05, 300).float()
    C = torch.eye(3).expand(3, 3, 3)
    assert_contains(result.lower, result.upper, spec_values(net, points, C), tol=1e-4)
