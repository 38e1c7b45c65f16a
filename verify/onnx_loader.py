"""Load an ONNX network (`.onnx` or gzip-compressed `.onnx.gz`) as a `torch.fx.GraphModule`.

Only the `onnx` package is used (no onnx2torch, no onnxruntime). The graph is translated node by
node into a small, fixed vocabulary (see `verify.onnx_ops`) that the bound-propagation graph
builder consumes; sub-graphs that depend only on constants are folded in numpy at load time
(`verify.onnx_fold`). The returned module is batch-first: it accepts any batch size even though
VNN-COMP files fix the batch to 1. Example::

    net = load_onnx("acasxu/onnx/ACASXU_run2a_1_1_batch_2000.onnx.gz")
    net.input_shape, net.output_shape   # (1, 1, 5), (5,)  -- without the batch dimension
    y = net(torch.zeros(8, *net.input_shape))   # (8, 5)
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np
from torch import fx

try:
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import external_data_helper, numpy_helper
except ImportError as _err:  # pragma: no cover - onnx is a declared dependency
    raise ImportError("verify.onnx_loader needs the 'onnx' package: pip install onnx") from _err

from bounds.errors import InvalidNetworkError
from verify.errors import SpecificationError
from verify.onnx_fold import FOLDERS, fold
from verify.onnx_ops import HANDLERS, GraphBuilder, Traced, node_label, unsupported

_GZIP_MAGIC = b"\x1f\x8b"
_FLOAT_INPUTS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def load_onnx(path: str | os.PathLike[str]) -> fx.GraphModule:
    """Read an ONNX file and return an equivalent float32 `torch.fx.GraphModule` in eval mode.

    The module maps `(N, *input_shape)` to `(N, *output_shape)`. Attributes set on it:
    `input_shape` and `output_shape` (tuples without the batch dimension) and `source_path`.

    Raises `SpecificationError` for unreadable or malformed files, `InvalidNetworkError` for
    NaN/Inf weights and `UnsupportedOperationError` for operations outside the supported set.
    """
    path_str = str(path)
    model = _read_model(path_str)
    module = _convert(model, path_str)
    module.source_path = path_str
    return module


def _read_model(path: str) -> onnx.ModelProto:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise SpecificationError(f"cannot read the ONNX file: {err}", path=path) from err
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise SpecificationError(f"corrupt gzip stream: {err}", path=path) from err
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise SpecificationError(f"not an ONNX protobuf: {err}", path=path) from err
    _load_external_data(model, path)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as err:
        raise SpecificationError(f"invalid ONNX model: {err}", path=path) from err
    return model


def _load_external_data(model: onnx.ModelProto, path: str) -> None:
    tensors = [t for t in model.graph.initializer if external_data_helper.uses_external_data(t)]
    if not tensors:
        return
    try:
        external_data_helper.load_external_data_for_model(model, str(Path(path).parent))
    except (OSError, ValueError) as err:
        raise SpecificationError(f"cannot load external tensor data: {err}", path=path) from err


def _initializers(graph: onnx.GraphProto, path: str) -> dict[str, np.ndarray]:
    if len(graph.sparse_initializer):
        raise SpecificationError("sparse initializers are not supported", path=path)
    out = {}
    for tensor in graph.initializer:
        try:
            array = numpy_helper.to_array(tensor)
        except (ValueError, TypeError, OSError) as err:
            raise SpecificationError(
                f"unreadable initializer {tensor.name!r}: {err}", path
            ) from err
        _check_finite(array, f"initializer {tensor.name!r}", path)
        out[tensor.name] = array
    return out


def _check_finite(array: np.ndarray, what: str, path: str) -> None:
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise InvalidNetworkError(f"{path}: {what} contains NaN or Inf values")


def _network_input(graph: onnx.GraphProto, constants: dict, path: str) -> tuple[str, tuple]:
    """The one graph input that is not an initializer (old files list initializers as inputs),
    and its shape including the batch dimension (fixed to 1)."""
    inputs = [i for i in graph.input if i.name not in constants]
    if len(inputs) != 1:
        names = [i.name for i in inputs]
        raise SpecificationError(f"expected one network input, found {len(inputs)}: {names}", path)
    tensor_type = inputs[0].type.tensor_type
    if tensor_type.elem_type not in _FLOAT_INPUTS:
        raise SpecificationError(f"input {inputs[0].name!r} is not a float tensor", path=path)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if len(dims) < 2:
        raise SpecificationError(f"input {inputs[0].name!r} has no batch dimension", path=path)
    if dims[0] not in (None, 0, 1) or any(d is None or d <= 0 for d in dims[1:]):
        raise SpecificationError(f"input shape {dims} (need batch 1 or symbolic)", path=path)
    return inputs[0].name, (1, *dims[1:])


def _use_counts(graph: onnx.GraphProto) -> dict[str, int]:
    uses: dict[str, int] = {}
    for name in [i for node in graph.node for i in node.input] + [o.name for o in graph.output]:
        uses[name] = uses.get(name, 0) + 1
    return uses


def _convert_node(b: GraphBuilder, node: onnx.NodeProto, path: str) -> None:
    if node.domain not in ("", "ai.onnx"):
        raise unsupported(node, f"custom domain {node.domain!r}")
    missing = [name for name in node.input if name and name not in b.env]
    if missing:
        raise SpecificationError(f"node {node_label(node)!r} reads undefined {missing}", path)
    inputs = [b.env[name] if name else None for name in node.input]
    foldable = all(not isinstance(v, Traced) for v in inputs)
    if node.op_type == "Shape":  # the static shape of an activation is known (batch 1)
        inputs = [_shape_stub(v) if isinstance(v, Traced) else v for v in inputs]
        foldable = True
    if foldable:
        result = _fold(node, inputs, path)
    elif node.op_type in HANDLERS:
        result = HANDLERS[node.op_type](b, node, inputs)
    else:
        raise unsupported(node, "no translation for this operation")
    b.env[node.output[0]] = result
    for extra in node.output[1:]:
        if extra and b.uses.get(extra, 0):
            raise unsupported(node, f"its extra output {extra!r} is used")


def _shape_stub(x: Traced) -> np.ndarray:
    """A zero-strided array with the activation's (batch-1) shape, to fold `Shape` of it."""
    return np.broadcast_to(np.float32(0), x.shape)


