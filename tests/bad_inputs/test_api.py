"""Bad arguments of `verify.bounds`: a typed error naming the argument and the index, the model
left as it was; and no stale state: a changed module is bounded as it is now."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import verify
from bounds.errors import InvalidLimitError, UnsupportedOperationError
from bounds.lp.lp import SAFETY
from bounds.types import Budget
from tests.bad_inputs.conftest import raises_where, unchanged_module
from tests.soundness import assert_contains, box_samples

D = torch.float64


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).double().eval()


def bn_net() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).double()


def _x(value: float = 0.5) -> torch.Tensor:
    return torch.full((1, 4), value, dtype=D)


def _nan_at(index: tuple[int, int], value: float = float("nan")) -> torch.Tensor:
    x = _x()
    x[index] = value
    return x


BAD_CALLS = [
    # (id, keyword arguments, error, fragments of the message)
    ("x-nan", {"x": _nan_at((0, 2))}, verify.InvalidRegionError, ["x", "(0, 2)"]),
    ("x-inf", {"x": _nan_at((0, 3), float("inf"))}, verify.InvalidRegionError, ["x", "(0, 3)"]),
    ("x-string", {"x": "0.5"}, verify.InvalidRegionError, ["x must be a number"]),
    (
        "x-complex",
        {"x": torch.zeros(1, 4, dtype=torch.complex64)},
        verify.InvalidRegionError,
        ["x", "complex"],
    ),
    ("x-meta", {"x": torch.zeros(1, 4, device="meta")}, verify.InvalidRegionError, ["x", "meta"]),
    ("x-objects", {"x": [[object()] * 4]}, verify.InvalidRegionError, ["x"]),
    (
        "x-wrong-shape",
        {"x": torch.zeros(1, 5, dtype=D)},
        verify.ShapeMismatchError,
        ["rejects inputs"],
    ),
    ("eps-string", {"eps": "0.1"}, verify.InvalidRegionError, ["eps must be a number"]),
    ("eps-nan", {"eps": float("nan")}, verify.InvalidRegionError, ["eps", "NaN"]),
    ("eps-negative", {"eps": -0.1}, verify.InvalidRegionError, ["eps must be >= 0"]),
    (
        "eps-negative-entry",
        {"eps": torch.tensor([[0.1, 0.1, -0.2, 0.1]])},
        verify.InvalidRegionError,
        ["eps", "(0, 2)"],
    ),
    (
        "eps-bad-shape",
        {"eps": torch.full((3,), 0.1)},
        verify.ShapeMismatchError,
        ["eps has shape (3,)"],
    ),
    ("eps-none", {"eps": None}, verify.InvalidRegionError, ["needs both x and eps"]),
    (
        "lower-nan",
        {"eps": None, "x": None, "lower": _nan_at((0, 1)), "upper": _x(1.0)},
        verify.InvalidRegionError,
        ["lower", "(0, 1)"],
    ),
    (
        "lower-above-upper",
        {"eps": None, "x": None, "lower": _x(1.0), "upper": _x(0.0)},
        verify.InvalidRegionError,
        ["(0, 0)"],
    ),
    (
        "lower-only",
        {"eps": None, "x": None, "lower": _x(0.0)},
        verify.InvalidRegionError,
        ["both lower and upper"],
    ),
    (
        "x-outside-domain",
        {"x": _nan_at((0, 1), 2.0), "domain": (0.0, 1.0)},
        verify.InvalidRegionError,
        ["outside the domain", "(0, 1)"],
    ),
    ("domain-reversed", {"domain": (1.0, 0.0)}, verify.InvalidRegionError, ["domain"]),
    ("domain-nan", {"domain": (float("nan"), 1.0)}, verify.InvalidRegionError, ["domain"]),
    ("domain-not-a-pair", {"domain": 1.0}, verify.InvalidRegionError, ["domain must be a pair"]),
    (
        "C-nan",
        {"C": torch.tensor([[1.0, float("nan"), 0.0]])},
        verify.InvalidRegionError,
        ["C", "(0, 1)"],
    ),
    ("C-shape", {"C": torch.zeros(1, 4)}, verify.ShapeMismatchError, ["n_out=3"]),
    (
        "budget-negative",
        {"method": "alpha-crown", "budget": -5},
        InvalidLimitError,
        ["iterations", "-5"],
    ),
    (
        "budget-nan",
        {"method": "alpha-crown", "budget": float("nan")},
        InvalidLimitError,
        ["seconds", "nan"],
    ),
    (
        "budget-string",
        {"method": "alpha-crown", "budget": "10"},
        InvalidLimitError,
        ["budget", "'10'"],
    ),
    (
        "budget-zero-seconds",
        {"method": "prox", "budget": 0.0},
        InvalidLimitError,
        ["seconds", "> 0"],
    ),
    ("budget-bool", {"method": "prox", "budget": True}, InvalidLimitError, ["budget"]),
    ("method-unknown", {"method": "magic"}, ValueError, ["magic", "available"]),
    ("option-typo", {"method": "alpha-crown", "iteratoins": 3}, TypeError, ["iteratoins"]),
    (
        "node-bounds-unknown",
        {"node_bounds": {"nope": (0.0, 1.0)}},
        verify.ShapeMismatchError,
        ["nope"],
    ),
    (
        "node-bounds-nan",
        {"node_bounds": {"_0": (torch.full((1, 16), float("nan")), 1.0)}},
        verify.InvalidRegionError,
        ["node_bounds['_0'].lower", "NaN"],
    ),
    (
        "node-bounds-shape",
        {"node_bounds": {"_0": (torch.zeros(1, 5), 1.0)}},
        verify.ShapeMismatchError,
        ["node_bounds['_0'].lower", "(1, 5)"],
    ),
    (
        "node-bounds-empty",
        {"node_bounds": {"_0": (1.0, torch.zeros(1, 16))}},
        verify.InvalidRegionError,
        ["'_0'", "(0, 0)"],
    ),
    (
        "node-bounds-not-a-pair",
        {"node_bounds": {"_0": 1.0}},
        verify.InvalidRegionError,
        ["node_bounds['_0']"],
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "where"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_arguments_get_a_clear_error(kwargs, error, where):
    net = mlp()
    args = {"eps": 0.1, "x": _x(), "method": "crown", **kwargs}
    eps = args.pop("eps")
    state = torch.get_rng_state()
    with unchanged_module(net), raises_where(error, *where):
        verify.bounds(net, eps, **args)
    assert torch.equal(torch.get_rng_state(), state)


def test_budget_type_is_validated():
    with raises_where(InvalidLimitError, "iterations", "1.5"):
        Budget(iterations=1.5)
    with raises_where(InvalidLimitError, "seconds", "-1"):
        Budget(seconds=-1)


BAD_NETS = [
    ("half", lambda: mlp().half(), ["'0.weight'", "float16", "net.float()"]),
    ("bfloat16", lambda: mlp().bfloat16(), ["bfloat16"]),
    ("meta", lambda: mlp().to("meta"), ["meta device"]),
    ("batchnorm-training", lambda: bn_net().train(), ["BatchNorm1d", "'1'", "training mode"]),
    (
        "dropout-training",
        lambda: nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5)).double().train(),
        ["Dropout", "training mode"],
    ),
    ("not-a-module", lambda: "net.onnx", ["torch.nn.Module"]),
    ("gelu", lambda: nn.Sequential(nn.Linear(4, 3), nn.GELU()).double(), ["GELU"]),
]


@pytest.mark.parametrize(("make", "where"), [c[1:] for c in BAD_NETS], ids=[c[0] for c in BAD_NETS])
def test_bad_networks_are_refused_before_they_run(make, where):
    net = make()
    error = TypeError if isinstance(net, str) else verify.VerificationInputError
    x = torch.full((1, 4), 0.5, dtype=D)
    if isinstance(net, str):
        with raises_where(error, *where):
            verify.bounds(net, 0.1, x=x)
        return
    if any(p.is_meta for p in net.parameters()):  # no values to compare
        with raises_where(error, *where):
            verify.bounds(net, 0.1, x=x)
        return
    with unchanged_module(net), raises_where(error, *where):
        verify.bounds(net, 0.1, x=x)


def test_failed_call_leaves_batchnorm_statistics_alone():
    """The issue's case: a training-mode BatchNorm net used to run once (moving running_mean
    and num_batches_tracked) before the error."""
    net = bn_net().train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(verify.InvalidNetworkError, match="training mode"):
        verify.bounds(net, 0.1, x=torch.zeros(2, 4, dtype=D), method="crown")
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown", "prox"])
def test_a_changed_module_is_never_bounded_from_stale_state(method):
    """The issue's case: replacing a layer (and changing weights in place, or the training flag)
    between two calls must change the bounds to those of the new net."""
    net = mlp(2)
    x = torch.rand(1, 4, dtype=D, generator=torch.Generator().manual_seed(0))
    verify.bounds(net, 0.5, x=x, method=method)
    net[1] = nn.Identity()
    second = verify.bounds(net, 0.5, x=x, method=method)
    _check_sound(net, second, x, 0.5)
    with torch.no_grad():
        net[2].weight.mul_(3.0)
    third = verify.bounds(net, 0.5, x=x, method=method)
    _check_sound(net, third, x, 0.5)


def test_training_flag_flip_after_a_first_call_is_caught():
    net = bn_net().eval()
    x = torch.zeros(1, 4, dtype=D)
    verify.bounds(net, 0.1, x=x, method="crown")
    net.train()
    with raises_where(verify.InvalidNetworkError, "BatchNorm1d", "training mode"):
        verify.bounds(net, 0.1, x=x, method="crown")


def _check_sound(net: nn.Module, result, x: torch.Tensor, eps: float) -> None:
    points = box_samples(x - eps, x + eps, 20_000)
    with torch.no_grad():
        values = net(points.reshape(-1, 4)).reshape(1, -1, 3)
    assert_contains(result.lower, result.upper, values)


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown", "supergradient", "prox", "lp"])
def test_no_method_mutates_the_model_or_the_random_state(method):
    net = mlp(3)
    net.train()  # an MLP's output does not depend on the flag: allowed, and left as it is
    x = torch.rand(2, 4, dtype=D, generator=torch.Generator().manual_seed(1))
    state = torch.get_rng_state()
    with unchanged_module(net):
        verify.bounds(net, 0.2, x=x, method=method)
    assert torch.equal(torch.get_rng_state(), state)
    assert net.training


def test_a_graph_is_a_snapshot_of_the_module():
    """In-place changes of the weights after a build do not reach the built graph."""
    net = mlp(4)
    graph = verify.network_graph(net, (4,))
    x = torch.rand(3, 4, dtype=D, generator=torch.Generator().manual_seed(2))
    before = graph.forward(x)
    with torch.no_grad():
        net[0].weight.zero_()
    assert torch.equal(graph.forward(x), before)
    assert not torch.equal(verify.network_graph(net, (4,)).forward(x), before)


def test_verify_leaves_a_training_mode_model_alone(tmp_path):
    """`verify.verify` verifies the inference network without switching the caller's flags."""
    from tests.bad_inputs.tiny import tiny_vnnlib

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2)).train()
    spec = tiny_vnnlib(tmp_path / "prop.vnnlib")
    with unchanged_module(net):
        result = verify.verify(net, spec, timeout=10)
    assert result.status == "unsat" and net.training


