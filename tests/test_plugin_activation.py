"""An activation is one registration: softsign, defined here and registered by its decorator
alone (its torch function, its module class and its ONNX op declared there), is bounded soundly
through an `nn.Module` and through an ONNX file, with nothing else of the library changed.

Softsign `x / (1 + |x|)` is odd, increasing and bounded, convex on `x < 0` and concave on
`x > 0`: the S-shape of `relaxations.s_shaped.MonotoneSRelaxation` (CROWN's lines for S-shaped
activations, Zhang et al. 2018, appendix A; tangent points optimised as in alpha-CROWN)."""

from __future__ import annotations

import copy
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import verify
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import build_graph
from relaxations import available_relaxations, unregister
from relaxations.registry import register
from relaxations.s_shaped import MonotoneSRelaxation
from tests.soundness import box_samples

METHODS = ("ibp", "crown", "alpha-crown")


class SoftsignRelaxation(MonotoneSRelaxation):
    """softsign; the derivative is `1 / (1 + |x|)^2`."""

    name = "softsign"
    output_range = (-1.0, 1.0)

    def f(self, x: Tensor) -> Tensor:
        return x / (1 + x.abs())

    def df(self, x: Tensor) -> Tensor:
        return (1 + x.abs()).square().reciprocal()


@pytest.fixture
def softsign():
    """Softsign registered by its decorator for one test, and unregistered after it."""
    register(
        "softsign", torch=(F.softsign, nn.Softsign), onnx=("Softsign",)
    )(SoftsignRelaxation)  # fmt: skip
    yield
    unregister("softsign")
    assert "softsign" not in available_relaxations()


class _Functional(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.softsign(x)


class _SoftsignOp(torch.autograd.Function):
    """F.softsign exported as one ONNX Softsign node (torch's exporter would write the
    composition `x / (1 + |x|)`)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return F.softsign(x)

    @staticmethod
    def symbolic(g, x):
        return g.op("Softsign", x)


class _Exported(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return _SoftsignOp.apply(x)


def _net(dtype: torch.dtype, first: nn.Module, second: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), first, nn.Linear(6, 5), second, nn.Linear(5, 2))
    return net.to(dtype).eval()


def _assert_sound(net: nn.Module, lower: Tensor, upper: Tensor, found) -> None:
    """The network in float64 at samples and corners of the box lies in the bounds (no
    tolerance)."""
    points = box_samples(lower.double(), upper.double(), 20000)[0]
    with torch.no_grad():
        values = copy.deepcopy(net).double()(points)
    low, up = found.lower.double(), found.upper.double()
    assert bool((low <= values).all()), float((low - values).max())
    assert bool((values <= up).all()), float((values - up).max())
    assert bool((up - low < 10).all())  # finite and not vacuous


def test_unregistered_softsign_is_unsupported():
    with pytest.raises(UnsupportedOperationError, match="Softsign"):
        build_graph(_net(torch.float64, nn.Softsign(), _Functional()), (3,))


@pytest.mark.parametrize("method", METHODS)
def test_module_is_bounded_soundly(softsign, method: str):
    net = _net(torch.float64, nn.Softsign(), _Functional())  # both spellings
    graph = build_graph(net, (3,))
    assert [n.op.relaxation.name for n in graph.activations()] == ["softsign", "softsign"]
    x = torch.tensor([[0.3, -0.2, 0.5]], dtype=torch.float64)
    lower, upper = x - 1.5, x + 1.5
    found = verify.bounds(net, lower=lower, upper=upper, method=method)
    _assert_sound(net, lower, upper, found)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter
@pytest.mark.parametrize("method", METHODS)
def test_onnx_file_is_bounded_soundly(softsign, method: str, tmp_path: Path):
    net = _net(torch.float32, _Exported(), _Exported())
    path = tmp_path / "softsign.onnx"
    example = torch.zeros(1, 3)
    torch.onnx.export(net, (example,), str(path), dynamo=False, opset_version=13,
                      input_names=["x"], output_names=["y"])  # fmt: skip
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count("Softsign") == 2
    gm = verify.load_onnx(path)
    probe = torch.randn(7, 3)
    torch.testing.assert_close(gm(probe), net(probe))
    graph = build_graph(gm, (3,))
    assert [n.op.relaxation.name for n in graph.activations()] == ["softsign", "softsign"]
    x = torch.tensor([[0.3, -0.2, 0.5]])
    lower, upper = x - 1.5, x + 1.5  # float32, exact
    found = verify.bounds(gm, lower=lower, upper=upper, method=method)
    _assert_sound(gm, lower, upper, found)