def _fold(node: onnx.NodeProto, inputs: list, path: str) -> np.ndarray:
    if node.op_type not in FOLDERS:
        raise unsupported(node, "cannot constant-fold this operation")
    try:
        result = fold(node, inputs)
    except (ValueError, IndexError, KeyError, TypeError) as err:
        raise InvalidNetworkError(f"{path}: folding {node_label(node)!r} failed: {err}") from err
    if node.op_type == "Constant":
        _check_finite(result, f"constant {node.output[0]!r}", path)
    return result


def _convert(model: onnx.ModelProto, path: str) -> fx.GraphModule:
    graph = model.graph
    constants = _initializers(graph, path)
    input_name, input_shape = _network_input(graph, constants, path)
    b = GraphBuilder(_use_counts(graph))
    b.env.update(constants)
    b.env[input_name] = b.placeholder(input_name, input_shape)
    for node in graph.node:
        _convert_node(b, node, path)
    if len(graph.output) != 1:
        raise SpecificationError(f"expected one graph output, found {len(graph.output)}", path)
    out = b.env.get(graph.output[0].name)
    if not isinstance(out, Traced):
        raise SpecificationError("the graph output does not depend on the input", path=path)
    b.graph.output(out.node)
    module = fx.GraphModule(b.root, b.graph, class_name="OnnxNetwork")
    module.graph.lint()
    module.eval().requires_grad_(False)
    module.input_shape = tuple(input_shape[1:])
    module.output_shape = tuple(out.shape[1:])
    return module
