"""The ONNX front end on general networks (issue 12): inputs without a batch dimension,
folded shape subgraphs, the linear and shape ops (each against onnxruntime, then through the
bound graph: forward, CROWN and IBP bounds containing sampled outputs, with ReLUs around the
op), several graph outputs, the VNN-COMP 2023 networks, and typed errors for what stays
unsupported."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from bounds.errors import (
    InvalidNetworkError,
    ShapeMismatchError,
    UnsupportedOperationError,
)
from bounds.graph.graph import build_graph
from tests.bad_inputs.conftest import raises_where
from tests.soundness import assert_contains, box_samples, spec_values
from tests.test_onnx import DATA, assert_matches_ort, i64, n, ort_outputs, random_inputs, tensor
from verify import bounds
from verify.io.onnx_loader import load_onnx

pytest.importorskip("onnxruntime")

BIG = 2**62  # INT_MAX-like slice ends, as exporters write them


def f32(name: str, *values: float, shape: tuple | None = None) -> TensorProto:
    array = np.array(values, np.float32)
    return numpy_helper.from_array(array if shape is None else array.reshape(shape), name)


def model(nodes, inits, in_shape, opset: int = 17, outputs=("y",), in_name: str = "x"):
    graph = helper.make_graph(
        nodes,
        "general",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(m).graph.output
    for out, found in zip(m.graph.output, inferred):
        if found.type.tensor_type.HasField("shape"):
            out.type.CopyFrom(found.type)
        else:  # malformed cases: inference gives up
            out.type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, ["d"]))
    return m


def save_load(tmp_path: Path, m: onnx.ModelProto, name: str = "net.onnx"):
    path = tmp_path / name
    path.write_bytes(m.SerializeToString())
    return load_onnx(path)


def resize(mode: str, transform: str, scales=None, sizes=None, nearest: str = "round_prefer_floor"):
    ins = ["x", "", "sc" if scales else "", "sz" if sizes else ""]
    node = helper.make_node("Resize", [i for i in ins[:3]] + ([ins[3]] if sizes else []), ["y"],
                            name="rs", mode=mode, coordinate_transformation_mode=transform,
                            nearest_mode=nearest)  # fmt: skip
    inits = [f32("sc", *scales)] if scales else [i64("sz", *sizes)]
    return [node], inits, [1, 2, 4, 3]


def split13(sizes_input: bool):
    ins = "x,sp" if sizes_input else "x"
    node = helper.make_node("Split", ins.split(","), ["a", "b"], name="split", axis=1)
    nodes = [node, n("Concat b,a -> y", axis=1)]
    return nodes, [i64("sp", 2, 4)] if sizes_input else [], [1, 6, 4]


def cls_token():
    """ViT's class token: a ConstantOfShape of folded shape plus a vector, concatenated."""
    nodes = [
        n("Shape x -> s"),
        n("Gather s,zero -> batch", axis=0),
        n("Unsqueeze batch,ax0 -> b1"),
        n("Concat b1,one_four -> shp", axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["shp"],
            ["zeros"],
            name="cos",
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]),
        ),
        n("Add zeros,tok -> cls"),
        n("Concat cls,x -> c", axis=1),
        n("Add c,pos -> y"),
    ]
    inits = [i64("zero", 0, scalar=True), i64("ax0", 0), i64("one_four", 1, 4)]
    return nodes, [*inits, tensor("tok", (4,)), tensor("pos", (4, 4))], [1, 3, 4]


def expand_folded():
    nodes = [n("Shape x -> s"), n("Concat two,s -> shp", axis=0), n("Expand x,shp -> y")]
    return nodes, [i64("two", 2)], [1, 3, 1]


def conv_t(**attrs):
    return (
        [n("ConvTranspose x,W,B -> y", **attrs)],
        [tensor("W", (4, 3, 3, 3)), tensor("B", (6,))],
        [1, 4, 4, 5],
    )


