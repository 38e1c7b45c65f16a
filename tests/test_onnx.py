"""Tests of `verify.io.onnx_loader.load_onnx` against onnxruntime (a test-only dependency).

Real VNN-COMP 2022 networks from ../shared/data when present, small models built here with
`onnx.helper` for every supported op, malformed files, and the emitted fx vocabulary.
"""

from __future__ import annotations

import gzip
import operator
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from bounds.errors import InvalidNetworkError, UnsupportedOperationError
from relaxations.registry import spellings
from verify.errors import SpecificationError
from verify.io.onnx_loader import load_onnx

ort = pytest.importorskip("onnxruntime")

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
NETWORKS = (
    sorted(p for p in (DATA / "vnncomp2022").rglob("*") if p.name.endswith((".onnx", ".onnx.gz")))
    if DATA.is_dir()
    else []
)
# Elementwise activations: the torch functions and modules relaxations declare (the registry).
ACTIVATIONS = tuple(spelling.target for _, spelling in spellings())
ALLOWED_MODULES = (
    nn.Linear,
    nn.Conv2d,
    nn.ConvTranspose2d,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.AvgPool2d,
    nn.Flatten,
    nn.Identity,
    *(target for target in ACTIVATIONS if isinstance(target, type)),
)
ALLOWED_FUNCTIONS = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.neg,
    operator.getitem,
    getattr,
    torch.reshape,
    torch.permute,
    torch.cat,
    torch.index_select,
    torch.matmul,
    torch.sum,
    torch.mean,
    torch.where,
    torch.nn.functional.pad,
    # Nonlinear (verify/io/onnx_nonlinear.py; bounds/fx_activations.py, fx_nonlinear.py).
    torch.maximum,
    torch.minimum,
    torch.nn.functional.softmax,
    torch.nn.functional.max_pool2d,
    *(target for target in ACTIVATIONS if callable(target) and not isinstance(target, type)),
}
ALLOWED_METHODS = {"expand"}


# ----------------------------------------------------------------------------- helpers


def assert_vocabulary(gm: torch.fx.GraphModule) -> None:
    """Every node is in the vocabulary that the bound graph builder consumes."""
    buffers = dict(gm.named_buffers())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            assert type(module) in ALLOWED_MODULES, (node, module)
            if isinstance(module, nn.Flatten):
                assert (module.start_dim, module.end_dim) == (1, -1)
            if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
                assert not module.training
        elif node.op == "call_function":
            assert node.target in ALLOWED_FUNCTIONS, node
            if node.target is torch.reshape:
                assert isinstance(node.args[1], tuple) and node.args[1][0] == -1
        elif node.op == "call_method":
            assert node.target in ALLOWED_METHODS, node
        elif node.op == "get_attr":
            assert node.target in buffers, node
        else:
            assert node.op in ("placeholder", "output"), node


