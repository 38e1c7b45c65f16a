"""Properties over several networks (VNN-LIB 2.0): the product graph (`verify.product`), with
`equal-to` sharing the input (equivalence) and separate inputs related by input rows
(monotonicity)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import verify
from verify.errors import ShapeMismatchError, SpecificationError
from verify.io.vnnlib2 import load_vnnlib2

ACAS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vnncomp2022" / "acasxu"


def _two_nets(n_in: int, n_out: int, relation: str, box: list[tuple[float, float]],
              unsafe: str) -> str:  # fmt: skip
    """A VNN-LIB 2.0 text: networks `a` (input X, output Y) and `b` (input Z, output W)."""
    lines = ["(vnnlib-version <2.0>)",
             f"(declare-network a (declare-input X Real [{n_in}]) (declare-output Y Real [{n_out}]))",
             f"(declare-network b {relation} (declare-input Z Real [{n_in}]) "
             f"(declare-output W Real [{n_out}]))"]  # fmt: skip
    for i, (lo, hi) in enumerate(box):
        lines += [f"(assert (>= X[{i}] {lo!r}))", f"(assert (<= X[{i}] {hi!r}))"]
    lines.append(unsafe)
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prop.vnnlib"
    path.write_text(text)
    return path


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2)).eval()


def test_equal_to_shares_the_input(tmp_path: Path) -> None:
    text = _two_nets(3, 2, "(equal-to a)", [(0.0, 1.0)] * 3, "(assert (>= (- Y[0] W[0]) 0.5))")
    prop = load_vnnlib2(_write(tmp_path, text))
    assert prop.n_inputs == 3 and prop.n_outputs == 4
    assert [d.input_offset for d in prop.networks] == [0, 0]
    assert [d.output_offset for d in prop.networks] == [0, 2]


def test_a_network_and_its_copy_are_equivalent_and_a_perturbed_copy_is_not(tmp_path) -> None:
    net = _net(0)
    unsafe = "(assert (or (>= (- Y[0] W[0]) 0.001) (<= (- Y[0] W[0]) -0.001)))"
    path = _write(tmp_path, _two_nets(3, 2, "(equal-to a)", [(0.0, 1.0)] * 3, unsafe))
    before = [p.detach().clone() for p in net.parameters()]
    same = verify.verify([net, copy.deepcopy(net)], path, timeout=60)
    assert same.status == "unsat"
    assert verify.verify(net, path, timeout=60).status == "unsat"  # the equal-to model reused
    other = copy.deepcopy(net)
    with torch.no_grad():
        other[2].weight[0, 3] += 0.5
    found = verify.verify([net, other], path, timeout=60)
    assert found.status == "sat"
    x, y = (t.double().reshape(-1) for t in found.counterexample)
    with torch.no_grad():
        y1, y2 = net.double()(x[None])[0], other.double()(x[None])[0]
    assert torch.allclose(y, torch.cat([y1, y2])) and abs(float(y1[0] - y2[0])) >= 0.001
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_monotonicity_over_two_inputs_with_an_input_row(tmp_path: Path) -> None:
    """A net with positive weights is monotone: `x <= z` (an input row) never gives
    `f(x) > f(z) + 0.01`; the same model on its own input (a network declared without
    equal-to). One input each: along the diagonal the boxes must be narrower than 0.01 / L."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1)).eval()
    with torch.no_grad():
        for layer in (net[0], net[2]):
            layer.weight.abs_()
    box = "(assert (>= Z[0] 0.0))\n(assert (<= Z[0] 1.0))"
    unsafe = f"{box}\n(assert (<= X[0] Z[0]))\n(assert (>= (- Y[0] W[0]) 0.01))"
    path = _write(tmp_path, _two_nets(1, 1, "", [(0.0, 1.0)], unsafe))
    result = verify.verify([net, net], path, timeout=60)
    assert result.status == "unsat"
    samples = torch.rand(20000, 1)
    upper = samples + torch.rand(20000, 1) * (1 - samples)
    with torch.no_grad():
        assert (net(samples) <= net(upper) + 1e-6).all()
    flipped = copy.deepcopy(net)  # decreasing: a counterexample
    with torch.no_grad():
        flipped[2].weight.neg_()
    assert verify.verify([flipped, flipped], path, timeout=60).status == "sat"


def test_model_count_is_checked(tmp_path: Path) -> None:
    path = _write(tmp_path, _two_nets(3, 2, "", [(0.0, 1.0)] * 3,
                                      "(assert (>= Y[0] 1.0))\n(assert (>= Z[0] 0.0))\n"
                                      "(assert (<= Z[0] 1.0))\n(assert (>= Z[1] 0.0))\n"
                                      "(assert (<= Z[1] 1.0))\n(assert (>= Z[2] 0.0))\n"
                                      "(assert (<= Z[2] 1.0))"))  # fmt: skip
    with pytest.raises(ShapeMismatchError, match="declares 2 networks"):
        verify.verify(_net(0), path, timeout=10)


def test_equal_to_an_unknown_network_is_refused(tmp_path: Path) -> None:
    text = _two_nets(3, 2, "(equal-to c)", [(0.0, 1.0)] * 3, "(assert (>= Y[0] 1.0))")
    with pytest.raises(SpecificationError):
        load_vnnlib2(_write(tmp_path, text))


@pytest.mark.skipif(not ACAS.exists(), reason="VNN-COMP 2022 ACAS Xu data absent")
def test_acasxu_network_against_itself(tmp_path: Path) -> None:
    """ACAS Xu 1_1 twice on one input (a small box): the advisories agree (unsat)."""
    onnx_path = ACAS / "onnx" / "ACASXU_run2a_1_1_batch_2000.onnx.gz"
    centre = [0.2, 0.1, -0.1, 0.3, 0.2]
    box = [(c - 0.01, c + 0.01) for c in centre]
    unsafe = "(assert (or (>= (- Y[0] W[0]) 0.01) (<= (- Y[0] W[0]) -0.01)))"
    path = _write(tmp_path, _two_nets(5, 5, "(equal-to a)", box, unsafe))
    assert verify.verify([onnx_path, onnx_path], path, timeout=60).status == "unsat"
    assert np.isfinite(load_vnnlib2(path).regions[0].lower).all()


def test_the_command_line_takes_several_networks(tmp_path: Path, capsys) -> None:
    """`run "a.onnx;b.onnx" PROP`: the networks in declaration order."""
    from verify.cli.main import main

    net = _net(0)
    paths = []
    for name, model in (("a", net), ("b", copy.deepcopy(net))):
        paths.append(tmp_path / f"{name}.onnx")
        torch.onnx.export(model, (torch.zeros(1, 3),), str(paths[-1]), dynamo=False,
                          opset_version=13)  # fmt: skip
    unsafe = "(assert (or (>= (- Y[0] W[0]) 0.001) (<= (- Y[0] W[0]) -0.001)))"
    prop = _write(tmp_path, _two_nets(3, 2, "(equal-to a)", [(0.0, 1.0)] * 3, unsafe))
    assert main(["run", f"{paths[0]};{paths[1]}", str(prop), "--timeout", "60"]) == 0
    assert capsys.readouterr().out.split("\n")[-2] == "unsat"