# name: (nodes, initializers, input shape[, opset])
CASES = {
    "input_rank1_size1": ([n("MatMul x,W -> y")], [tensor("W", (1, 3))], [1]),
    "input_rank1_left_matmul": ([n("MatMul W,x -> h"), n("Add h,c -> y")], [tensor("W", (3, 5)), tensor("c", (3,))], [5]),
    "input_leading_dim": ([n("Reshape x,s -> r"), n("Gemm x,W,C -> y", transB=1)], [i64("s", 1, 12, 8), tensor("W", (4, 8)), tensor("C", (4,))], [12, 8]),
    "symbolic_batch_rank1": ([n("Mul x,k -> y")], [tensor("k", (1,))], ["N"]),
    "slice_steps": ([n("Slice x,st,en,ax,sp -> y")], [i64("st", 1, -1, 0), i64("en", 3, -BIG, 5), i64("ax", 1, 2, 3), i64("sp", 1, -2, 2)], [1, 4, 6, 5]),
    "slice_axis0_unbatched": ([n("Slice x,st,en,ax,sp -> y")], [i64("st", 2), i64("en", 10), i64("ax", 0), i64("sp", 3)], [12, 8]),
    "slice_opset9_attributes": ([n("Slice x -> y", starts=[0, 1], ends=[BIG, 3], axes=[0, 2])], [], [1, 2, 5], 9),
    "split_sizes_concat": split13(True),
    "split_equal_parts": split13(False),
    "split_opset11_attribute": ([helper.make_node("Split", ["x"], ["a", "b"], name="sp", axis=2, split=[1, 3]), n("Slice b,z,o,two -> c"), n("Sub c,a -> y")], [i64("z", 0), i64("o", 1), i64("two", 2)], [1, 3, 4], 11),
    "concat_constant_block": cls_token(),
    "concat_axis0_unbatched": ([n("Concat c,x -> y", axis=0)], [tensor("c", (2, 4))], [3, 4]),
    "concat_two_activations_axis0": ([n("Relu x -> r"), n("Concat x,r -> y", axis=0)], [], [1, 3]),
    "transpose_any_perm": ([n("Transpose x -> y", perm=[0, 3, 1, 2])], [], [1, 2, 3, 4]),
    "transpose_moves_batch_axis": ([n("Transpose x -> y", perm=[2, 0, 1])], [], [1, 2, 3]),
    "transpose_unbatched_then_matmul": ([n("Transpose x -> t", perm=[1, 0]), n("MatMul t,W -> y")], [tensor("W", (12, 5))], [12, 8]),
    "gather_matrix_negative_indices": ([n("Gather x,i -> y", axis=2)], [i64("i", -1, 0, 2, 2)], [1, 4, 5]),
    "gather_scalar_index": ([n("Gather x,i -> y", axis=1)], [i64("i", 2, scalar=True)], [1, 4, 5]),
    "gather_axis0_rank1": ([n("Gather x,i -> y", axis=0)], [i64("i", 4, 0, 0)], [5]),
    "gather_axis0_batched": ([n("Gather x,i -> y", axis=0)], [i64("i", 0, 0)], [1, 3]),
    "expand_new_axes": ([n("Expand x,s -> y")], [i64("s", 2, 1, 3, 4)], [1, 3, 1]),
    "expand_folded_shape": expand_folded(),
    "pad_value_and_crop": ([n("Pad x,p,v -> y")], [i64("p", 0, 0, 1, -1, 0, 0, 2, 1), f32("v", 0.5, shape=())], [1, 2, 3, 4]),
    "pad_axis0_opset10": ([n("Pad x -> y", pads=[1, 0, 0, 2], value=-1.0)], [], [1, 3], 10),
    "pad_zero_widths": ([n("Pad x,p -> y")], [i64("p", 0, 0, 0, 0)], [1, 3]),
    "neg_sub_add_broadcast": ([n("Neg x -> a"), n("Slice x,z,o,one -> s"), n("Add a,s -> b"), n("Sub s,b -> y")], [i64("z", 0), i64("o", 1), i64("one", 1)], [1, 3, 4]),
    "add_activations_of_different_rank": ([n("ReduceSum x,ax -> s", keepdims=0), n("Add x,s -> y")], [i64("ax", 1)], [1, 3, 4]),
    "reduce_sum_keepdims": ([n("ReduceSum x,ax -> y")], [i64("ax", -1, 1)], [1, 3, 4, 2]),
    "reduce_sum_opset11_attribute": ([n("ReduceSum x -> y", axes=[2], keepdims=0)], [], [1, 3, 4], 11),
    "reduce_mean_all_axes": ([n("ReduceMean x -> y", keepdims=1)], [], [1, 3, 4]),
    "reduce_mean_axis0_drop": ([n("ReduceMean x -> y", axes=[0, 2], keepdims=0)], [], [1, 3, 4], 13),
    "reduce_max_odd_axis_input": ([n("ReduceMax x,ax -> y")], [i64("ax", 2)], [1, 3, 7], 18),
    "reduce_min_two_axes_attribute": ([n("ReduceMin x -> y", axes=[1, -1], keepdims=0)], [], [1, 3, 4], 13),
    "reduce_max_all_axes": ([n("ReduceMax x -> y", keepdims=1)], [], [1, 2, 3], 13),
    "reduce_max_noop_empty_axes": ([n("ReduceMax x,ax -> y", noop_with_empty_axes=1)], [numpy_helper.from_array(np.zeros(0, np.int64), "ax")], [1, 3], 18),
    "reduce_and_argmax_of_constants": ([n("ReduceSum c,ax -> s", keepdims=1), n("ArgMax c -> i", axis=1, keepdims=0), n("Gather x,i -> g", axis=1), n("Add g,s -> y")], [tensor("c", (2, 4)), i64("ax", 1)], [1, 4, 3], 13),
    "matmul_constant_left": ([n("MatMul W,x -> y")], [tensor("W", (5, 3))], [1, 3, 4]),
    "matmul_constant_left_contracts_axis0": ([n("MatMul W,x -> y")], [tensor("W", (2, 1))], [1, 4]),
    "matmul_vector_right": ([n("MatMul x,v -> y")], [tensor("v", (4,))], [1, 3, 4]),
    "matmul_rank3_right_with_bias": ([n("MatMul x,W -> h"), n("Add b,h -> y")], [tensor("W", (4, 2)), tensor("b", (2,))], [1, 3, 4]),
    "gemm_unbatched_rows": ([n("Gemm x,W,C -> y", transB=1)], [tensor("W", (5, 8)), tensor("C", (12, 1))], [12, 8]),
    "conv_transpose_stride_pads": conv_t(strides=[2, 2], pads=[1, 1, 1, 1], group=2),
    "conv_transpose_output_padding_dilation": conv_t(strides=[2, 3], output_padding=[1, 2], dilations=[2, 1], group=2),
    "conv_transpose_asymmetric_pads": conv_t(strides=[2, 1], pads=[0, 1, 2, 0], group=2),
    "conv_transpose_output_shape": conv_t(strides=[2, 2], output_shape=[8, 9], group=2),
    "conv_transpose_same_upper": conv_t(strides=[2, 2], auto_pad="SAME_UPPER", group=2),
    "resize_nearest_half_pixel": resize("nearest", "half_pixel", scales=[1, 1, 2, 1.5]),
    "resize_nearest_asymmetric_floor": resize("nearest", "asymmetric", sizes=[1, 2, 7, 5], nearest="floor"),
    "resize_nearest_align_ceil": resize("nearest", "align_corners", sizes=[1, 2, 6, 2], nearest="round_prefer_ceil"),
    "resize_linear_half_pixel": resize("linear", "half_pixel", scales=[1, 1, 2, 2]),
    "resize_linear_align_corners": resize("linear", "align_corners", sizes=[1, 2, 7, 5]),
    "resize_linear_asymmetric": resize("linear", "asymmetric", scales=[1, 1, 1.5, 3]),
    "resize_linear_pytorch_half_pixel": resize("linear", "pytorch_half_pixel", sizes=[1, 2, 1, 6]),
    "upsample_opset9_nearest": ([n("Upsample x,sc -> y", mode="nearest")], [f32("sc", 1, 1, 2, 3)], [1, 2, 3, 2], 9),
    "upsample_opset9_linear": ([n("Upsample x,sc -> y", mode="linear")], [f32("sc", 1, 1, 2, 2)], [1, 2, 3, 2], 9),
    "batchnorm_after_relu_rank3": ([n("Relu x -> r"), n("BatchNormalization r,s,b,m,v -> y")], [tensor("s", (3,)), tensor("b", (3,)), tensor("m", (3,)), tensor("v", (3,), low=0.1)], [1, 3, 5]),
    "batchnorm_unbatched_input": ([n("BatchNormalization x,s,b,m,v -> y")], [tensor("s", (4,)), tensor("b", (4,)), tensor("m", (4,)), tensor("v", (4,), low=0.1)], [3, 4, 5]),
    "batchnorm_rank5": ([n("BatchNormalization x,s,b,m,v -> y")], [tensor("s", (2,)), tensor("b", (2,)), tensor("m", (2,)), tensor("v", (2,), low=0.1)], [1, 2, 2, 3, 2]),
    "cast_between_float_types": ([n("Cast x -> d", to=TensorProto.DOUBLE), n("Cast d -> f", to=TensorProto.FLOAT), n("Relu f -> y")], [], [1, 4]),
    "where_constant_condition": ([n("Where c,x,k -> w"), n("Relu x -> r"), n("Where c2,w,r -> y")], [numpy_helper.from_array(np.array([True, False, True, True]), "c"), tensor("k", (3, 1)), numpy_helper.from_array(np.array([[True], [False], [True]]), "c2")], [1, 4]),
}  # fmt: skip