def ort_outputs(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    """onnxruntime's outputs on the batch `x` (`[N, *per-sample shape]`), one sample at a time
    in the file's declared input shapes (batch 1; several inputs take consecutive slices of the
    flattened sample); each row is the sample's outputs flattened and concatenated in their
    declared order: `[N, total]`."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    infos = session.get_inputs()
    shapes = [[d if isinstance(d, int) and d > 0 else 1 for d in i.shape] for i in infos]
    rows = []
    for sample in x:
        flat, feeds, start = sample.reshape(-1), {}, 0
        for info, shape in zip(infos, shapes):
            size = int(np.prod(shape))
            feeds[info.name] = flat[start : start + size].reshape(shape)
            start += size
        outs = session.run(None, feeds)
        rows.append(np.concatenate([np.asarray(o, np.float32).reshape(-1) for o in outs]))
    return np.stack(rows)


def random_inputs(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """8 inputs: 4 uniform in [-1, 1] and 4 uniform in [0, 1], float32."""
    rng = np.random.default_rng(seed)
    signed = rng.uniform(-1.0, 1.0, size=(4, *shape))
    unit = rng.uniform(0.0, 1.0, size=(4, *shape))
    return np.concatenate([signed, unit]).astype(np.float32)


def assert_matches_ort(gm: torch.fx.GraphModule, model_bytes: bytes, seed: int = 0) -> None:
    """Agreement with onnxruntime (batch 1) and batch 8 == eight batches of 1."""
    x = random_inputs(gm.input_shape, seed)
    expected = ort_outputs(model_bytes, x)
    with torch.no_grad():
        singles = torch.cat([gm(torch.from_numpy(x[i : i + 1])) for i in range(len(x))]).numpy()
        batched = gm(torch.from_numpy(x)).numpy()
    assert singles.shape == (8, *gm.output_shape)
    singles, batched = singles.reshape(8, -1), batched.reshape(8, -1)
    assert singles.shape == expected.shape
    tol = 1e-5 * max(1.0, float(np.abs(expected).max()))
    assert np.abs(singles - expected).max() <= tol
    assert np.abs(batched - singles).max() <= tol
    assert_vocabulary(gm)


def tensor(name: str, shape: tuple[int, ...], seed: int = 0, low: float = -1.0) -> TensorProto:
    rng = np.random.default_rng([zlib.crc32(name.encode()), seed, *shape])
    array = rng.uniform(low, 1.0, size=shape).astype(np.float32)
    return numpy_helper.from_array(array, name)


def make_model(
    nodes: list,
    inits: list,
    in_shape: list,
    opset: int = 17,
    ir_version: int = 8,
    extra_inputs: tuple = (),
) -> onnx.ModelProto:
    """A model with input "x" (and `extra_inputs`, value infos) and output "y", its shape
    inferred; `in_shape` may use "N" as a symbolic batch."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
    model.graph.output[0].type.CopyFrom(inferred.type)
    return model


def load_model(tmp_path: Path, model: onnx.ModelProto, name: str = "net.onnx"):
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return load_onnx(path)


# ----------------------------------------------------------------------------- real networks


@pytest.mark.data
@pytest.mark.parametrize(
    "path",
    NETWORKS or [pytest.param(None, marks=pytest.mark.skip(reason=f"no networks under {DATA}"))],
    ids=lambda p: p.name if isinstance(p, Path) else "none",
)
def test_real_network_matches_onnxruntime(path: Path) -> None:
    gm = load_onnx(path)
    data = path.read_bytes()
    data = gzip.decompress(data) if path.name.endswith(".gz") else data
    assert gm.source_path == str(path)
    assert_matches_ort(gm, data, seed=len(path.name))


@pytest.mark.data
@pytest.mark.skipif(not NETWORKS, reason=f"no networks under {DATA}")
def test_real_network_shapes() -> None:
    root = DATA / "vnncomp2022"
    acas = load_onnx(root / "acasxu/onnx/ACASXU_run2a_1_1_batch_2000.onnx.gz")
    mnist = load_onnx(root / "mnist_fc/onnx/mnist-net_256x2.onnx.gz")
    oval = load_onnx(root / "oval21/onnx/cifar_base_kw.onnx.gz")
    assert (acas.input_shape, acas.output_shape) == ((1, 1, 5), (5,))
    assert (mnist.input_shape, mnist.output_shape) == ((784, 1), (10,))
    assert (oval.input_shape, oval.output_shape) == ((3, 32, 32), (10,))
    # ACAS Xu: MatMul + Add pairs become Linear layers with a bias.
    linears = [m for m in acas.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 7 and all(m.bias is not None for m in linears)


# ----------------------------------------------------------------------------- small models


def n(spec: str, name: str = "", **attrs) -> onnx.NodeProto:
    """A node from "Op in1,in2 -> out" (named after its op and output unless `name`)."""
    op_inputs, output = spec.split("->")
    op, _, inputs = op_inputs.strip().partition(" ")
    ins = [i.strip() for i in inputs.split(",") if i.strip()]
    output = output.strip()
    return helper.make_node(op, ins, [output], name=name or f"{op}_{output}", **attrs)


def scalar(name: str, value: float) -> TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def i64(name: str, *values: int, scalar: bool = False) -> TensorProto:
    array = np.array(values[0] if scalar else list(values), np.int64)
    return numpy_helper.from_array(array, name)


BN = "BatchNormalization h,s,b,m,v -> y"


def bn_params(c: int) -> list:
    return [tensor("s", (c,)), tensor("b", (c,)), tensor("m", (c,)), tensor("v", (c,), low=0.1)]


def pool(include: int, ceil: int, pad: int) -> tuple:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [pad] * 4}
    attrs.update(count_include_pad=include, ceil_mode=ceil)
    return [n("AveragePool x -> y", **attrs)], [], [1, 2, 8, 7]


# name: (nodes, initializers, input shape)
SMALL_CASES = {
    "gemm_transB1_alpha_beta": (
        [n("Gemm x,W,C -> y", alpha=0.5, beta=2.0, transB=1)],
        [tensor("W", (4, 6)), tensor("C", (4,))],
        [1, 6],
    ),
    "gemm_transB0_alpha_beta": (
        [n("Gemm x,W,C -> y", alpha=1.5, beta=-0.5, transB=0)],
        [tensor("W", (6, 4)), tensor("C", (1, 4))],
        [1, 6],
    ),
    "gemm_no_bias_symbolic_batch": ([n("Gemm x,W -> y")], [tensor("W", (6, 4))], ["N", 6]),
    "matmul_add_relu_matmul": (
        [n("MatMul x,W -> h"), n("Add h,C -> a"), n("Relu a -> r"), n("MatMul r,W2 -> y")],
        [tensor("W", (6, 4)), tensor("C", (4,)), tensor("W2", (4, 3))],
        [1, 6],
    ),
    "matmul_output_used_twice": (
        [n("MatMul x,W -> h"), n("Add h,C -> a"), n("Add a,h -> y")],
        [tensor("W", (6, 6)), tensor("C", (6,))],
        [1, 6],
    ),
    "matmul_3d_add_matrix": (
        [n("MatMul x,W -> h"), n("Add C,h -> y")],
        [tensor("W", (6, 4)), tensor("C", (2, 4))],
        [1, 2, 6],
    ),
    "conv_stride_pad_dilation": (
        [n("Conv x,W,B -> y", strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2])],
        [tensor("W", (4, 3, 3, 3)), tensor("B", (4,))],
        [1, 3, 9, 9],
    ),
    "conv_group_no_bias": (
        [n("Conv x,W -> y", group=2, strides=[1, 2], pads=[0, 1, 0, 1])],
        [tensor("W", (6, 2, 3, 3))],
        [1, 4, 8, 8],
    ),
    "conv_same_upper": (
        [n("Conv x,W -> y", auto_pad="SAME_UPPER", kernel_shape=[3, 3])],
        [tensor("W", (2, 3, 3, 3))],
        ["N", 3, 5, 5],
    ),
    "batchnorm_2d": (
        [n("Conv x,W -> h", pads=[1, 1, 1, 1]), n(BN, epsilon=1e-3)],
        [tensor("W", (4, 3, 3, 3)), *bn_params(4)],
        [1, 3, 6, 6],
    ),
    "batchnorm_1d": (
        [n("Gemm x,W -> h", transB=1), n(BN)],
        [tensor("W", (5, 6)), *bn_params(5)],
        [1, 6],
    ),
    "residual_add_sub": (
        [
            n("Conv x,W -> c1", pads=[1, 1, 1, 1]),
            n("Relu c1 -> r1"),
            n("Conv r1,W2 -> c2", pads=[1, 1, 1, 1]),
            n("Add c2,x -> s"),
            n("Sub x,s -> y"),
        ],
        [tensor("W", (2, 2, 3, 3)), tensor("W2", (2, 2, 3, 3))],
        [1, 2, 5, 5],
    ),
    **{
        f"avgpool_include{i}_ceil{c}_pad{p}": pool(i, c, p)
        for i in (0, 1)
        for c in (0, 1)
        for p in (0, 1)
    },
    "avgpool_ceil_drops_last_window": (
        [n("AveragePool x -> y", kernel_shape=[3, 3], strides=[3, 3], pads=[1] * 4, ceil_mode=1)],
        [],
        [1, 1, 5, 5],
    ),
    "node_names_clashing_with_module_attributes": (
        [
            n("Relu x -> a", name="graph"),
            n("Identity a -> b", name="code"),
            n("Relu b -> y", name="forward"),
        ],
        [],
        [1, 4],
    ),
    "sub_mul_div_add_constants": (
        [
            n("Sub x,c -> a"),
            n("Sub c,a -> b"),
            n("Mul k,b -> m"),
            n("Mul m,two -> m2"),
            n("Div m2,d -> q"),
            n("Add c,q -> y"),
        ],
        [
            tensor("c", (1, 3, 1, 1)),
            tensor("k", (3, 1, 1)),
            tensor("d", (1, 1, 4), low=0.5),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        ],
        [1, 3, 2, 4],
    ),
    "reshape_folded_shape": (
        [
            n("Shape x -> shp"),
            n("Gather shp,zero -> batch", axis=0),
            n("Unsqueeze batch,axes0 -> batch1"),
            n("Constant -> minus1", value=i64("v", -1)),
            n("Concat batch1,minus1 -> target", axis=0),
            n("Reshape x,target -> flat"),
            n("Reshape flat,shape3 -> r3"),
            n("Gemm flat,W -> g", transB=1),
            n("Reshape r3,shape_zero -> r0"),
            n("Flatten r0 -> f"),
            n("Add g,f2 -> y"),
        ],
        [
            i64("zero", 0, scalar=True),
            i64("axes0", 0),
            i64("shape3", 1, 4, 6),
            i64("shape_zero", 0, 6, -1),
            tensor("W", (24, 24)),
            tensor("f2", (24,)),
        ],
        [1, 2, 3, 4],
    ),
    "folded_flatten_negative_axis": (
        [n("Flatten c -> f", axis=-1), n("Add x,f -> y")],
        [tensor("c", (1, 2, 3))],
        [1, 2, 3],
    ),
    "identity_dropout_flatten_axis2": (
        [n("Identity x -> i"), n("Dropout i -> d"), n("Relu d -> r"), n("Flatten r -> y", axis=2)],
        [],
        [1, 1, 5, 3],
    ),
    # Once refused ("mixes the batch dimension"): ONNX's batch is 1, so these are exact.
    "reshape_to_rank1": ([n("Reshape x,s -> y")], [i64("s", -1)], [1, 4]),
    "flatten_axis0": ([n("Flatten x -> y", axis=0)], [], [1, 4]),
    "squeeze_batch": ([n("Squeeze x,ax -> y")], [i64("ax", 0)], [1, 1, 4]),
    "unsqueeze_before_batch": ([n("Unsqueeze x,ax -> y")], [i64("ax", 0)], [1, 4]),
    "transpose_real_dims": ([n("Transpose x -> y", perm=[0, 2, 1])], [], [1, 2, 3]),
    "conv_1d": (
        [n("Conv x,W,B -> y", pads=[1, 1], strides=[2], dilations=[2], group=2)],
        [tensor("W", (4, 1, 3)), tensor("B", (4,))],
        [1, 2, 9],
    ),
    "transpose_squeeze_unsqueeze": (
        [
            n("Transpose x -> t", perm=[0, 2, 1]),
            n("Squeeze t,axes2 -> s"),
            n("Unsqueeze s,axes1 -> u"),
            n("Mul u,k -> y"),
        ],
        [i64("axes2", 2), i64("axes1", -2), tensor("k", (6,))],
        [1, 1, 6],
    ),
}