def test_counterexamples_are_validated_on_the_module_as_it_is_now():
    """No stale float64 twin: after a layer is replaced, validation uses the new function."""
    from verify.attack import validate
    from verify.property import Polytope, Region

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1)).eval()
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(2))
        net[0].bias.zero_()
        net[2].weight.fill_(1.0)
        net[2].bias.zero_()
    # unsafe: y >= 1 on the box [0, 1]^2; at x = (1, 1), y = 2 (unsafe)
    region = Region(lower=[0.0, 0.0], upper=[1.0, 1.0], unsafe=(Polytope(A=[[-1.0]], b=[-1.0]),))
    x = torch.ones(1, 2)
    assert validate(net, region, x) is not None
    with torch.no_grad():
        net[2].weight.fill_(0.1)  # now y = 0.2: safe
    assert validate(net, region, x) is None
    net[2] = nn.Linear(2, 1)
    with torch.no_grad():
        net[2].weight.fill_(2.0)
        net[2].bias.zero_()
    assert validate(net, region, x) is not None


class _Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(2, 3), nn.Linear(2, 3), nn.Linear(6, 1)

    def forward(self, x):
        return self.c(torch.relu(torch.cat([self.a(x), self.b(x)], 1)))


def _concat_sampled(method: str) -> tuple[nn.Module, torch.Tensor, verify.Bounds]:
    """`method`'s bounds (CROWN intermediate bounds) on the Concat net around 0 (radius 0.1),
    checked to contain 500 sampled outputs; returns the net, the input and the bounds."""
    net = _Concat().double()
    x = torch.zeros(1, 2, dtype=D)
    found = verify.bounds(net, 0.1, x=x, method=method, intermediate="crown")
    points = box_samples(x - 0.1, x + 0.1, 500)
    with torch.no_grad():
        values = net(points[0]).unsqueeze(0)
    assert_contains(found.lower, found.upper, values, tol=1e-6)
    return net, x, found