def _case(name: str):
    nodes, inits, shape, *rest = CASES[name]
    return model(nodes, inits, shape, *rest)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    m = _case(name)
    gm = save_load(tmp_path, m)
    assert_matches_ort(gm, m.SerializeToString())


def _with_relus(name: str) -> onnx.ModelProto:
    """The case between two ReLUs (x -> Relu -> case -> Relu -> y): CROWN must relax."""
    nodes, inits, shape, *rest = CASES[name]
    renamed = []
    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = ["x_relu" if i == "x" else i for i in copy.input]
        copy.output[:] = ["y_lin" if o == "y" else o for o in copy.output]
        renamed.append(copy)
    wrapped = [
        n("Relu x -> x_relu", name="relu_in"),
        *renamed,
        n("Relu y_lin -> y", name="relu_out"),
    ]
    return model(wrapped, inits, shape, *rest)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_bounds_contain_samples(name: str, tmp_path: Path) -> None:
    m = _with_relus(name)
    gm = save_load(tmp_path, m).double()
    graph = build_graph(gm, gm.input_shape)
    x = torch.from_numpy(random_inputs(gm.input_shape, 3)[:2]).double()
    expected = torch.from_numpy(ort_outputs(m.SerializeToString(), x.float().numpy()))
    assert torch.allclose(graph.forward(x).reshape(2, -1).float(), expected, atol=1e-5, rtol=1e-5)
    lower, upper = x - 0.3, x + 0.3
    points = box_samples(lower, upper, 500, seed=1)
    n_out = int(np.prod(gm.output_shape))
    C = torch.eye(n_out, dtype=torch.float64).expand(2, n_out, n_out)
    values = spec_values(gm, points, C)
    # A net without float weights (only shape ops) gets a float32 graph (bounds.graph takes
    # the module's dtype from its float parameters): compare at that precision then.
    float64 = any(t.dtype == torch.float64 for node in graph.nodes[1:] for t in node.op.constants())
    for method in ("ibp", "crown"):
        result = bounds(graph, lower=lower, upper=upper, C=C, method=method)
        assert_contains(result.lower.double(), result.upper.double(), values,
                        tol=1e-9 if float64 else 1e-5)  # fmt: skip


