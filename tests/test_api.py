"""`verify.bounds`: regions, specs, budgets, caching and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import verify
from tests.model_zoo import make
from tests.soundness import assert_contains, box_samples, spec_values

D = torch.float64


@pytest.fixture
def mlp():
    return make("mlp")


def test_default_spec_is_the_outputs(mlp):
    net, shape = mlp
    x = torch.rand(2, *shape, dtype=D)
    result = verify.bounds(net, 0.1, x=x, method="crown")
    assert result.lower.shape == (2, 3) and result.upper.shape == (2, 3)
    assert result.stats["method"] == "crown" and result.stats["seconds"] > 0


def test_box_region_equals_ball_region(mlp):
    net, shape = mlp
    x = torch.rand(2, *shape, dtype=D)
    ball = verify.bounds(net, 0.1, x=x, method="crown")
    box = verify.bounds(net, lower=x - 0.1, upper=x + 0.1, method="crown")
    torch.testing.assert_close(ball.lower, box.lower)


def test_domain_clips_the_ball(mlp):
    net, shape = mlp
    x = torch.rand(1, *shape, dtype=D)
    clipped = verify.bounds(net, 0.5, x=x, domain=(0.0, 1.0), method="crown")
    box = verify.bounds(
        net, lower=(x - 0.5).clamp(0, 1), upper=(x + 0.5).clamp(0, 1), method="crown"
    )
    torch.testing.assert_close(clipped.lower, box.lower)


def test_shared_2d_spec_and_per_example_eps(mlp):
    net, shape = mlp
    x = torch.rand(2, *shape, dtype=D)
    C = torch.tensor([[1.0, -1.0, 0.0]], dtype=D)
    eps = torch.tensor([[0.05], [0.2]], dtype=D)
    result = verify.bounds(net, eps, x=x, C=C, method="crown")
    assert result.lower.shape == (2, 1)
    points = box_samples(x - eps, x + eps, 500)
    assert_contains(result.lower, result.upper, spec_values(net, points, C.expand(2, 1, 3)))


def test_budget_zero_iterations_gives_crown(mlp):
    net, shape = mlp
    x = torch.rand(1, *shape, dtype=D)
    crown = verify.bounds(net, 0.3, x=x, method="crown")
    alpha0 = verify.bounds(net, 0.3, x=x, method="alpha-crown", budget=verify.Budget(iterations=0))
    torch.testing.assert_close(alpha0.lower, crown.lower)
    alpha = verify.bounds(net, 0.3, x=x, method="alpha-crown", iterations=10)
    assert (alpha.lower >= crown.lower - 1e-12).all()


def test_time_budget_returns_a_sound_bound(mlp):
    net, shape = mlp
    x = torch.rand(1, *shape, dtype=D)
    result = verify.bounds(net, 0.3, x=x, method="alpha-crown", budget=1e-3, iterations=1000)
    assert result.stats["iterations"] < 1000
    points = box_samples(x - 0.3, x + 0.3, 500)
    assert_contains(
        result.lower, result.upper, spec_values(net, points, torch.eye(3, dtype=D)[None])
    )


def test_graph_cache_follows_weight_changes(mlp):
    net, shape = mlp
    x = torch.rand(1, *shape, dtype=D)
    before = verify.bounds(net, 0.1, x=x, method="ibp")
    with torch.no_grad():
        net[-1].bias += 1.0
    after = verify.bounds(net, 0.1, x=x, method="ibp")
    torch.testing.assert_close(after.lower, before.lower + 1.0)


def test_input_shape_attribute_allows_unbatched_x(mlp):
    net, shape = mlp
    net.input_shape = shape
    result = verify.bounds(net, 0.1, x=torch.rand(*shape, dtype=D), method="crown")
    assert result.lower.shape == (1, 3)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"eps": -0.1}, verify.InvalidRegionError, "eps must be >= 0"),
        ({"eps": float("nan")}, verify.InvalidRegionError, "NaN"),
        ({"eps": None}, verify.InvalidRegionError, "needs both x and eps"),
        ({"x": torch.zeros(2, 5, dtype=D)}, verify.ShapeMismatchError, "rejects inputs"),
        ({"C": torch.zeros(2, 1, 4, dtype=D)}, verify.ShapeMismatchError, "n_out=3"),
        ({"method": "nope"}, ValueError, "available"),
        ({"iterationz": 3, "method": "alpha-crown"}, TypeError, "unknown options"),
        ({"x": torch.full((2, 4), float("inf"), dtype=D)}, verify.InvalidRegionError, "NaN or Inf"),
        ({"domain": (1.0, 0.0)}, verify.InvalidRegionError, "domain"),
    ],
)
def test_bad_input_gets_a_clear_error(mlp, kwargs, error, match):
    net, _ = mlp
    args = {"eps": 0.1, "x": torch.zeros(2, 4, dtype=D), "method": "crown", **kwargs}
    eps = args.pop("eps")
    with pytest.raises(error, match=match):
        verify.bounds(net, eps, **args)


def test_empty_box_is_rejected_with_the_index(mlp):
    net, _ = mlp
    lower = torch.zeros(1, 4, dtype=D)
    upper = lower.clone()
    upper[0, 2] = -1.0
    with pytest.raises(verify.InvalidRegionError, match=r"\(0, 2\)"):
        verify.bounds(net, lower=lower, upper=upper)
    with pytest.raises(verify.InvalidRegionError, match="zero elements"):
        verify.bounds(net, lower=torch.zeros(0, 4), upper=torch.zeros(0, 4))


def test_unsupported_layer_is_named():
    net = nn.Sequential(nn.Linear(3, 3), nn.GELU())
    with pytest.raises(verify.UnsupportedOperationError, match="GELU"):
        verify.bounds(net, 0.1, x=torch.zeros(1, 3))


def test_nan_weights_are_rejected():
    net = nn.Sequential(nn.Linear(3, 3))
    with torch.no_grad():
        net[0].bias[1] = float("inf")
    with pytest.raises(verify.InvalidNetworkError):
        verify.bounds(net, 0.1, x=torch.zeros(1, 3))


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown", "prox", "lp"])
def test_relu_split_children_are_sound_on_their_subdomains(method):
    """Split one ambiguous neuron: each child's bound holds on the points of its half."""
    net, shape = make("mlp", seed=0)
    x = torch.rand(1, *shape, generator=torch.Generator().manual_seed(0), dtype=D)
    eps = 0.6
    parent = verify.bounds(net, eps, x=x, method="crown")
    graph = verify.network_graph(net, shape)
    name = graph.pre_activation_names()[1]
    iv = parent.intermediate[name]
    ambiguous = ((iv.lower < 0) & (iv.upper > 0))[0].nonzero().flatten()
    assert ambiguous.numel(), "the test needs an ambiguous neuron"
    j = int(ambiguous[0])
    points = box_samples(x - eps, x + eps, 3000)
    pre = graph.forward(points[0], all_values=True)[name][:, j]
    inf = torch.full((1, *graph[name].shape), float("inf"), dtype=D)
    for active in (True, False):
        lower, upper = -inf.clone(), inf.clone()
        if active:
            lower[0, j] = 0.0
        else:
            upper[0, j] = 0.0
        child = verify.bounds(net, eps, x=x, method=method, node_bounds={name: (lower, upper)})
        keep = pre >= 0 if active else pre <= 0
        values = spec_values(net, points[:, keep], torch.eye(3, dtype=D)[None])
        assert_contains(child.lower, child.upper, values)
        assert (
            (child.intermediate[name].lower[0, j] >= 0)
            if active
            else (child.intermediate[name].upper[0, j] <= 0)
        )


def test_node_bounds_are_validated(mlp):
    net, shape = mlp
    x = torch.rand(1, *shape, dtype=D)
    with pytest.raises(verify.ShapeMismatchError, match="unknown node"):
        verify.bounds(net, 0.1, x=x, node_bounds={"nope": (0.0, 1.0)})
