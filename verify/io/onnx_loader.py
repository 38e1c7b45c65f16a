"""Load an ONNX network (`.onnx` or gzip-compressed `.onnx.gz`) as a `torch.fx.GraphModule`.

Only the `onnx` package is used (no onnx2torch, no onnxruntime). The graph is translated node by
node into a small, fixed vocabulary (see `verify.io.onnx_ops`) that the bound-propagation graph
builder consumes; sub-graphs that depend only on constants are folded in numpy at load time
(`verify.io.onnx_fold`). The returned module is batch-first: it accepts any batch size even though
VNN-COMP files fix the batch to 1 or declare none. An input declared `[1, *S]` (or with a
symbolic first dimension) has per-sample shape `S`; any other input shape (`[1]`, `[5]`,
`[12, 8]`) is one sample as a whole. Several graph outputs are flattened and concatenated in
their declared order (VNN-LIB's `Y_j` index them so). Example::

    net = load_onnx("acasxu/onnx/ACASXU_run2a_1_1_batch_2000.onnx.gz")
    net.input_shape, net.output_shape   # (1, 1, 5), (5,)  -- without the batch dimension
    y = net(torch.zeros(8, *net.input_shape))   # (8, 5)

Floating-point types. The module is float32. Weights stored as float16 or bfloat16 are widened to
float32, which is exact: the module computes the very function the file defines, in float32
arithmetic, and bounds computed on it are bounds of that real-valued network (like for float32
files, they do not model the rounding of a half-precision runtime). float64 weights are accepted
only when every value is exactly a float32 (then nothing changes); otherwise the loader refuses
(`UnsupportedOperationError` naming the node and the weight) rather than verify a rounded copy.

Bad input raises a typed error before any verification work: `SpecificationError` (with the path)
for unreadable or malformed files, `InvalidNetworkError`, `ShapeMismatchError` or
`UnsupportedOperationError` naming the ONNX node (name and op type) for graph problems.
"""

from __future__ import annotations

import math
import operator
import os
import zlib
from collections import ChainMap
from pathlib import Path

import numpy as np
import torch
from torch import fx

try:
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import external_data_helper, numpy_helper
except ImportError as _err:  # pragma: no cover - onnx is a declared dependency
    raise ImportError("verify.io.onnx_loader needs the 'onnx' package: pip install onnx") from _err

from bounds.errors import (
    InvalidNetworkError,
    ShapeMismatchError,
    UnsupportedOperationError,
    VerificationInputError,
)
from verify.argmax_output import ArgOutput
from verify.errors import SpecificationError
from verify.io.onnx_builder import GraphBuilder, Traced
from verify.io.onnx_checks import MAX_ELEMENTS, nonfinite_where, unsupported
from verify.io.onnx_fold import FOLDERS, fold
from verify.io.onnx_graph import check_structure, describe
from verify.io.onnx_nonlinear import HANDLERS as NONLINEAR_HANDLERS
from verify.io.onnx_nonlinear import PRODUCTS, two_activations
from verify.io.onnx_ops import HANDLERS as AFFINE_HANDLERS
from verify.io.onnx_reduce import HANDLERS as REDUCE_HANDLERS
from verify.io.onnx_shapes import HANDLERS as SHAPE_HANDLERS

HANDLERS = ChainMap(
    NONLINEAR_HANDLERS, SHAPE_HANDLERS, REDUCE_HANDLERS, AFFINE_HANDLERS
)  # read live

# The largest (decompressed) model file read: protobuf messages cannot exceed 2 GiB.
MAX_MODEL_BYTES = 2**31 - 1
# Bound on all batch-1 activations of one network together (each one is <= MAX_ELEMENTS).
MAX_TOTAL_ELEMENTS = 2**28

_GZIP_MAGIC = b"\x1f\x8b"
_FLOAT_INPUTS = frozenset(
    (
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    )
)


