"""The LP and the MILP on any graph: every affine op encoded (multi-input ones through their
adjoint), the MILP's exact encoding from the relaxation's pieces (disjunctive formulation; ReLU's
two pieces take the smaller big-M encoding, Tjeng et al., ICLR 2019, and both give one
optimum); on DAGs (residual, Split/Concat, any piecewise-linear
relaxation) the LP is below the MILP, which matches a dense brute force on tiny nets; a
nonlinearity without pieces is named."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import bounds.lp.lp
import verify
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph
from bounds.lp.lp import _affine_matrices, milp, planet_lp
from bounds.methods.crown import crown
from bounds.ops import ConcatOp
from bounds.types import Interval
from tests.bad_inputs.conftest import raises_where
from tests.model_zoo import make
from tests.soundness import box_samples
from tests.test_dual_dag import (
    PIECEWISE,
    LeakyTestRelaxation,
    SplitConcat,
    _graph,
    _setup,
    _split_concat,
    _with_relaxation,
)

pytest.importorskip("cvxpy")
D = torch.float64


NETS = [("mlp", 0.25), ("deep_mlp", 0.25), ("conv", 0.25), ("residual", 0.07), ("cat", 0.5)]


def _case(name: str, eps: float, seed: int = 0):
    net, shape = _split_concat(seed) if name == "cat" else make(name, seed=seed)
    graph = verify.network_graph(net, shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(1, *shape, generator=gen, dtype=D)
    box = Interval(x - eps, x + eps)
    C = torch.randn(1, 2, *graph.output.shape, generator=gen, dtype=D)
    _, _, intervals = crown(graph, box, C)
    return graph, box, C, intervals


def _disjunctive_relu(monkeypatch) -> None:
    """Make ReLU take the generic pieces encoding instead of its big-M fast path."""
    monkeypatch.setattr(bounds.lp.lp, "RELU_PIECES", None)


@pytest.mark.parametrize("name, eps", NETS)
def test_pieces_give_the_big_m_optimum(name, eps, monkeypatch):
    """ReLU's pieces through the disjunctive encoding and through big-M: one optimum."""
    graph, box, C, intervals = _case(name, eps)
    calls = []
    real = bounds.lp.lp._big_m_constraints
    monkeypatch.setattr(bounds.lp.lp, "_big_m_constraints", lambda *a: calls.append(1) or real(*a))
    _, _, big_m = milp(graph, box, C, intervals)
    assert calls  # ReLU went through big-M
    _disjunctive_relu(monkeypatch)
    calls.clear()
    _, _, pieces = milp(graph, box, C, intervals)
    assert not calls
    torch.testing.assert_close(pieces["raw"], big_m["raw"], rtol=1e-6, atol=1e-6)