@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_small_model_matches_onnxruntime(case: str, tmp_path: Path) -> None:
    nodes, inits, in_shape = SMALL_CASES[case]
    model = make_model(nodes, inits, in_shape)
    onnx.checker.check_model(model)
    gm = load_model(tmp_path, model)
    assert_matches_ort(gm, model.SerializeToString())


def test_old_opset_lists_initializers_as_inputs(tmp_path: Path) -> None:
    """ACAS Xu style (IR 3, opset 8): weights also appear among graph.input; gzip-compressed."""
    nodes = [
        n("Sub x,mu -> s"),
        n("Flatten s -> f", axis=1),
        n("MatMul f,W -> m"),
        n("Add m,B -> a"),
        n("Unsqueeze a -> u", axes=[2]),
        n("Squeeze u -> y", axes=[2]),
    ]
    inits = [tensor("mu", (1, 1, 1, 5)), tensor("W", (5, 3)), tensor("B", (3,))]
    listed = [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, t.dims) for t in inits]
    model = make_model(nodes, inits, [1, 1, 1, 5], opset=8, ir_version=3, extra_inputs=listed)
    path = tmp_path / "old.onnx.gz"
    path.write_bytes(gzip.compress(model.SerializeToString()))
    gm = load_onnx(path)
    assert gm.input_shape == (1, 1, 5) and gm.output_shape == (3,)
    assert_matches_ort(gm, model.SerializeToString())