def load_onnx(path: str | os.PathLike[str]) -> fx.GraphModule:
    """Read an ONNX file and return an equivalent float32 `torch.fx.GraphModule` in eval mode.

    A network ending in ArgMax / ArgMin over activations stops before it: the module computes
    its input (the logits), and `argmax_output` (`verify.argmax_output.ArgOutput`) says how
    properties on the indices are restated on them (`verify.verify` does so). Nothing is
    written.

    Args:
        path: the ONNX file (`.onnx`, or gzipped `.onnx.gz`).

    Returns:
        The module, mapping `(N, *input_shape)` to `(N, *output_shape)`, with the attributes
        `input_shape` and `output_shape` (tuples without the batch dimension) and
        `source_path`.

    Raises:
        SpecificationError: an unreadable or malformed file.
        InvalidNetworkError: NaN/Inf or non-float weights, malformed graphs (cycles, undefined
            inputs).
        ShapeMismatchError: weights that do not fit their inputs (the node named).
        UnsupportedOperationError: an operation outside the supported set (the node named).
    """
    path_str = str(path)
    model = _read_model(path_str)
    network_input = _check_graph(model, path_str)
    module = _convert(model, network_input, path_str)
    module.source_path = path_str
    return module


# ----------------------------------------------------------------------------- reading


def _read_bytes(path: str) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic."""
    file = Path(path)
    if not file.exists():
        raise SpecificationError("no such ONNX file", path=path)
    if file.is_dir():
        raise SpecificationError("is a directory, not an ONNX file", path=path)
    if not file.is_file():  # a device or a pipe could be endless
        raise SpecificationError("is not a regular file", path=path)
    try:
        if file.stat().st_size > MAX_MODEL_BYTES:
            raise SpecificationError("larger than the 2 GiB protobuf limit", path=path)
        data = file.read_bytes()
    except OSError as err:
        raise SpecificationError(f"cannot read the ONNX file: {err}", path=path) from err
    if not data:
        raise SpecificationError("the file is empty (0 bytes), not an ONNX model", path=path)
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(data, path)
        if not data:
            raise SpecificationError("the gzip stream holds no data", path=path)
    return data


def _gunzip(data: bytes, path: str) -> bytes:
    """Decompress every gzip member of `data`, refusing more than MAX_MODEL_BYTES."""
    out = bytearray()
    rest = data
    while rest:
        stream = zlib.decompressobj(wbits=31)
        try:
            out += stream.decompress(rest, MAX_MODEL_BYTES + 1 - len(out))
        except zlib.error as err:
            raise SpecificationError(f"corrupt gzip stream: {err}", path=path) from err
        if len(out) > MAX_MODEL_BYTES or stream.unconsumed_tail:
            raise SpecificationError("decompresses to more than the 2 GiB limit", path=path)
        if not stream.eof:
            raise SpecificationError("truncated gzip stream (it ends early)", path=path)
        rest = stream.unused_data
        if not rest.strip(b"\0"):  # trailing zero padding, as `gzip` accepts
            break
    return bytes(out)


def _read_model(path: str) -> onnx.ModelProto:
    data = _read_bytes(path)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise SpecificationError(f"not an ONNX protobuf: {err}", path=path) from err
    if not model.HasField("graph") or model.ir_version <= 0:
        what = "no graph" if not model.HasField("graph") else "no IR version"
        raise SpecificationError(f"not an ONNX model ({what}); another protobuf?", path=path)
    _load_external_data(model, path)
    return model


def _check_graph(model: onnx.ModelProto, path: str) -> list[tuple[str, tuple[int, ...], bool]]:
    """Structure, network inputs and the ONNX checker, before any tensor is built; returns each
    network input's name, its (batch-1) ONNX shape and whether axis 0 is the batch."""
    check_structure(model.graph, path)
    network_input = _network_inputs(model.graph, {t.name for t in model.graph.initializer}, path)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as err:
        raise SpecificationError(f"invalid ONNX model: {err}", path=path) from err
    return network_input


def _stored_tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """Initializers and the tensors held in node attributes (e.g. of `Constant`)."""
    tensors = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            tensors += [attr.t] if attr.HasField("t") else []
            tensors += list(attr.tensors)
    return tensors