NONLINEAR_OPS = ("Relu", "ReduceMax", "ReduceMin")
AFFINE_CASES = sorted(
    k for k, v in CASES.items() if all(node.op_type not in NONLINEAR_OPS for node in v[0])
)


@pytest.mark.parametrize("name", AFFINE_CASES)
def test_case_crown_is_exact_without_relus(name: str, tmp_path: Path) -> None:
    """These cases are affine: CROWN's bounds are the exact extremes `f(c) -+ |J| r` (J the
    Jacobian by autograd), so each op's vjp and bias term are checked end to end."""
    gm = save_load(tmp_path, _case(name)).double()
    graph = build_graph(gm, gm.input_shape)
    center = torch.from_numpy(random_inputs(gm.input_shape, 5)[:1]).double()
    radius = 0.25
    J = torch.autograd.functional.jacobian(lambda v: gm(v).reshape(-1), center).reshape(
        -1, center.numel()
    )
    f = gm(center).reshape(-1)
    result = bounds(graph, lower=center - radius, upper=center + radius, method="crown")
    spread = J.abs().sum(1) * radius
    tol = 1e-4 * (1 + f.abs().max())
    torch.testing.assert_close(result.lower.reshape(-1).double(), f - spread, atol=tol, rtol=0)
    torch.testing.assert_close(result.upper.reshape(-1).double(), f + spread, atol=tol, rtol=0)