def test_module_attributes(tmp_path: Path) -> None:
    nodes, inits, in_shape = SMALL_CASES["batchnorm_2d"]
    gm = load_model(tmp_path, make_model(nodes, inits, in_shape), name="bn.onnx")
    assert gm.input_shape == (3, 6, 6) and gm.output_shape == (4, 6, 6)
    assert gm.source_path == str(tmp_path / "bn.onnx")
    assert not gm.training and all(not m.training for m in gm.modules())
    floats = [*gm.parameters()] + [
        t for name, t in gm.named_buffers() if not name.endswith("num_batches_tracked")
    ]
    assert floats and all(t.dtype == torch.float32 and not t.requires_grad for t in floats)
    assert_vocabulary(gm)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("op", "attrs"), [("Elu", {}), ("LpPool", {"kernel_shape": [2, 2]}), ("Erf", {})]
)
def test_unsupported_operation_names_op_and_node(op: str, attrs: dict, tmp_path: Path) -> None:
    nodes = [n("Relu x -> r"), n(f"{op} r -> y", name="the_node", **attrs)]
    with pytest.raises(UnsupportedOperationError, match="the_node") as info:
        load_model(tmp_path, make_model(nodes, [], [1, 2, 4, 4]))
    assert info.value.operation == op and info.value.node == "the_node"
    assert op in str(info.value)