def _load_external_data(model: onnx.ModelProto, path: str) -> None:
    """Read tensors saved beside the model (`save_as_external_data=True`), from its folder."""
    folder = Path(path).parent.resolve()
    for tensor in _stored_tensors(model.graph):
        if not external_data_helper.uses_external_data(tensor):
            continue
        what = f"external data of tensor {tensor.name!r}"
        try:
            location = external_data_helper.ExternalDataInfo(tensor).location
        except ValueError as err:
            raise SpecificationError(f"{what}: {err}", path=path) from err
        if not location or Path(location).is_absolute() or ".." in Path(location).parts:
            raise SpecificationError(f"{what}: location {location!r} is not inside {folder}", path)
        file = folder / location
        if not file.is_file():
            raise SpecificationError(f"{what}: missing file {location!r} (in {folder})", path)
        try:
            external_data_helper.load_external_data_for_tensor(tensor, str(folder))
        except (OSError, ValueError, onnx.checker.ValidationError) as err:
            raise SpecificationError(f"{what} in {location!r}: {err}", path=path) from err


# ----------------------------------------------------------------------------- constants, input


def _initializers(graph: onnx.GraphProto, path: str) -> dict[str, np.ndarray]:
    if len(graph.sparse_initializer):
        raise SpecificationError("sparse initializers are not supported", path=path)
    readers: dict[str, onnx.NodeProto] = {}
    for node in reversed(graph.node):
        readers.update(dict.fromkeys(node.input, node))
    out = {}
    for tensor in graph.initializer:
        try:
            array = numpy_helper.to_array(tensor)
        except (ValueError, TypeError, OSError) as err:
            raise SpecificationError(
                f"unreadable initializer {tensor.name!r}: {err}", path
            ) from err
        problem = nonfinite_where(array)
        if problem:
            reader = readers.get(tensor.name)
            user = f"read by {describe(reader)}" if reader else "read by no node"
            raise InvalidNetworkError(
                f"{path}: initializer {tensor.name!r} ({user}) contains {problem}"
            )
        out[tensor.name] = array
    return out


def _network_inputs(graph: onnx.GraphProto, constants: dict, path: str) -> list[tuple]:
    """The graph inputs that are not initializers (old files list initializers as inputs), each
    as `_network_input` describes it; several are concatenated flat, in order, by `_convert`."""
    inputs = [i for i in graph.input if i.name not in constants]
    if not inputs:
        raise SpecificationError("the graph declares no input (besides initializers)", path)
    found = [_network_input(i, path) for i in inputs]
    total = sum(math.prod(shape) for _, shape, _ in found)
    if total > MAX_ELEMENTS:
        raise SpecificationError(
            f"the {len(found)} inputs have {total} elements, more than the {MAX_ELEMENTS} "
            "accepted (MAX_ELEMENTS)",
            path,
        )
    return found


def _network_input(value: onnx.ValueInfoProto, path: str) -> tuple[str, tuple, bool]:
    """A graph input's name, its ONNX shape (a symbolic batch fixed to 1) and whether its axis 0
    is the batch: declared `[1 or symbolic, ...]` of rank >= 2. Other shapes are one sample as
    a whole."""
    name, value_type = value.name, value.type
    tensor_type = value_type.tensor_type
    if not value_type.HasField("tensor_type") or tensor_type.elem_type not in _FLOAT_INPUTS:
        kind = value_type.WhichOneof("value") or "untyped value"
        if value_type.HasField("tensor_type"):
            kind = f"{onnx.TensorProto.DataType.Name(tensor_type.elem_type)} tensor"
        raise SpecificationError(f"input {name!r} is not a float tensor ({kind})", path=path)
    if not tensor_type.HasField("shape"):
        raise SpecificationError(f"input {name!r} declares no shape", path=path)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if not dims:
        raise SpecificationError(f"input {name!r} is a scalar (shape []): not supported", path)
    batched = len(dims) >= 2 and dims[0] in (None, 0, 1)
    if dims[0] is None and len(dims) == 1:  # a symbolic batch of scalars: one value
        dims = [1]
    for axis, d in enumerate(dims[1:] if batched else dims, start=int(batched)):
        if d is None or d <= 0:
            what = "symbolic" if d is None else f"{d}"
            raise SpecificationError(
                f"input {name!r} shape {dims}: dimension {axis} is {what}, needs a positive size",
                path,
            )
    size = math.prod(dims[1:] if batched else dims)
    if size > MAX_ELEMENTS:
        raise SpecificationError(
            f"input {name!r} shape {dims} has {size} elements, more than the {MAX_ELEMENTS} "
            "accepted (MAX_ELEMENTS)",
            path,
        )
    return name, ((1, *dims[1:]) if batched else tuple(dims)), batched


