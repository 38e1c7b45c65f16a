"""Hostile ONNX files: each is built here with `onnx.helper` into tmp_path, and loading it must
raise the typed error whose message names what is wrong and where (the path for malformed files;
the node's name and op type, the initializer or input for graph problems), writing nothing."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import verify.io.onnx_loader as onnx_loader
from bounds.errors import (
    InvalidNetworkError,
    ShapeMismatchError,
    UnsupportedOperationError,
)
from tests.bad_inputs.conftest import no_side_effects, raises_where
from verify.errors import SpecificationError
from verify.io.onnx_loader import load_onnx

F32 = TensorProto.FLOAT


# ----------------------------------------------------------------------------- builders


def node(op: str, inputs: str, output: str, name: str, **attrs) -> onnx.NodeProto:
    """`node("Gemm", "x,W", "y", "fc1")`: inputs comma-separated ('' for none)."""
    ins = [i.strip() for i in inputs.split(",")] if inputs else []
    return helper.make_node(op, ins, [output] if output else [], name=name, **attrs)


def const(name: str, array) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def ones(name: str, *shape: int, dtype=np.float32) -> TensorProto:
    return const(name, np.ones(shape, dtype))


def model(
    nodes: list,
    inits: list = (),
    in_shape: list | None = (1, 4),
    in_type: int = F32,
    inputs: list | None = None,
    outputs: list | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """One input "x" and one output "y" unless `inputs` / `outputs` are given."""
    if inputs is None:
        shape = None if in_shape is None else list(in_shape)
        inputs = [helper.make_tensor_value_info("x", in_type, shape)]
    if outputs is None:
        outputs = [helper.make_tensor_value_info("y", F32, ["d"])]
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, initializer=list(inits))
    domains = sorted({n.domain for n in nodes if n.domain})
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def save(tmp: Path, m: onnx.ModelProto, name: str = "net.onnx") -> Path:
    path = tmp / name
    path.write_bytes(m.SerializeToString())
    return path


def writes(name: str, content: Callable[[], bytes]) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        (tmp / name).write_bytes(content())
        return tmp / name

    return build


def saves(m: Callable[[], onnx.ModelProto]) -> Callable[[Path], Path]:
    return lambda tmp: save(tmp, m())


def _valid() -> onnx.ModelProto:
    """A valid model: y = x @ W^T with x (1, 4), W (3, 4)."""
    return model([node("Gemm", "x,W", "y", "fc", transB=1)], [ones("W", 3, 4)], in_shape=[1, 4])


def _external(tmp: Path, data: bytes | None, location: str = "weights.bin") -> Path:
    """The valid model saved with its weight in `location`, then that file replaced by `data`
    (removed when None)."""
    m = _valid()
    onnx.save(
        m, tmp / "net.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    os.remove(tmp / "weights.bin")
    if data is not None:
        (tmp / "weights.bin").write_bytes(data)
    if location != "weights.bin":
        m = onnx.load(tmp / "net.onnx", load_external_data=False)
        m.graph.initializer[0].external_data[0].value = location
        onnx.save(m, tmp / "net.onnx")
    return tmp / "net.onnx"


def _nan_at(shape: tuple, index: tuple, value: float = np.nan, dtype=np.float32) -> np.ndarray:
    array = np.ones(shape, dtype)
    array[index] = value
    return array


def _bf16_nan() -> TensorProto:
    values = [1.0] * 11 + [float("nan")]
    return helper.make_tensor("W_bf16", TensorProto.BFLOAT16, [3, 4], values)


# ----------------------------------------------------------------------------- malformed files

# (id, builder(tmp) -> path, fragments besides the path)
FILE_CASES = [
    ("missing_file", lambda tmp: tmp / "absent.onnx", ["no such ONNX file"]),
    ("directory", lambda tmp: (tmp / "d.onnx").mkdir() or tmp / "d.onnx", ["is a directory"]),
    ("empty_file", writes("empty.onnx", lambda: b""), ["empty"]),
    ("fifo", lambda tmp: os.mkfifo(tmp / "pipe.onnx") or tmp / "pipe.onnx", ["not a regular file"]),
    ("garbage_bytes", writes("junk.onnx", lambda: b"\x00\xff not onnx \x07" * 9), ["protobuf"]),
    ("gzip_magic_over_garbage", writes("g.onnx.gz", lambda: b"\x1f\x8b" + b"junk" * 20), ["gzip"]),
    (
        "truncated_onnx_gz",
        writes("t.onnx.gz", lambda: gzip.compress(_valid().SerializeToString())[:-30]),
        ["gzip"],
    ),
    ("gzip_of_nothing", writes("n.onnx.gz", lambda: gzip.compress(b"")), ["holds no data"]),
    (
        "gzip_of_garbage",
        writes("gg.onnx.gz", lambda: gzip.compress(b"\xff\xfe garbage" * 30)),
        ["not an ONNX protobuf"],
    ),
    (
        "truncated_onnx",
        writes("half.onnx", lambda: _valid().SerializeToString()[:40]),
        ["not an ONNX"],
    ),
    (
        "graph_proto_not_model",
        writes("graph.onnx", lambda: _valid().graph.SerializeToString()),
        ["not an ONNX model", "no graph"],
    ),
    (
        "tensor_proto_not_model",
        writes("tensor.onnx", lambda: ones("t", 5).SerializeToString()),
        ["not an ONNX"],
    ),
    (
        "missing_external_data",
        lambda tmp: _external(tmp, None),
        ["tensor 'W'", "missing file 'weights.bin'"],
    ),
    (
        "short_external_data",
        lambda tmp: _external(tmp, b"\0" * 8),
        ["tensor 'W'", "'weights.bin'", "exceeds"],
    ),
    (
        "external_data_outside_folder",
        lambda tmp: _external(tmp, b"\0" * 48, location="../weights.bin"),
        ["tensor 'W'", "'../weights.bin'", "not inside"],
    ),
    ("no_graph_input", saves(lambda: model([node("Relu", "W", "y", "r")], [ones("W", 2)], inputs=[])), ["no input"]),
    ("no_graph_output", saves(lambda: model([node("Relu", "x", "y", "r")], outputs=[])), ["found 0"]),
    (
        "output_never_produced",
        saves(lambda: model([node("Relu", "x", "z", "r")])),
        ["graph output 'y'", "no node"],
    ),
    (
        "output_is_constant",
        saves(lambda: model([node("Relu", "W", "y", "r")], [ones("W", 2)])),
        ["does not depend on the input"],
    ),
    ("absurd_input", saves(lambda: model([node("Relu", "x", "y", "r")], in_shape=[1, 100000, 100000, 3])), ["'x'", "100000", "elements"]),
    ("zero_dim_input", saves(lambda: model([node("Relu", "x", "y", "r")], in_shape=[1, 0, 4])), ["'x'", "dimension 1 is 0"]),
    ("negative_dim_input", saves(lambda: model([node("Relu", "x", "y", "r")], in_shape=[1, 4, -3])), ["'x'", "dimension 2 is -3"]),
    ("symbolic_feature_dim", saves(lambda: model([node("Relu", "x", "y", "r")], in_shape=[1, "H"])), ["'x'", "symbolic"]),
    ("input_without_shape", saves(lambda: model([node("Relu", "x", "y", "r")], in_shape=None)), ["'x'", "no shape"]),
    ("int_input", saves(lambda: model([node("Relu", "x", "y", "r")], in_type=TensorProto.INT64)), ["'x'", "INT64", "not a float"]),
    ("wrong_attribute_type", saves(lambda: model([node("Gemm", "x,W", "y", "fc9", alpha="big")], [ones("W", 3, 4)])), ["invalid ONNX model", "fc9", "alpha"]),
    ("duplicate_initializer", saves(lambda: model([node("Gemm", "x,W", "y", "fc")], [ones("W", 3, 4), ones("W", 3, 4)])), ["invalid ONNX model", "W"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "fragments"), [pytest.param(b, f, id=i) for i, b, f in FILE_CASES]
)
def test_malformed_file(build, fragments, tmp_path: Path) -> None:
    path = build(tmp_path)
    with no_side_effects(tmp_path), raises_where(SpecificationError, str(path), *fragments) as e:
        load_onnx(path)
    assert e.value.path == str(path)


# ----------------------------------------------------------------------------- graph problems

GEMM_WRONG_INNER = ([node("Gemm", "x,W", "y", "fc1", transB=1)], [ones("W", 3, 5)])

# (id, nodes, initializers, input shape, error, fragments)
GRAPH_CASES = [
    ("gemm_inner_dim", *GEMM_WRONG_INNER, [1, 4], ShapeMismatchError, ["'fc1' (Gemm)", "'W'", "(3, 5)", "4 features"]),
    ("gemm_inner_dim_no_trans", [node("Gemm", "x,W", "y", "fc2")], [ones("W", 5, 3)], [1, 4], ShapeMismatchError, ["'fc2' (Gemm)", "takes 5"]),
    ("gemm_bias_shape", [node("Gemm", "x,W,C", "y", "fc3")], [ones("W", 4, 3), ones("C", 3, 1)], [1, 4], ShapeMismatchError, ["'fc3' (Gemm)", "bias 'C'", "(3, 1)"]),
    ("matmul_inner_dim", [node("MatMul", "x,W", "y", "mm1")], [ones("W", 5, 2)], [1, 4], ShapeMismatchError, ["'mm1' (MatMul)", "'W'", "(5, 2)", "4 columns"]),
    ("conv_in_channels", [node("Conv", "x,K", "y", "conv1")], [ones("K", 2, 4, 3, 3)], [1, 3, 8, 8], ShapeMismatchError, ["'conv1' (Conv)", "'K'", "3 channels", "expects 4"]),
    ("conv_group_in_channels", [node("Conv", "x,K", "y", "conv2", group=2)], [ones("K", 4, 3, 3, 3)], [1, 3, 8, 8], ShapeMismatchError, ["'conv2' (Conv)", "group=2", "expects 6"]),
    ("conv_group_filters", [node("Conv", "x,K", "y", "conv3", group=2)], [ones("K", 3, 2, 3, 3)], [1, 4, 8, 8], InvalidNetworkError, ["'conv3' (Conv)", "group=2", "3 filters"]),
    ("conv_kernel_shape_attr", [node("Conv", "x,K", "y", "conv4", kernel_shape=[5, 5])], [ones("K", 2, 3, 3, 3)], [1, 3, 8, 8], ShapeMismatchError, ["'conv4' (Conv)", "kernel_shape [5, 5]"]),
    ("conv_bias_shape", [node("Conv", "x,K,B", "y", "conv5")], [ones("K", 2, 3, 3, 3), ones("B", 3)], [1, 3, 8, 8], ShapeMismatchError, ["'conv5' (Conv)", "bias 'B'", "(2,)"]),
    ("conv_kernel_larger_than_input", [node("Conv", "x,K", "y", "conv6")], [ones("K", 2, 3, 5, 5)], [1, 3, 4, 4], ShapeMismatchError, ["'conv6' (Conv)", "larger than the input"]),
    ("conv_zero_stride", [node("Conv", "x,K", "y", "conv7", strides=[0, 1])], [ones("K", 2, 3, 3, 3)], [1, 3, 8, 8], InvalidNetworkError, ["'conv7' (Conv)", "strides [0, 1]"]),
    ("conv_huge_padding", [node("Conv", "x,K", "y", "conv8", pads=[30000] * 4)], [ones("K", 8, 3, 1, 1)], [1, 3, 4, 4], InvalidNetworkError, ["'conv8' (Conv)", "elements", "MAX_ELEMENTS"]),
    ("matmul_huge_output", [node("MatMul", "x,W", "y", "mm2")], [ones("W", 1, 4096)], [1, 2**18, 1], InvalidNetworkError, ["'mm2' (MatMul)", "elements"]),
    ("add_constant_not_broadcasting", [node("Add", "x,c", "y", "add1")], [ones("c", 3)], [1, 4], ShapeMismatchError, ["'add1' (Add)", "'c'", "(3,)", "(1, 4)"]),
    ("mul_constant_not_broadcasting", [node("Mul", "c,x", "y", "mul1")], [ones("c", 2, 1, 1)], [1, 3, 2, 2], ShapeMismatchError, ["'mul1' (Mul)", "'c'", "(2, 1, 1)"]),
    ("add_activations_not_broadcasting", [node("Relu", "x", "r", "r"), node("Flatten", "x", "f", "fl"), node("Add", "r,f", "y", "add2")], [], [1, 2, 3], ShapeMismatchError, ["'add2' (Add)", "do not broadcast"]),
    ("reshape_impossible", [node("Reshape", "x,s", "y", "rs1")], [const("s", np.array([1, 4], np.int64))], [1, 6], ShapeMismatchError, ["'rs1' (Reshape)", "6 elements", "[1, 4]"]),
    ("reshape_two_minus_one", [node("Reshape", "x,s", "y", "rs2")], [const("s", np.array([-1, -1], np.int64))], [1, 6], ShapeMismatchError, ["'rs2' (Reshape)", "several -1"]),
    ("reshape_zero_past_rank", [node("Reshape", "x,s", "y", "rs3")], [const("s", np.array([1, 6, 0], np.int64))], [1, 6], ShapeMismatchError, ["'rs3' (Reshape)", "0 at position 2"]),
    ("reshape_float_shape", [node("Reshape", "x,s", "y", "rs4")], [const("s", np.array([1.0, 6.0], np.float32))], [1, 6], InvalidNetworkError, ["'rs4' (Reshape)", "float32"]),
    ("batchnorm_param_size", [node("BatchNormalization", "x,s,b,m,v", "y", "bn1")], [ones("s", 3), ones("b", 2), ones("m", 2), ones("v", 2)], [1, 2, 4, 4], ShapeMismatchError, ["'bn1' (BatchNormalization)", "'s' has 3 entries"]),
    ("batchnorm_negative_variance", [node("BatchNormalization", "x,s,b,m,v", "y", "bn2")], [ones("s", 2), ones("b", 2), ones("m", 2), const("v", np.array([1.0, -2.0], np.float32))], [1, 2, 4, 4], InvalidNetworkError, ["'bn2' (BatchNormalization)", "variance 'v'", "-2.0"]),
    ("avgpool_kernel_larger_than_input", [node("AveragePool", "x", "y", "pool1", kernel_shape=[5, 5])], [], [1, 1, 3, 3], ShapeMismatchError, ["'pool1' (AveragePool)", "larger than the input"]),
    ("squeeze_axis_out_of_range", [node("Squeeze", "x,a", "y", "sq1")], [const("a", np.array([5], np.int64))], [1, 1, 4], InvalidNetworkError, ["'sq1' (Squeeze)", "axis 5", "rank 3"]),
    ("squeeze_non_unit_axis", [node("Squeeze", "x,a", "y", "sq2")], [const("a", np.array([2], np.int64))], [1, 1, 4], ShapeMismatchError, ["'sq2' (Squeeze)", "not all 1"]),
    ("transpose_bad_perm", [node("Transpose", "x", "y", "tr1", perm=[0, 0, 1])], [], [1, 1, 4], InvalidNetworkError, ["'tr1' (Transpose)", "not a permutation"]),
    ("flatten_axis_out_of_range", [node("Flatten", "x", "y", "fl1", axis=7)], [], [1, 1, 4], InvalidNetworkError, ["'fl1' (Flatten)", "axis 7"]),
    ("nan_initializer", [node("Gemm", "x,layer1.weight", "y", "fc4", transB=1)], [const("layer1.weight", _nan_at((3, 4), (1, 2)))], [1, 4], InvalidNetworkError, ["initializer 'layer1.weight'", "'fc4' (Gemm)", "nan at index (1, 2)"]),
    ("inf_kernel", [node("Conv", "x,K", "y", "conv9")], [const("K", _nan_at((2, 3, 1, 1), (1, 2, 0, 0), -np.inf))], [1, 3, 4, 4], InvalidNetworkError, ["initializer 'K'", "'conv9' (Conv)", "-inf at index (1, 2, 0, 0)"]),
    ("nan_bfloat16_initializer", [node("MatMul", "x,W_bf16", "y", "mm3")], [_bf16_nan()], [1, 3], InvalidNetworkError, ["initializer 'W_bf16'", "'mm3' (MatMul)", "nan at index (2, 3)"]),
    ("nan_constant_node", [node("Constant", "", "c", "const1", value=const("v", _nan_at((4,), (3,)))), node("Add", "x,c", "y", "add3")], [], [1, 4], InvalidNetworkError, ["'const1' (Constant)", "'c'", "nan at index (3,)"]),
    ("nan_by_folding", [node("Div", "z,z", "q", "div0"), node("Mul", "x,q", "y", "mul2")], [const("z", np.zeros(4, np.float32))], [1, 4], InvalidNetworkError, ["'div0' (Div)", "'q'", "nan"]),
    ("inf_alpha", [node("Gemm", "x,W", "y", "fc5", alpha=float("inf"))], [ones("W", 4, 3)], [1, 4], InvalidNetworkError, ["'fc5' (Gemm)", "alpha"]),
    ("int_weight", [node("Gemm", "x,Wi", "y", "fc6")], [ones("Wi", 4, 3, dtype=np.int64)], [1, 4], InvalidNetworkError, ["'fc6' (Gemm)", "'Wi'", "int64"]),
    ("int_constant_in_add", [node("Add", "x,ci", "y", "add4")], [ones("ci", 4, dtype=np.int32)], [1, 4], InvalidNetworkError, ["'add4' (Add)", "'ci'", "int32"]),
    ("bool_constant_in_mul", [node("Mul", "x,cb", "y", "mul3")], [ones("cb", 4, dtype=bool)], [1, 4], InvalidNetworkError, ["'mul3' (Mul)", "'cb'", "bool"]),
    ("float64_weight_not_float32", [node("MatMul", "x,W64", "y", "mm4")], [const("W64", np.full((4, 2), 0.1))], [1, 4], UnsupportedOperationError, ["'MatMul'", "'mm4'", "'W64'", "float64", "index (0, 0)"]),
    ("division_by_zero_constant", [node("Div", "x,d", "y", "div1")], [const("d", np.array([1, 2, 0, 4], np.float32))], [1, 4], InvalidNetworkError, ["'div1' (Div)", "'d'", "index (2,)"]),
    ("undefined_input", [node("Relu", "x", "r", "relu1"), node("Add", "r,ghost", "y", "add5")], [], [1, 4], InvalidNetworkError, ["'add5' (Add)", "'ghost'", "no node"]),
    ("cycle", [node("Relu", "b", "a", "ra"), node("Relu", "a", "b", "rb"), node("Add", "x,b", "y", "add6")], [], [1, 4], InvalidNetworkError, ["cycle", "'ra' (Relu)", "'rb' (Relu)"]),
    ("self_loop", [node("Add", "x,y", "y", "add7")], [], [1, 4], InvalidNetworkError, ["cycle", "'add7' (Add) -> 'add7' (Add)"]),
    ("name_written_twice", [node("Relu", "x", "a", "r1"), node("Relu", "x", "a", "r2"), node("Relu", "a", "y", "r3")], [], [1, 4], InvalidNetworkError, ["'r2' (Relu)", "writes 'a'", "'r1' (Relu)"]),
    ("node_overwrites_input", [node("Relu", "x", "x", "r4"), node("Relu", "x", "y", "r5")], [], [1, 4], InvalidNetworkError, ["'r4' (Relu)", "writes 'x'"]),
    ("huge_constant_of_shape", [node("ConstantOfShape", "s", "big", "cos1"), node("Add", "x,big", "y", "add8")], [const("s", np.array([100000, 100000, 100], np.int64))], [1, 4], InvalidNetworkError, ["'cos1' (ConstantOfShape)", "elements", "MAX_ELEMENTS"]),
    ("huge_expand", [node("Expand", "c,s", "big", "exp1"), node("Add", "x,big", "y", "add9")], [ones("c", 1), const("s", np.array([2**20, 2**20], np.int64))], [1, 4], InvalidNetworkError, ["'exp1' (Expand)", "elements"]),
    ("range_zero_delta", [node("Range", "a,b,d", "r", "rng1"), node("Add", "x,r", "y", "add10")], [const("a", np.float32(0)), const("b", np.float32(4)), const("d", np.float32(0))], [1, 4], InvalidNetworkError, ["'rng1' (Range)", "delta 0"]),
    ("gather_index_out_of_range", [node("Gather", "c,i", "g", "ga1"), node("Add", "x,g", "y", "add11")], [ones("c", 4), const("i", np.array([0, 1, 2, 9], np.int64))], [1, 4], InvalidNetworkError, ["'ga1' (Gather)"]),
    ("integer_division_by_zero", [node("Div", "p,q", "s", "div2"), node("Reshape", "x,s", "y", "rs5")], [const("p", np.array([1, 4], np.int64)), const("q", np.array([1, 0], np.int64))], [1, 4], InvalidNetworkError, ["'div2' (Div)", "division by zero"]),
    ("custom_domain", [helper.make_node("Fancy", ["x"], ["y"], name="fancy1", domain="com.example")], [], [1, 4], UnsupportedOperationError, ["'Fancy'", "'fancy1'", "com.example"]),
    ("unsupported_op", [node("Elu", "x", "y", "elu1")], [], [1, 4], UnsupportedOperationError, ["'Elu'", "'elu1'"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "inits", "in_shape", "error", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in GRAPH_CASES],
)
def test_graph_problem_names_the_node(nodes, inits, in_shape, error, fragments, tmp_path) -> None:
    path = save(tmp_path, model(nodes, inits, in_shape=in_shape))
    with no_side_effects(tmp_path), raises_where(error, *fragments):
        load_onnx(path)


def test_activation_budget_is_checked_per_node(tmp_path: Path, monkeypatch) -> None:
    """All batch-1 activations together are capped (MAX_TOTAL_ELEMENTS): the node that crosses
    the cap is named, before any later node is translated."""
    monkeypatch.setattr(onnx_loader, "MAX_TOTAL_ELEMENTS", 35)
    nodes = [node("Relu", "x", f"a{k}", f"relu{k}") for k in range(3)]
    nodes += [node("Add", "a0,a1", "s", "sum1"), node("Add", "s,a2", "y", "sum2")]
    path = save(tmp_path, model(nodes, in_shape=[1, 10]))
    with no_side_effects(tmp_path), raises_where(InvalidNetworkError, "'relu2' (Relu)", "35"):
        load_onnx(path)


# ----------------------------------------------------------------------------- unusual but valid


def _mlp(dtype: int, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x (1, 4) -> Gemm(W1, b1) -> Relu -> Gemm(W2) -> y, every tensor of ONNX type `dtype`."""
    inits = [
        helper.make_tensor(k, dtype, v.shape, v.astype(np.float32).ravel().tolist())
        for k, v in weights.items()
    ]
    nodes = [
        node("Gemm", "x,W1,b1", "h", "fc1", transB=1),
        node("Relu", "h", "r", "relu"),
        node("Gemm", "r,W2", "y", "fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", dtype, [1, 4])],
        [helper.make_tensor_value_info("y", dtype, [1, 2])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # fmt: skip


def _mlp_weights(cast) -> dict[str, np.ndarray]:
    """Weights exactly representable in `cast` (values rounded through it), as float64."""
    rng = np.random.default_rng(3)
    shapes = {"W1": (6, 4), "b1": (6,), "W2": (6, 2)}
    return {k: cast(rng.uniform(-1, 1, s)).astype(np.float64) for k, s in shapes.items()}


def _mlp_reference(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The network in float64 arithmetic."""
    return np.maximum(x @ w["W1"].T + w["b1"], 0) @ w["W2"]


BF16 = onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)


@pytest.mark.parametrize(
    ("dtype", "cast"),
    [
        pytest.param(TensorProto.FLOAT16, lambda a: a.astype(np.float16), id="float16"),
        pytest.param(TensorProto.BFLOAT16, lambda a: a.astype(BF16), id="bfloat16"),
        pytest.param(TensorProto.DOUBLE, lambda a: a.astype(np.float32), id="float64_exact"),
    ],
)
def test_other_float_types_load_exactly_as_float32(dtype, cast, tmp_path: Path) -> None:
    """Half-precision weights widen exactly to float32 and float64 ones that are float32 values
    load unchanged: the module is the file's network in float32 arithmetic (not a rounded
    copy, and not evaluated in half precision)."""
    import torch

    weights = _mlp_weights(cast)
    net = load_onnx(save(tmp_path, _mlp(dtype, weights)))
    assert all(p.dtype == torch.float32 for p in net.parameters())
    fc1 = net.get_submodule("fc1")
    assert np.array_equal(fc1.weight.numpy().astype(np.float64), weights["W1"])
    x = np.random.default_rng(0).uniform(-1, 1, (16, 4))
    with torch.no_grad():
        y = net(torch.tensor(x, dtype=torch.float32)).numpy()
    assert np.abs(y - _mlp_reference(weights, x.astype(np.float32))).max() < 1e-5


def test_float16_runtime_rounding_is_not_modelled(tmp_path: Path) -> None:
    """onnxruntime evaluates the float16 file in half precision; the loaded module agrees with
    it only up to that rounding (it computes the same network in float32)."""
    import torch

    ort = pytest.importorskip("onnxruntime")
    weights = _mlp_weights(lambda a: a.astype(np.float16))
    m = _mlp(TensorProto.FLOAT16, weights)
    net = load_onnx(save(tmp_path, m))
    x = np.random.default_rng(1).uniform(-1, 1, (1, 4)).astype(np.float16)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    half = session.run(None, {"x": x})[0].astype(np.float64)
    with torch.no_grad():
        full = net(torch.tensor(x.astype(np.float32))).numpy()
    exact = _mlp_reference(weights, x.astype(np.float64))
    assert np.abs(full - exact).max() < 1e-5 and np.abs(half - exact).max() < 1e-2


def test_nodes_out_of_order_are_sorted(tmp_path: Path) -> None:
    """ONNX asks for topologically sorted nodes; a file listing them out of order (but
    acyclic) loads as the same network."""
    import torch

    nodes = [
        node("Add", "h,c", "y", "add"),
        node("Relu", "m", "h", "relu"),
        node("MatMul", "x,W", "m", "mm"),
    ]
    inits = [const("W", np.arange(12, dtype=np.float32).reshape(4, 3) - 5), ones("c", 3)]
    shuffled = load_onnx(save(tmp_path, model(nodes, inits), "shuffled.onnx"))
    ordered = load_onnx(save(tmp_path, model(nodes[::-1], inits), "ordered.onnx"))
    x = torch.randn(5, 4)
    assert torch.equal(shuffled(x), ordered(x))  # fmt: skip


HOSTILE_NAMES = ["class", "self", "torch", "a²", "ﬁ", "x.y/z:0", "1st", "forward", "", "import os"]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=lambda s: repr(s))
def test_hostile_names_load(name: str, tmp_path: Path) -> None:
    """Input and node names are arbitrary strings in ONNX: keywords, non-ASCII (NFKC-folded)
    letters or the names of fx's globals must not break the generated module."""
    import torch

    nodes = [node("Relu", name or "x", "r", name), node("Add", "r,c", "a", name + "2")]
    nodes += [node("Reshape", "a,s", "y", name + "3")]
    inits = [ones("c", 4), const("s", np.array([-1, 2, 2], np.int64))]
    m = model(nodes, inits)
    m.graph.input[0].name = name or "x"
    net = load_onnx(save(tmp_path, m))
    x = torch.randn(3, 4)
    assert torch.equal(net(x), (torch.relu(x) + 1).reshape(3, 2, 2))


def test_external_data_in_place_loads(tmp_path: Path) -> None:
    import torch

    inline = load_onnx(save(tmp_path, _valid(), "inline.onnx"))
    (tmp_path / "ext").mkdir()
    onnx.save(_valid(), tmp_path / "ext/net.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)  # fmt: skip
    external = load_onnx(tmp_path / "ext/net.onnx")
    x = torch.randn(2, 4)
    assert torch.equal(inline(x), external(x))