UNSUPPORTED_FORMS = {
    "asymmetric_pads": (
        "Conv",
        [n("Conv x,W -> y", pads=[0, 0, 1, 1])],
        [tensor("W", (2, 2, 3, 3))],
        [1, 2, 5, 5],
    ),
    "gemm_transA": ("Gemm", [n("Gemm x,W -> y", transA=1)], [tensor("W", (1, 3))], [1, 4]),
    "conv_3d": ("Conv", [n("Conv x,W -> y")], [tensor("W", (2, 2, 3, 3, 3))], [1, 2, 5, 5, 5]),
    "maxpool_asymmetric_pads": ("MaxPool", [n("MaxPool x -> y", kernel_shape=[2, 2],
                                pads=[0, 0, 1, 1])], [], [1, 1, 4, 4]),
    "maxpool_ceil_mode": ("MaxPool", [n("MaxPool x -> y", kernel_shape=[2, 2], ceil_mode=1)],
                          [], [1, 1, 5, 5]),
    "pow_fractional": ("Pow", [n("Pow x,e -> y")], [tensor("e", ())], [1, 4]),
    "softmax_batch_axis": ("Softmax", [n("Softmax x -> y", axis=0)], [], [1, 4]),
}  # fmt: skip

NONLINEAR_CASES = {
    "mul_of_activations": ([n("Relu x -> r"), n("Mul x,r -> y")], [], [1, 4]),
    "div_of_activations": ([n("Sigmoid x -> s"), n("Div x,s -> y")], [], [1, 4]),
    "matmul_of_activations": (
        [n("Transpose x -> t", perm=[0, 2, 1]), n("MatMul x,t -> y")], [], [1, 2, 3]
    ),
    "sigmoid_tanh_abs_sign": (
        [n("Sigmoid x -> a"), n("Tanh a -> b"), n("Abs b -> c"), n("Sign c -> y")], [], [1, 4]
    ),
    "floor_exp_sin_cos": (
        [n("Floor x -> a"), n("Exp a -> b"), n("Sin b -> c"), n("Cos c -> y")], [], [1, 4]
    ),
    "reciprocal_of_exp": ([n("Exp x -> a"), n("Reciprocal a -> y")], [], [1, 4]),
    "constant_over_activation": ([n("Exp x -> a"), n("Div c,a -> y")], [tensor("c", (4,))],
                                 [1, 4]),
    "leaky_prelu_clip": (
        [n("LeakyRelu x -> a", alpha=0.2), n("PRelu a,s -> b"), n("Clip b,lo,hi -> y")],
        [tensor("s", (1,)), scalar("lo", -0.5), scalar("hi", 0.5)],
        [1, 4],
    ),
    "pow_2_and_3": ([n("Pow x,two -> a"), n("Pow a,three -> y")],
                    [scalar("two", 2.0), scalar("three", 3.0)], [1, 4]),
    "softmax_last_axis": ([n("Softmax x -> y", axis=-1)], [], [1, 2, 5]),
    "prelu_per_channel": ([n("PRelu x,s -> y")], [tensor("s", (3, 1, 1))], [1, 3, 2, 2]),
    "maxpool_2x2_stride_1": ([n("MaxPool x -> y", kernel_shape=[2, 2], strides=[1, 1])], [],
                             [1, 2, 5, 5]),
    "maxpool_padded": ([n("MaxPool x -> y", kernel_shape=[2, 2], pads=[1, 1, 1, 1])], [],
                       [1, 1, 4, 4]),
    "maxpool_3x3_stride_2_padded": ([n("MaxPool x -> y", kernel_shape=[3, 3], strides=[2, 2],
                                       pads=[1, 1, 1, 1])], [], [1, 2, 5, 6]),
    "max_min_broadcast": ([n("Relu x -> r"), n("Max x,r,c -> a"), n("Min a,x -> y")],
                          [tensor("c", (4,))], [1, 4]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NONLINEAR_CASES))