# ----------------------------------------------------------------------------- translation


def _use_counts(graph: onnx.GraphProto) -> dict[str, int]:
    uses: dict[str, int] = {}
    for name in [i for node in graph.node for i in node.input] + [o.name for o in graph.output]:
        uses[name] = uses.get(name, 0) + 1
    return uses


def _convert_node(b: GraphBuilder, node: onnx.NodeProto, path: str) -> None:
    if node.domain not in ("", "ai.onnx"):
        raise unsupported(node, f"custom domain {node.domain!r}")
    inputs = [b.env[name] if name else None for name in node.input]
    foldable = all(not isinstance(v, Traced) for v in inputs)
    if node.op_type == "Shape":  # the static shape of an activation is known (batch 1)
        inputs = [_shape_stub(v) if isinstance(v, Traced) else v for v in inputs]
        foldable = True
    if foldable:
        results = [_fold(node, inputs, path)]
    elif node.op_type in ("ArgMax", "ArgMin"):
        raise unsupported(
            node,
            "of activations is read only as the network's last operation "
            "(its property is then restated on the input: verify.argmax_output)",
        )
    elif node.op_type in HANDLERS:
        results = _translate(b, node, inputs, path)
    else:
        raise unsupported(node, "no translation for this operation")
    b.env[node.output[0]] = results[0]
    for k, extra in enumerate(node.output[1:], start=1):
        if k < len(results):
            b.env[extra] = results[k]
        elif extra and b.uses.get(extra, 0):
            raise unsupported(node, f"its extra output {extra!r} is used")


def _translate(b: GraphBuilder, node: onnx.NodeProto, inputs: list, path: str) -> list[Traced]:
    """The handler's results (one per output it computes); malformed nodes (bad attributes,
    impossible shapes) raise typed errors naming the node and the file, also when torch or
    numpy would fail first."""
    handler = HANDLERS[node.op_type]
    if node.op_type in PRODUCTS and two_activations(inputs):
        handler = PRODUCTS[node.op_type]
    try:
        result = handler(b, node, inputs)
    except UnsupportedOperationError:
        raise
    except (InvalidNetworkError, ShapeMismatchError) as err:
        raise type(err)(f"{path}: {err}") from err
    except VerificationInputError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, RuntimeError, ArithmeticError) as err:
        raise InvalidNetworkError(f"{path}: malformed {describe(node)}: {err}") from err
    results = result if isinstance(result, list) else [result]
    for r in results:
        if all(r is not v for v in inputs):
            b.elements += r.example.numel()
    if b.elements > MAX_TOTAL_ELEMENTS:
        raise InvalidNetworkError(
            f"{path}: at {describe(node)} the network's activations exceed "
            f"{MAX_TOTAL_ELEMENTS} elements (MAX_TOTAL_ELEMENTS)"
        )
    return results


def _shape_stub(x: Traced) -> np.ndarray:
    """A zero-strided array with the activation's (batch-1) shape, to fold `Shape` of it."""
    return np.broadcast_to(np.float32(0), x.shape)


def _fold(node: onnx.NodeProto, inputs: list, path: str) -> np.ndarray:
    if node.op_type not in FOLDERS:
        raise unsupported(node, "cannot constant-fold this operation")
    try:
        result = fold(node, inputs)
    except (ValueError, IndexError, KeyError, TypeError, ArithmeticError) as err:
        raise InvalidNetworkError(f"{path}: folding {describe(node)} failed: {err}") from err
    problem = nonfinite_where(result)
    if problem:
        raise InvalidNetworkError(
            f"{path}: {describe(node)} computes {node.output[0]!r} from constants, which "
            f"contains {problem}"
        )
    return result


