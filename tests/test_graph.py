"""Graph building: supported layers convert exactly; everything else raises a typed error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bounds.errors import InvalidNetworkError, ShapeMismatchError, UnsupportedOperationError
from bounds.graph.graph import build_graph
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
        (nn.Sequential(nn.Linear(3, 4), nn.ELU()), (3,), "ELU"),
        (
            nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2, return_indices=True)),
            (1, 6, 6),
            "max_pool2d",
        ),
        (nn.Sequential(nn.Linear(3, 4), nn.GELU()), (3,), "GELU"),
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


class _Erf(nn.Module):
    def forward(self, x):
        return torch.erf(x)


class _InputWeight(nn.Module):
    def forward(self, x):
        return torch.nn.functional.linear(x, x)


def test_a_square_of_an_activation_is_the_pow_relaxation():
    net = _Square().double()
    graph = build_graph(net, (3,))
    names = [n.op.relaxation.name for n in graph.activations()]
    assert names == ["pow"]
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(graph.forward(x), net(x))


def test_functional_without_a_relaxation_is_unsupported():
    with pytest.raises(UnsupportedOperationError, match="erf"):
        build_graph(_Erf(), (3,))


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


# --- shape and linear ops traced from nn.Modules (issue 12) -------------------------------------


class _Shapes(nn.Module):
    """Slicing, split, cat with a constant token, permute, pad, upsampling, transposed conv,
    where, reductions with broadcasting, matmul on both sides and stack, with ReLUs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.token = nn.Parameter(torch.randn(1, 2, 1, 4))
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")
        self.near = nn.Upsample(size=(5, 9), mode="nearest")
        self.ct = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1)
        self.register_buffer("mask", torch.rand(3, 10, 36) > 0.5)
        self.register_buffer("left", torch.randn(4, 10))

    def forward(self, x):  # x: [N, 2, 3, 6]
        h = torch.relu(self.fc(x))  # nn.Linear on the last axis of a 3-D sample
        a, b = torch.split(h, [1, 1], dim=1)
        c = torch.cat([a, self.token.expand(x.shape[0], -1, 3, -1), b], 1)  # [N, 4, 3, 4]
        p = c.permute(0, 3, 1, 2)[:, 1:3, ..., ::2]  # [N, 2, 4, 2]
        q = torch.relu(self.near(F.pad(p, (1, 1, 0, 2), value=0.3)))  # [N, 2, 5, 9]
        t = self.ct(self.up(q)[:, :, :5])  # [N, 3, 10, 36]
        w = torch.where(self.mask, t, -2 * t)
        z = torch.relu(w.sum(dim=2, keepdim=True) + w.mean(3, keepdim=True))  # [N, 3, 10, 36]
        m = self.left @ z.transpose(2, 3)[:, :, :10]  # [N, 3, 4, 10]
        return torch.stack([m[:, 0], m[:, 2].double().to(torch.float64)], dim=1).flatten(1)


def _shapes_net() -> nn.Module:
    torch.manual_seed(0)
    return _Shapes().double().eval()


def test_shape_ops_from_modules_compute_the_module():
    net = _shapes_net()
    graph = build_graph(net, (2, 3, 6))
    x = torch.randn(5, 2, 3, 6, dtype=torch.float64)
    torch.testing.assert_close(graph.forward(x), net(x))
    kinds = {type(n.op).__name__ for n in graph.nodes[1:]}
    expected = {"IndexOp", "ConcatOp", "PermuteOp", "PadOp", "MatMulOp", "ConvTransposeOp",
                "ReduceOp", "ExpandOp", "SumOp"}  # fmt: skip
    assert expected <= kinds


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown"])
def test_shape_ops_from_modules_bounds_contain_samples(method):
    from tests.soundness import assert_contains, box_samples, spec_values
    from verify import bounds

    net = _shapes_net()
    graph = build_graph(net, (2, 3, 6))
    x = torch.randn(1, 2, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lower, upper = x - 0.05, x + 0.05
    n_out = graph.output.shape[0]
    C = torch.randn(1, 6, n_out, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    result = bounds(graph, lower=lower, upper=upper, C=C, method=method)
    values = spec_values(net, box_samples(lower, upper, 300), C)
    assert_contains(result.lower, result.upper, values, tol=1e-8)


class _Indexing(nn.Module):
    def forward(self, x):  # [N, 4, 5]
        picked = x[:, [3, 0, 0], None, -1]  # one list index, a new axis, an int
        return torch.cat(
            [picked.flatten(1), x.chunk(2, dim=2)[1].sum((1, 2), keepdim=False)[:, None]], 1
        )


def test_indexing_with_lists_none_and_ints():
    net = _Indexing().double()
    graph = build_graph(net, (4, 5))
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(graph.forward(x), net(x))


class _Lambda(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.register_buffer("dtype_probe", torch.zeros(()))  # the graph takes its dtype

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize(
    "fn, operation",
    [
        (lambda x: x[0], "getitem"),
        (lambda x: x[:, x[0, :, 0, 0] > 0], "getitem"),
        (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), "pad"),
        (lambda x: x.sum(), "sum"),
        (lambda x: x.permute(1, 0, 2, 3), "permute"),
        (lambda x: x.to(torch.float16), "cast"),
        (lambda x: x.float(), "cast"),  # the module is float64: rounds
        (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), "interpolate"),
    ],
    ids=[
        "batch_index",
        "mask",
        "reflect_pad",
        "sum_all",
        "permute_batch",
        "half_cast",
        "narrowing_cast",
        "bicubic",
    ],
)
def test_unsupported_shape_forms_name_the_operation(fn, operation):
    with pytest.raises(UnsupportedOperationError) as info:
        build_graph(_Lambda(fn).double().eval(), (2, 3, 4))
    assert info.value.operation in (operation, "getattr", "gt")
    assert info.value.node in str(info.value)


def test_batchnorm_folds_into_the_conv_before_it():
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.BatchNorm2d(3))
    with torch.no_grad():
        for bn in (net[1], net[3]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(-2, 2)
    net = net.double().eval()
    graph = build_graph(net, (2, 5, 5))
    kinds = [type(n.op).__name__ for n in graph.nodes[1:]]
    assert kinds == ["ConvOp", "ActivationOp", "ElementwiseAffineOp"]  # folded; after ReLU: its own
    x = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(graph.forward(x), net(x))