def test_nonlinear_nodes_match_onnxruntime(case: str, tmp_path: Path) -> None:
    nodes, inits, in_shape = NONLINEAR_CASES[case]
    model = make_model(nodes, inits, in_shape)
    onnx.checker.check_model(model)
    gm = load_model(tmp_path, model)
    assert_matches_ort(gm, model.SerializeToString())
    assert_vocabulary(gm)


@pytest.mark.parametrize("case", sorted(UNSUPPORTED_FORMS))
def test_unsupported_forms_raise(case: str, tmp_path: Path) -> None:
    op, nodes, inits, in_shape = UNSUPPORTED_FORMS[case]
    with pytest.raises(UnsupportedOperationError) as info:
        load_model(tmp_path, make_model(nodes, inits, in_shape))
    assert info.value.operation == op and info.value.node == nodes[-1].name


def _valid_bytes() -> bytes:
    nodes, inits, in_shape = SMALL_CASES["conv_stride_pad_dilation"]
    return make_model(nodes, inits, in_shape).SerializeToString()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("truncated.onnx", lambda: _valid_bytes()[: len(_valid_bytes()) // 2]),
        ("garbage.onnx", lambda: b"this is not an ONNX model at all \x00\xff" * 10),
        ("empty.onnx", lambda: b""),
        ("truncated.onnx.gz", lambda: gzip.compress(_valid_bytes())[:-40]),
    ],
)
def test_malformed_file_raises_specification_error(name, content, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(content())
    with pytest.raises(SpecificationError) as info:
        load_onnx(path)
    assert info.value.path == str(path) and str(path) in str(info.value)


def test_missing_file_raises_specification_error(tmp_path: Path) -> None:
    with pytest.raises(SpecificationError, match="does_not_exist"):
        load_onnx(tmp_path / "does_not_exist.onnx")


def test_missing_initializer_names_the_node(tmp_path: Path) -> None:
    model = make_model([n("MatMul x,W_missing -> y")], [], [1, 4])
    with pytest.raises(InvalidNetworkError, match=r"'MatMul_y' \(MatMul\) reads 'W_missing'"):
        load_model(tmp_path, model)


def test_several_inputs_are_concatenated_flat(tmp_path: Path) -> None:
    x2 = helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 2])
    model = make_model([n("Reshape x2,s -> r"), n("Sub x,r -> y")], [i64("s", 1, 4)], [1, 4],
                       extra_inputs=(x2,))  # fmt: skip
    gm = load_model(tmp_path, model)
    assert gm.input_shape == (8,) and gm.output_shape == (4,)
    assert_matches_ort(gm, model.SerializeToString())


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weight_raises_invalid_network(bad: float, tmp_path: Path) -> None:
    weight = np.ones((3, 4), np.float32)
    weight[1, 2] = bad
    inits = [numpy_helper.from_array(weight, "layer1.weight")]
    model = make_model([n("Gemm x,layer1.weight -> y", transB=1)], inits, [1, 4])
    with pytest.raises(InvalidNetworkError, match=r"layer1\.weight"):
        load_model(tmp_path, model)