def _convert(model: onnx.ModelProto, network_input: tuple, path: str) -> fx.GraphModule:
    graph = model.graph
    constants = _initializers(graph, path)
    b = GraphBuilder(_use_counts(graph))
    b.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)
    b.env.update(constants)
    if len(network_input) == 1:
        input_name, input_shape, batched = network_input[0]
        b.env[input_name] = b.placeholder(input_name, input_shape, batched)
    else:
        _split_inputs(b, network_input)
    last, arg = _terminal_arg(graph, b), None
    for node in graph.node:
        if node is last and isinstance(b.env.get(node.input[0]), Traced):
            arg = _arg_output(b.env[node.input[0]], node)
            b.env[node.output[0]] = b.env[node.input[0]]  # the logits: `rewrite` does the rest
            continue
        _convert_node(b, node, path)
    out = _output(b, [b.env[o.name] for o in graph.output], path)
    b.graph.output(out.node)
    module = fx.GraphModule(b.root, b.graph, class_name="OnnxNetwork")
    module.graph.lint()
    module.eval().requires_grad_(False)
    module.input_shape = tuple(b.input.example.shape[1:])
    module.output_shape = tuple(out.example.shape[1:])
    if arg is not None:
        module.argmax_output = arg
    return module


def _terminal_arg(graph: onnx.GraphProto, b: GraphBuilder) -> onnx.NodeProto | None:
    """The ArgMax / ArgMin computing the graph's only output, used by no other node."""
    if len(graph.output) != 1 or b.uses.get(graph.output[0].name, 0) != 1:
        return None
    for node in graph.node:
        if node.op_type in ("ArgMax", "ArgMin") and node.output[0] == graph.output[0].name:
            return node
    return None


def _arg_output(x: Traced, node: onnx.NodeProto) -> ArgOutput:
    """The final ArgMax / ArgMin `node` over the activation `x` (`verify.argmax_output`)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    rank = len(x.shape)
    axis = int(attrs.get("axis", 0))
    if not -rank <= axis < rank:
        raise InvalidNetworkError(f"{describe(node)}: axis {axis} outside rank {rank}")
    torch_axis = x.axis(axis % rank)
    if torch_axis == 0:
        raise unsupported(node, "over the batch axis")
    return ArgOutput(node.op_type, torch_axis - 1, tuple(x.example.shape[1:]),
                     bool(attrs.get("keepdims", 1)), bool(attrs.get("select_last_index", 0)),
                     describe(node))  # fmt: skip


def _split_inputs(b: GraphBuilder, inputs: list[tuple]) -> None:
    """Several inputs: one flat placeholder `[N, total]`, each input a slice of it reshaped to
    its declared shape (VNN-LIB's `X_i` index the inputs flattened, in declaration order)."""
    total = sum(math.prod(shape) for _, shape, _ in inputs)
    flat = b.placeholder("inputs", (total,), batched=False)
    start = 0
    for name, shape, _ in inputs:
        size = math.prod(shape)
        part = b.function(operator.getitem, flat, (slice(None), slice(start, start + size)),
                          batched=False)  # fmt: skip
        stub = onnx.helper.make_node("Identity", [name], [name], name=name)
        b.env[name] = b.reshape(part, shape, stub)
        start += size


def _output(b: GraphBuilder, values: list, path: str) -> Traced:
    """The one output, or several flattened and concatenated in their declared order (a
    constant output becomes a constant block)."""
    if not any(isinstance(v, Traced) for v in values):
        what = "the graph output does not" if len(values) == 1 else "no graph output"
        raise SpecificationError(f"{what} depend on the input", path=path)
    if len(values) == 1:
        return values[0]
    blocks = []
    for k, v in enumerate(values):
        if isinstance(v, Traced):
            blocks.append(b.function(torch.reshape, v, (-1, v.example[0].numel()), batched=False))
        else:
            flat = np.asarray(v, dtype=np.float32).reshape(-1)
            blocks.append(b.batch_constant(f"output_{k}", flat))
    return b.function(torch.cat, blocks, 1, batched=False)


__all__ = ["MAX_ELEMENTS", "MAX_MODEL_BYTES", "MAX_TOTAL_ELEMENTS", "load_onnx"]
