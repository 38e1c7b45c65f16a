"""Linear constraints on the inputs that are not a box (VNN-LIB 2.0 as written): rows over
`[f(x); x]` (`verify.input_rows`), so "unsat" holds only on the constrained set and a
counterexample satisfies the constraints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

import verify
from verify.input_rows import WithInputs, with_input_rows
from verify.io.vnnlib2 import load_vnnlib2


def _difference_net() -> nn.Module:
    """`y = relu(x0 - x1) - relu(x1 - x0) = x0 - x1`, through ReLUs."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
        net[0].bias.zero_()
        net[2].weight.copy_(torch.tensor([[1.0, -1.0]]))
        net[2].bias.zero_()
    return net.eval()


def _spec(tmp_path: Path, row_bound: float | None) -> Path:
    """Box [0, 1]^2, unsafe `y >= 0.5`, and (when given) `x0 - x1 <= row_bound`."""
    lines = ["(vnnlib-version <2.0>)", "(declare-network n", "  (declare-input X Real [2])",
             "  (declare-output Y Real [])", ")", "(assert (>= X[0] 0.0))",
             "(assert (<= X[0] 1.0))", "(assert (<= (* -1.0 X[1]) 0.0))", "(assert (<= X[1] 1.0))",
             "(assert (>= Y 0.5))"]  # fmt: skip
    if row_bound is not None:
        lines.append(f"(assert (<= (- X[0] X[1]) {row_bound}))")
    path = tmp_path / f"p{row_bound}.vnnlib"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_input_row_excluding_every_violation_gives_unsat(tmp_path: Path) -> None:
    result = verify.verify(_difference_net(), _spec(tmp_path, 0.4), timeout=30)
    assert result.status == "unsat"


def test_without_the_row_or_with_a_looser_one_a_valid_counterexample(tmp_path: Path) -> None:
    for bound in (None, 0.6):
        result = verify.verify(_difference_net(), _spec(tmp_path, bound), timeout=30)
        assert result.status == "sat"
        x, y = (t.double().reshape(-1) for t in result.counterexample)
        assert y.shape == (1,) and float(y[0]) >= 0.5
        assert bound is None or float(x[0] - x[1]) <= bound
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_the_wrapper_leaves_the_model_and_a_plain_property_alone(tmp_path: Path) -> None:
    net = _difference_net()
    before = [p.detach().clone() for p in net.parameters()]
    plain = load_vnnlib2(_spec(tmp_path, None))
    assert with_input_rows(net, plain) == (net, plain)
    wrapped, spec = with_input_rows(net, load_vnnlib2(_spec(tmp_path, 0.4)))
    assert isinstance(wrapped, WithInputs) and spec.n_outputs == 3
    x = torch.tensor([[0.25, 0.75]])
    assert torch.equal(wrapped(x), torch.tensor([[-0.5, 0.25, 0.75]]))
    for poly in spec.regions[0].unsafe:
        assert poly.A_x is None and poly.A.shape[1] == 3
        assert np.isin([1.0, -1.0], poly.A).all()
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
