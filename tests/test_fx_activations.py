"""Every spelling of an elementwise activation in an `nn.Module` maps to its relaxation with
the right options, and the graph computes what the module computes; CROWN's bounds contain
sampled outputs of each."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import verify
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import build_graph
from relaxations.registry import spellings
from tests.soundness import assert_contains, box_samples

D = torch.float64


class _Apply(nn.Module):
    """`head(act(body(x)))` with `act` a function or a module."""

    def __init__(self, act, channels: bool = False) -> None:
        super().__init__()
        self.body = nn.Conv2d(1, 3, 1).double() if channels else nn.Linear(3, 4).double()
        self.act = act
        self.head = nn.Flatten() if channels else nn.Identity()

    def forward(self, x):
        return self.head(self.act(self.body(x)))


# Spellings that take arguments: an example call each, with the options it gives.
WITH_ARGUMENTS = {
    "F.leaky_relu": (lambda x: F.leaky_relu(x, 0.2), "leaky_relu", {"negative_slope": 0.2}),
    "nn.LeakyReLU": (nn.LeakyReLU(0.3), "leaky_relu", {"negative_slope": 0.3}),
    "nn.PReLU": (nn.PReLU(init=0.25).double(), "leaky_relu", {}),
    "F.hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.7), "hardtanh", {"min": -0.5, "max": 0.7}),
    "nn.ReLU6": (nn.ReLU6(), "hardtanh", {"min": 0.0, "max": 6.0}),
    "torch.clamp": (lambda x: torch.clamp(x, min=-0.2), "hardtanh", {"min": -0.2}),
    "Tensor.clamp": (lambda x: x.clamp(-1, 1), "hardtanh", {"min": -1.0, "max": 1.0}),
    "torch.pow": (lambda x: torch.pow(x, 3), "pow", {}),
    "x ** 2": (lambda x: x**2, "pow", {}),
    "torch.square": (torch.square, "pow", {}),
    "1 / exp": (lambda x: 1.0 / torch.exp(x), "reciprocal", {}),
}
# Relaxations defined on part of the line get their input through this map.
DOMAIN = {"reciprocal": torch.exp}


def _label(target) -> str:
    """`torch.tanh`, `F.tanh`, `nn.Tanh`, `Tensor.tanh`."""
    if isinstance(target, str):
        return f"Tensor.{target}"
    if isinstance(target, type):
        return f"nn.{target.__name__}"
    module = {"torch": "torch", "torch.nn.functional": "F"}.get(target.__module__, "operator")
    return f"{module}.{target.__name__}"


def _call(target, name: str):
    """The registered spelling `target` applied to an input in the relaxation's domain."""
    if isinstance(target, type):
        return target()
    domain = DOMAIN.get(name, lambda x: x)
    if isinstance(target, str):
        return lambda x: getattr(domain(x), target)()
    return lambda x: target(domain(x))


# Every registered spelling without arguments (read from the registry), and the examples.
SPELLINGS = {
    **{
        _label(spelling.target): (_call(spelling.target, name), name, {})
        for name, spelling in spellings()
        if spelling.options is None
    },
    **WITH_ARGUMENTS,
}


def _lambda_module(fn):
    class Wrapped(nn.Module):
        def forward(self, x):
            return fn(x)

    return fn if isinstance(fn, nn.Module) else Wrapped()


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_spelling_maps_to_its_relaxation(spelling):
    fn, name, options = SPELLINGS[spelling]
    net = _Apply(_lambda_module(fn)).eval()
    graph = build_graph(net, (3,))
    relaxations = [n.op.relaxation for n in graph.activations()]
    assert name in [r.name for r in relaxations]
    relaxation = next(r for r in relaxations if r.name == name)
    for key, value in options.items():
        assert float(getattr(relaxation, key)) == pytest.approx(value), key
    x = torch.randn(6, 3, dtype=D)
    torch.testing.assert_close(graph.forward(x), net(x))


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_crown_contains_samples(spelling):
    fn = SPELLINGS[spelling][0]
    net = _Apply(_lambda_module(fn)).eval()
    x = torch.rand(1, 3, dtype=D)
    found = verify.bounds(net, 0.3, x=x, method="crown")
    points = box_samples(x - 0.3, x + 0.3, 2000)
    with torch.no_grad():
        values = net(points[0]).unsqueeze(0)
    assert_contains(found.lower, found.upper, values, tol=1e-7)


def test_per_channel_prelu():
    prelu = nn.PReLU(num_parameters=3).double()
    with torch.no_grad():
        prelu.weight.copy_(torch.tensor([0.1, -0.5, 2.0], dtype=D))
    net = _Apply(prelu, channels=True).eval()
    graph = build_graph(net, (1, 2, 2))
    x = torch.randn(5, 1, 2, 2, dtype=D)
    torch.testing.assert_close(graph.forward(x), net(x))
    found = verify.bounds(net, 0.5, x=x[:1], method="alpha-crown")
    points = box_samples(x[:1] - 0.5, x[:1] + 0.5, 2000)
    with torch.no_grad():
        values = net(points[0]).unsqueeze(0)
    assert_contains(found.lower, found.upper, values)


def test_a_fractional_power_is_refused_with_the_node():
    net = _Apply(_lambda_module(lambda x: torch.pow(x, 0.5))).eval()
    with pytest.raises(UnsupportedOperationError, match="pow"):
        build_graph(net, (3,))