@pytest.mark.parametrize("method", ["prox", "supergradient"])
def test_the_decomposition_bounds_a_concat(method):
    """The decomposition reads the same graph (a Concat feeding a ReLU): its bounds hold on
    samples and are no tighter than the LP's for the same intermediate bounds (a dual bound,
    float64)."""
    net, x, found = _concat_sampled(method)
    exact = verify.bounds(net, 0.1, x=x, method="lp", intermediate="crown")
    slack = 2 * SAFETY  # the LP's bounds are its optima loosened by SAFETY (relative)
    assert (found.lower <= exact.lower + slack * (1 + exact.lower.abs())).all()
    assert (found.upper >= exact.upper - slack * (1 + exact.upper.abs())).all()


def test_the_lp_encodes_a_concat():
    """The LP reads every affine op of the graph (Concat included): its bounds hold."""
    _concat_sampled("lp")


class _OverAnActivation(nn.Module):
    """`1 / (w x + b)`: bounded only where the denominator's interval excludes 0."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2).double()

    def forward(self, x):
        return 1.0 / self.fc(x)


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown"])
def test_a_relaxation_outside_its_domain_names_the_node(method):
    net = _OverAnActivation()
    with torch.no_grad():
        net.fc.weight.copy_(torch.eye(2, dtype=torch.float64))
        net.fc.bias.zero_()
    x = torch.full((1, 2), 0.5, dtype=torch.float64)
    verify.bounds(net, 0.1, x=x, method=method)  # [0.4, 0.6]: fine
    with unchanged_module(net), raises_where(UnsupportedOperationError, "reciprocal", "truediv"):
        verify.bounds(net, 1.0, x=x, method=method)  # [-0.5, 1.5] contains 0
