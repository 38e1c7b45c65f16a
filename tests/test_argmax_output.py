"""Networks ending in ArgMax / ArgMin (`verify.argmax_output`): read up to the logits, the
property restated on them with ties as ONNX breaks them, answers checked by sampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import verify
from bounds.errors import UnsupportedOperationError
from verify.argmax_output import MAX_ASSIGNMENTS, ArgOutput, indices, rewrite
from verify.errors import SpecificationError
from verify.property import Polytope, Region, VnnlibProperty

# logits z = W relu(x) + c over x in R^2: z = [x0, x1, 0.5, x0 - 1, -x1]
W = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, -1.0]], dtype=np.float32)
C = np.array([0.0, 0.0, 0.5, -1.0, 0.0], dtype=np.float32)


def arg_model(op: str = "ArgMax", middle: bool = False, W=W, C=C, **attrs) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Gemm", ["h", "W", "C"], ["z"], name="fc", transB=1),
        helper.make_node(op, ["z"], ["k"], name="decide", axis=1, **attrs),
    ]
    out, shape = "k", [1, 1] if attrs.get("keepdims", 1) else [1]
    if middle:  # the index used further: not the network's last operation
        nodes += [helper.make_node("Cast", ["k"], ["kf"], name="cast", to=TensorProto.FLOAT),
                  helper.make_node("Add", ["kf", "z"], ["y"], name="add")]  # fmt: skip
        out, shape = "y", [1, 5]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT if middle else TensorProto.INT64,
                                       shape)],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(C, "C")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def save(tmp_path: Path, m: onnx.ModelProto, name: str = "net.onnx") -> Path:
    path = tmp_path / name
    onnx.save(m, str(path))
    return path


def spec_file(tmp_path: Path, box: float, out_asserts: str) -> Path:
    text = "(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n"
    text += f"(assert (>= X_0 0.0))\n(assert (<= X_0 {box}))\n"
    text += f"(assert (>= X_1 0.0))\n(assert (<= X_1 {box}))\n" + out_asserts + "\n"
    path = tmp_path / "prop.vnnlib"
    path.write_text(text)
    return path


def logits(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) @ W.T.astype(np.float64) + C


def test_the_reader_stops_at_the_logits(tmp_path):
    net = verify.load_onnx(save(tmp_path, arg_model(keepdims=1)))
    arg = net.argmax_output
    assert arg == ArgOutput("ArgMax", 0, (5,), True, False, arg.node) and "'decide'" in arg.node
    assert arg.output_shape == (1,) and net.output_shape == (5,)
    x = torch.rand(7, 2)
    assert torch.allclose(net(x).double(), torch.tensor(logits(x.double().numpy())))


def test_argmax_elsewhere_is_refused_naming_the_node(tmp_path):
    with pytest.raises(UnsupportedOperationError, match=r"'decide'.*last operation"):
        verify.load_onnx(save(tmp_path, arg_model(middle=True)))


def test_rewrite_states_ties_as_onnx_breaks_them():
    arg = ArgOutput("ArgMax", 0, (4,))
    region = Region(
        np.zeros(1), np.ones(1), (Polytope(np.array([[1.0], [-1.0]]), np.array([2.0, -2.0])),)
    )  # Y_0 == 2
    (poly,) = rewrite(VnnlibProperty("p", 1, 1, (region,)), arg).regions[0].unsafe
    assert poly.A.tolist() == [[1, 0, -1, 0], [0, 1, -1, 0], [0, 0, -1, 1]]
    assert poly.strict.tolist() == [True, True, False]  # classes 0, 1 would win a tie
    assert poly.contains(np.array([0.0, 0.0, 1.0, 1.0]))  # tie with 3: 2 wins
    assert not poly.contains(np.array([1.0, 0.0, 1.0, 0.0]))  # tie with 0: 0 wins
    last = (
        rewrite(
            VnnlibProperty("p", 1, 1, (region,)),
            ArgOutput("ArgMin", 0, (4,), select_last_index=True),
        )
        .regions[0]
        .unsafe[0]
    )
    assert last.A.tolist() == [[-1, 0, 1, 0], [0, -1, 1, 0], [0, 0, 1, -1]]
    assert last.strict.tolist() == [False, False, True]


def test_index_rows_select_the_classes_they_admit():
    arg = ArgOutput("ArgMax", 0, (5,))
    region = Region(np.zeros(1), np.ones(1), (Polytope(np.array([[1.0]]), np.array([1.5])),))
    unsafe = rewrite(VnnlibProperty("p", 1, 1, (region,)), arg).regions[0].unsafe
    assert len(unsafe) == 2  # Y_0 in {0, 1}
    for k, poly in enumerate(unsafe):
        z = np.full(5, -1.0)
        z[k] = 1.0
        assert poly.contains(z) and sum(p.contains(z) for p in unsafe) == 1


def test_rewrite_errors_name_the_file_and_polytope():
    arg = ArgOutput("ArgMax", 1, (12, 5), keepdims=False, node="node 'am' (ArgMax)")
    many = Region(np.zeros(1), np.ones(1), (Polytope(np.ones((1, 12)), np.array([3.0])),))
    with pytest.raises(
        SpecificationError, match=rf"p.vnnlib: region 0, polytope 0.*> {MAX_ASSIGNMENTS}"
    ):
        rewrite(VnnlibProperty("p.vnnlib", 1, 12, (many,)), arg)
    with pytest.raises(SpecificationError, match="3 outputs but the network's ArgMax"):
        rewrite(VnnlibProperty("p.vnnlib", 1, 3, ()), arg)


def test_indices_break_ties_like_onnx():
    z = torch.tensor([1.0, 3.0, 3.0, 0.0])
    assert indices(z, ArgOutput("ArgMax", 0, (4,))).tolist() == [1.0]
    assert indices(z, ArgOutput("ArgMax", 0, (4,), select_last_index=True)).tolist() == [2.0]
    assert indices(z, ArgOutput("ArgMin", 0, (4,))).tolist() == [3.0]
    grid = torch.arange(6.0).reshape(2, 3)  # axis 0 of [2, 3]: one index per column
    assert indices(grid, ArgOutput("ArgMax", 0, (2, 3))).tolist() == [1.0, 1.0, 1.0]


def test_unsat_where_class_two_always_wins_sat_with_its_index_otherwise(tmp_path):
    net = save(tmp_path, arg_model())
    # on [0, 0.4]^2, z_2 = 0.5 beats x0, x1, x0 - 1, -x1: "argmax <= 1" never happens
    assert (
        verify.verify(net, spec_file(tmp_path, 0.4, "(assert (<= Y_0 1))"), timeout=20).status
        == "unsat"
    )
    gen = np.random.default_rng(0)
    assert (logits(gen.uniform(0, 0.4, (20000, 2))).argmax(1) == 2).all()
    result = verify.verify(net, spec_file(tmp_path, 1.0, "(assert (<= Y_0 1))"), timeout=20)
    assert result.status == "sat"
    x, y = result.counterexample
    assert y.tolist() == [float(logits(x.numpy()[None]).argmax(1)[0])] and y.item() <= 1


def test_a_tie_is_never_reported_as_the_loser(tmp_path):
    """z_0 = z_1 = x0 everywhere: ONNX's ArgMax is 0, never 1, so "Y_0 = 1" has no
    counterexample (the closure of its rows holds everywhere, so bounds cannot prove it
    either); with select_last_index it is always 1."""
    tie_W = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    tie_C = np.array([0.0, 0.0, -5.0], dtype=np.float32)
    spec = "(assert (>= Y_0 1))\n(assert (<= Y_0 1))"
    first = save(tmp_path, arg_model(W=tie_W, C=tie_C), "first.onnx")
    assert verify.verify(first, spec_file(tmp_path, 1.0, spec), timeout=3).status != "sat"
    last = save(tmp_path, arg_model(W=tie_W, C=tie_C, select_last_index=1), "last.onnx")
    result = verify.verify(last, spec_file(tmp_path, 1.0, spec), timeout=10)
    assert result.status == "sat" and result.counterexample[1].tolist() == [1.0]


def test_argmin_and_without_keepdims(tmp_path):
    net = save(tmp_path, arg_model("ArgMin", keepdims=0))
    loaded = verify.load_onnx(net)
    assert loaded.argmax_output.output_shape == ()
    # argmin of [x0, x1, 0.5, x0 - 1, -x1] on [0, 0.4]^2: class 3 (x0 - 1) or 4 (-x1), never 2
    result = verify.verify(net, spec_file(tmp_path, 0.4, "(assert (>= Y_0 2))\n(assert (<= Y_0 2))"),
                           timeout=20)  # fmt: skip
    assert result.status == "unsat"
    gen = np.random.default_rng(1)
    assert not (logits(gen.uniform(0, 0.4, (20000, 2))).argmin(1) == 2).any()


def test_assignments_are_admitted_in_exact_arithmetic():
    """`1e16 k_0 - k_1 - 1e16 k_2 <= -0.5` admits `k = (1, 1, 1)` (-1) exactly, though float64
    evaluates the row to 0 there: dropping it would drop part of the unsafe set, a wrong
    "unsat"."""
    arg = ArgOutput("ArgMax", 1, (3, 2), keepdims=False)  # three outputs of two classes
    A, b = np.array([[1e16, -1.0, -1e16]]), np.array([-0.5])
    assert not (A @ np.ones(3) <= b).all()  # what a float64 check would conclude
    region = Region(np.zeros(1), np.ones(1), (Polytope(A, b),))
    unsafe = rewrite(VnnlibProperty("p", 1, 3, (region,)), arg).regions[0].unsafe
    assert len(unsafe) == 4  # (0,1,0) (0,0,1) (0,1,1) (1,1,1)
    z = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])  # argmax 1 on every output
    assert any(p.contains(z) for p in unsafe)
