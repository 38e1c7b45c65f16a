"""Graph building: supported layers convert exactly; everything else raises a typed error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bounds.errors import InvalidNetworkError, ShapeMismatchError, UnsupportedOperationError
from bounds.graph import build_graph
from tests.model_zoo import ZOO, make


@pytest.mark.parametrize("name", list(ZOO))
def test_graph_computes_the_module(name):
    net, shape = make(name)
    graph = build_graph(net, shape)
    x = torch.randn(5, *shape, dtype=torch.float64)
    torch.testing.assert_close(graph.forward(x), net(x))


@pytest.mark.parametrize(
    "module, shape, operation",
    [
        (nn.Sequential(nn.Linear(3, 4), nn.Sigmoid()), (3,), "Sigmoid"),
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2)), (1, 6, 6), "MaxPool2d"),
        (nn.Sequential(nn.Linear(3, 4), nn.Tanh()), (3,), "Tanh"),
    ],
)
def test_unsupported_module_names_operation_and_node(module, shape, operation):
    with pytest.raises(UnsupportedOperationError) as info:
        build_graph(module.eval(), shape)
    assert info.value.operation == operation
    assert info.value.node and info.value.node in str(info.value)


class _Square(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        return h * h


class _Sigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


class _InputWeight(nn.Module):
    def forward(self, x):
        return torch.nn.functional.linear(x, x)


def test_product_of_activations_is_unsupported():
    with pytest.raises(UnsupportedOperationError, match="mul"):
        build_graph(_Square(), (3,))


def test_functional_sigmoid_is_unsupported():
    with pytest.raises(UnsupportedOperationError, match="sigmoid"):
        build_graph(_Sigmoid(), (3,))


def test_weight_depending_on_input_is_rejected():
    with pytest.raises(InvalidNetworkError, match="depends on the input"):
        build_graph(_InputWeight(), (3,))


def test_nan_weights_are_rejected():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        net[2].weight[0, 1] = float("nan")
    with pytest.raises(InvalidNetworkError, match="NaN or Inf"):
        build_graph(net, (3,))


def test_batchnorm_in_training_mode_is_rejected():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    with pytest.raises(InvalidNetworkError, match="eval"):
        build_graph(net.train(), (3,))


def test_wrong_input_shape_is_a_shape_error():
    with pytest.raises(ShapeMismatchError, match="rejects inputs"):
        build_graph(nn.Sequential(nn.Linear(5, 2)), (4,))


def test_reshape_mixing_the_batch_is_unsupported():
    class Mix(nn.Module):
        def forward(self, x):
            return x.reshape(1, -1)

    with pytest.raises(UnsupportedOperationError, match="batch"):
        build_graph(Mix(), (3,))


def test_avgpool_without_padding_counts_matches():
    net = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.AvgPool2d(3, 2, 1, count_include_pad=False)
    )
    net = net.double().eval()
    graph = build_graph(net, (1, 7, 7))
    x = torch.randn(4, 1, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(graph.forward(x), net(x))


def test_residual_graph_has_a_two_input_node():
    net, shape = make("residual")
    graph = build_graph(net, shape)
    assert any(len(n.inputs) == 2 for n in graph.nodes)
    assert len(list(graph.activations())) == 3