def test_several_outputs_concatenate_in_declared_order(tmp_path: Path) -> None:
    nodes = [
        n("Gemm x,W -> y1", transB=1),
        n("Reshape x,s -> y2"),
        helper.make_node("Constant", [], ["y3"], name="k", value=f32("v", 7.0, -2.0)),
    ]
    m = model(nodes, [tensor("W", (3, 4)), i64("s", 1, 2, 2)], [1, 4], outputs=("y2", "y3", "y1"))
    gm = save_load(tmp_path, m)
    assert gm.output_shape == (4 + 2 + 3,)
    assert_matches_ort(gm, m.SerializeToString())
    y = gm(torch.zeros(1, 4))
    assert torch.equal(y[0, 4:6], torch.tensor([7.0, -2.0]))


def test_input_shapes_without_a_batch_axis(tmp_path: Path) -> None:
    shapes = {"input_rank1_size1": (1,), "input_rank1_left_matmul": (5,),
              "input_leading_dim": (12, 8), "symbolic_batch_rank1": (1,)}  # fmt: skip
    for name, shape in shapes.items():
        assert save_load(tmp_path, _case(name), f"{name}.onnx").input_shape == shape


# ----------------------------------------------------------------------------- unsupported

Case = tuple  # (nodes, inits, input shape, error type, fragments)
BAD: dict[str, Case] = {
    "pad_reflect": ([n("Pad x,p -> y", name="pad1", mode="reflect")], [i64("p", 0, 1, 0, 1)], [1, 3], UnsupportedOperationError, ["'Pad'", "'pad1'", "reflect"]),
    "resize_cubic": ([helper.make_node("Resize", ["x", "", "sc"], ["y"], name="rz", mode="cubic")], [f32("sc", 1, 1, 2, 2)], [1, 1, 2, 2], UnsupportedOperationError, ["'Resize'", "'rz'", "cubic"]),
    "resize_linear_channel_axis": ([helper.make_node("Resize", ["x", "", "sc"], ["y"], name="rz2", mode="linear")], [f32("sc", 1, 2, 1, 1)], [1, 2, 2, 2], UnsupportedOperationError, ["'rz2'", "axis 1"]),
    "cast_to_float16": ([n("Cast x -> y", name="c16", to=TensorProto.FLOAT16)], [], [1, 3], UnsupportedOperationError, ["'Cast'", "'c16'", "FLOAT16"]),
    "slice_empty": ([n("Slice x,a,b -> y", name="sl")], [i64("a", 2), i64("b", 2)], [3], UnsupportedOperationError, ["'Slice'", "'sl'", "no elements"]),
    "split_not_covering": ([helper.make_node("Split", ["x", "s"], ["a", "b"], name="spl", axis=1), n("Add a,b -> y")], [i64("s", 1, 1)], [1, 3], InvalidNetworkError, ["'spl' (Split)", "does not cover"]),
    "gather_index_out_of_range": ([n("Gather x,i -> y", name="g", axis=1)], [i64("i", 0, 3)], [1, 3], InvalidNetworkError, ["'g' (Gather)", "outside"]),
    "concat_mismatch": ([n("Concat x,c -> y", name="cat", axis=1)], [tensor("c", (1, 2, 2))], [1, 3, 3], ShapeMismatchError, ["'cat' (Concat)", "differ"]),
    "expand_mismatch": ([n("Expand x,s -> y", name="ex")], [i64("s", 1, 4)], [1, 3], ShapeMismatchError, ["'ex' (Expand)", "do not broadcast"]),
    "conv_transpose_big_output_padding": ([n("ConvTranspose x,W -> y", name="ct", output_padding=[2, 0], strides=[2, 1])], [tensor("W", (1, 1, 2, 2))], [1, 1, 3, 3], UnsupportedOperationError, ["'ct'", "output_padding"]),
    "rank0_result": ([n("ReduceSum x -> y", name="rs", keepdims=0)], [], [3], UnsupportedOperationError, ["'ReduceSum'", "'rs'", "rank-0"]),
    "where_condition_from_input": ([n("Equal x,x -> c", name="eq"), n("Where c,x,x -> y", name="wh")], [], [1, 3], UnsupportedOperationError, ["'Equal'", "'eq'"]),
    "conv_needs_batch_axis": ([n("Conv x,W -> y", name="cv")], [tensor("W", (1, 2, 1, 1))], [2, 2, 3, 3], UnsupportedOperationError, ["'Conv'", "'cv'", "batch of 1"]),
    "scalar_input": ([n("Relu x -> y", name="r")], [], [], None, ["scalar"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD))
def test_unsupported_forms_name_the_node(name: str, tmp_path: Path) -> None:
    nodes, inits, shape, error, fragments = BAD[name]
    m = model(nodes, inits, shape)
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    from verify.errors import SpecificationError

    with raises_where(error or SpecificationError, *fragments):
        load_onnx(path)


# ----------------------------------------------------------------------------- VNN-COMP 2023

NETS_2023 = sorted((DATA / "vnncomp2023").rglob("*.onnx*")) if DATA.is_dir() else []
# Refusals that belong to other parts of issue 12 (nonlinearities, products of activations).
NONLINEAR = {
    "Sigmoid",
    "Tanh",
    "Sign",
    "MaxPool",
    "Softmax",
    "Pow",
    "Sin",
    "Cos",
    "Mul",
    "MatMul",
    "Div",
}
SHOULD_LOAD = {
    "cGAN_imgSz32_nCh_1.onnx.gz", "cGAN_imgSz32_nCh_3.onnx.gz", "cGAN_imgSz64_nCh_1.onnx.gz",
    "cGAN_imgSz64_nCh_3.onnx.gz", "cGAN_imgSz32_nCh_1_transposedConvPadding_1.onnx.gz",
    "mnist_prior.onnx.gz", "lindex.onnx.gz", "lindex_deep.onnx.gz", "TinyYOLO.onnx.gz",
    "pensieve_small_simple.onnx.gz", "pensieve_mid_simple.onnx.gz", "pensieve_big_simple.onnx.gz",
    "test_nano.onnx", "test_tiny.onnx", "test_small.onnx", "test_sat.onnx", "test_unsat.onnx",
}  # fmt: skip


@pytest.mark.data
@pytest.mark.parametrize(
    "path",
    NETS_2023 or [pytest.param(None, marks=pytest.mark.skip(reason=f"no networks under {DATA}"))],
    ids=lambda p: p.name if isinstance(p, Path) else "none",
)
def test_vnncomp2023_network_loads_or_names_a_nonlinearity(path: Path) -> None:
    try:
        gm = load_onnx(path)
    except UnsupportedOperationError as err:
        assert path.name not in SHOULD_LOAD, str(err)
        assert err.operation in NONLINEAR and err.node in str(err)
        return
    data = path.read_bytes()
    assert_matches_ort(gm, gzip.decompress(data) if path.name.endswith(".gz") else data, seed=1)


@pytest.mark.data
@pytest.mark.parametrize("name", ["test_nano", "test_tiny", "test_small"])
def test_vnncomp2023_rank1_nets_are_bounded_soundly(name: str) -> None:
    path = DATA / "vnncomp2023" / "test" / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    gm = load_onnx(path)
    assert gm.input_shape == (1,) and gm.output_shape == (1,)
    lower, upper = -torch.ones(1, 1), torch.ones(1, 1)  # the VNN-LIB box of all three
    result = bounds(gm, lower=lower, upper=upper, method="crown")
    values = spec_values(gm, box_samples(lower, upper, 2000), torch.ones(1, 1, 1))
    assert_contains(result.lower, result.upper, values, tol=1e-5)