def test_a_neuron_covered_by_one_piece_gets_no_binary(monkeypatch):
    """Stable neurons (and `l = u = 0`) are one piece's line: the MILP of a net whose neurons
    are all stable has no integer variable, and equals the LP."""
    graph, box, C, intervals = _case("mlp", 1e-3)
    _disjunctive_relu(monkeypatch)
    booleans = []
    real = bounds.lp.lp._exact_constraints

    def counting(cp, sp, node, var, pre_var, lower, upper):
        rows = real(cp, sp, node, var, pre_var, lower, upper)
        booleans.extend(v for r in rows for v in r.variables() if v.attributes["boolean"])
        return rows

    monkeypatch.setattr(bounds.lp.lp, "_exact_constraints", counting)
    stable = all(
        bool(((intervals[a.inputs[0]].lower >= 0) | (intervals[a.inputs[0]].upper <= 0)).all())
        for a in graph.activations()
    )
    assert stable
    _, _, exact = milp(graph, box, C, intervals)
    _, _, lp = bounds.lp.lp.planet_lp(graph, box, C, intervals)
    assert not booleans
    torch.testing.assert_close(exact["raw"], lp["raw"], rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("name, relaxation", PIECEWISE)
def test_dag_lp_is_below_the_milp_which_is_below_samples(name, relaxation):
    graph, box, C, intervals, _ = _setup(name, relaxation=relaxation)
    lp = planet_lp(graph, box, C, intervals)[2]["raw"]
    _, _, exact = milp(graph, box, C, intervals)
    exact = exact["raw"]
    assert (lp <= exact + 1e-6 * (1 + exact.abs())).all(), (lp, exact)
    points = box_samples(box.lower, box.upper, 3000)[0]
    y = graph.forward(points)
    values = torch.cat([y @ C[0].T, -(y @ C[0].T)], 1)
    assert (exact <= values.min(0).values + 1e-6).all()


def _tiny(seed: int, n_in: int) -> Graph:
    """A tiny DAG (1 or 2 inputs): split-concat with 4 hidden units, for brute force."""
    torch.manual_seed(seed)
    net = SplitConcat(n_in, hidden=4).to(D).eval()
    return verify.network_graph(net, (n_in,))


def _grid(lower: Tensor, upper: Tensor, k: int) -> Tensor:
    axes = [torch.linspace(float(lo), float(up), k, dtype=D) for lo, up in zip(lower, upper)]
    return torch.cartesian_prod(*axes).reshape(-1, len(axes))


@pytest.mark.parametrize("relaxation", ["relu", "relu-disjunctive", "test_leaky"])
@pytest.mark.parametrize("n_in, seed", [(1, 0), (1, 1), (2, 0), (2, 3)])
def test_milp_is_the_true_minimum(n_in, seed, relaxation, monkeypatch):
    """The MILP's optimum equals the minimum over a dense grid of the input box, to the grid's
    resolution (`L h`, with `L` the largest gradient norm met on the grid: the function is
    piecewise linear), while the LP of the same intervals is strictly below it."""
    graph = _tiny(seed, n_in)
    if relaxation == "relu-disjunctive":
        _disjunctive_relu(monkeypatch)
    elif relaxation != "relu":
        from relaxations import get_relaxation

        graph = _with_relaxation(graph, get_relaxation(relaxation))
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(1, n_in, generator=gen, dtype=D)
    box = Interval(x - 1.0, x + 1.0)
    C = torch.randn(1, 2, 2, generator=gen, dtype=D)
    intervals = graph.interval(box)  # loose bounds: several pieces meet most intervals
    _, _, exact = milp(graph, box, C, intervals)
    _, _, lp = planet_lp(graph, box, C, intervals)
    exact, lp = exact["raw"][0], lp["raw"][0]
    k = 100001 if n_in == 1 else 801
    points = _grid(box.lower[0], box.upper[0], k).requires_grad_(True)
    y = graph.forward(points)
    values = torch.cat([y @ C[0].T, -(y @ C[0].T)], 1)
    grads = [
        torch.autograd.grad(values[:, s].sum(), points, retain_graph=True)[0] for s in range(4)
    ]
    lipschitz = torch.stack([g.abs().sum(1).max() for g in grads])
    found = values.detach().min(0).values
    tol = 2 * lipschitz * float((box.upper - box.lower).max()) / (k - 1) + 1e-6
    assert (exact <= found + 1e-6).all(), (exact, found)
    assert (found - exact <= tol).all(), (exact, found, tol)
    assert (lp < exact - tol).any(), (lp, exact, tol)


def test_milp_names_a_product():
    """A several-input nonlinearity has no pieces: the MILP names its node."""
    graph = _graph("product", 0, "relu")
    x = torch.zeros(1, *graph.input.shape, dtype=D)
    act = next(a.name for a in graph.activations() if len(a.inputs) == 2)
    with raises_where(UnsupportedOperationError, "product", act, "pieces"):
        verify.bounds(graph, 0.1, x=x, method="milp", intermediate="ibp")


def test_milp_names_a_nonlinearity_without_pieces(monkeypatch):
    """The LP takes any relaxation; the MILP needs `pieces` and names the node without them."""
    graph = _graph("split_concat", 0, "test_leaky")
    monkeypatch.setattr(LeakyTestRelaxation, "pieces", None)
    x = torch.zeros(1, *graph.input.shape, dtype=D)
    lp = verify.bounds(graph, 0.1, x=x, method="lp", intermediate="ibp")
    assert torch.isfinite(lp.lower).all()
    act = next(graph.activations()).name
    with raises_where(UnsupportedOperationError, "test_leaky", act, "pieces"):
        verify.bounds(graph, 0.1, x=x, method="milp", intermediate="ibp")


def test_concat_matrices_from_the_adjoint():
    """The LP's matrix of a multi-input affine op reproduces its forward pass."""
    gen = torch.Generator().manual_seed(0)
    const = torch.randn(2, 3, generator=gen, dtype=D)
    op = ConcatOp([(2, 3), (4, 3)], 0, [1, const, 0])
    matrices, b = _affine_matrices(op, op.out_shape)
    a, c = (
        torch.randn(5, 2, 3, generator=gen, dtype=D),
        torch.randn(5, 4, 3, generator=gen, dtype=D),
    )
    want = op.forward(a, c).reshape(5, -1)
    got = (
        a.reshape(5, -1) @ torch.as_tensor(matrices[0]).T
        + c.reshape(5, -1) @ torch.as_tensor(matrices[1]).T
    )
    torch.testing.assert_close(got + torch.as_tensor(b), want)
