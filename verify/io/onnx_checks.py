"""Checks of ONNX nodes and their typed errors (used by `verify.io.onnx_loader`, `verify.io.onnx_fold`,
`verify.io.onnx_ops` and `verify.io.onnx_shapes`): errors that name a node by name and op type
(`unsupported`, `mismatch`, `invalid`), the lossless conversion of weights to float32
(`float_weight`), NaN/Inf detection, the element cap `MAX_ELEMENTS`, and the window geometry
of convolutions and pooling.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from bounds.errors import (
    InvalidNetworkError,
    ShapeMismatchError,
    UnsupportedOperationError,
    VerificationInputError,
)

# The most elements one tensor may have: the declared network input, each batch-1 activation
# and each folded constant (2**26 float32 values = 256 MiB). Larger ones are refused before
# they are allocated.
MAX_ELEMENTS = 2**26
# Weight types that widen exactly to float32 (float64 only when each value is a float32).
FLOAT_DTYPES = frozenset(
    np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t))
    for t in (
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
    )
)


def is_float(array: np.ndarray) -> bool:
    """Whether `array` holds one of FLOAT_DTYPES (bfloat16 is not a numpy 'floating' type)."""
    return array.dtype in FLOAT_DTYPES


def nonfinite_where(array: np.ndarray) -> str:
    """'' when `array` is not a float array or is finite; else 'nan at index (i, j) (k values
    are NaN or Inf)' for the first offending entry."""
    if not is_float(array):
        return ""
    values = array if array.dtype.kind == "f" else array.astype(np.float32)
    bad = ~np.isfinite(values)
    if not bad.any():
        return ""
    where = np.unravel_index(int(np.argmax(bad)), values.shape)
    index = tuple(int(i) for i in where)
    return f"{values[where]} at index {index} ({int(bad.sum())} of {values.size} not finite)"


def check_elements(shape: Any, what: str = "the result") -> None:
    """Raise ValueError when a tensor of `shape` would exceed MAX_ELEMENTS (or has a negative
    dimension), before it is allocated."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"{what} would have a negative dimension: {dims}")
    size = math.prod(dims)
    if size > MAX_ELEMENTS:
        raise ValueError(
            f"{what} would have {size} elements ({dims}), more than the {MAX_ELEMENTS} accepted "
            "(MAX_ELEMENTS)"
        )


# ----------------------------------------------------------------------------- node checks
# Typed errors naming the node, and the checks of weights and window geometry that the
# translation (`verify.io.onnx_ops`) applies before it builds a module.


def node_label(node: onnx.NodeProto) -> str:
    """The node's name, or its first output's name when the exporter left the name empty."""
    return node.name or (f"<output {node.output[0]}>" if node.output else "<unnamed>")


def unsupported(node: onnx.NodeProto, detail: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(node.op_type, node_label(node), detail)


def node_error(
    cls: type[VerificationInputError], node: onnx.NodeProto, detail: str
) -> VerificationInputError:
    """`cls` with the message "node NAME (OpType): detail"."""
    return cls(f"node {node_label(node)!r} ({node.op_type}): {detail}")


def mismatch(node: onnx.NodeProto, detail: str) -> ShapeMismatchError:
    """Weights or shapes that do not fit the node's inputs."""
    return node_error(ShapeMismatchError, node, detail)


def invalid(node: onnx.NodeProto, detail: str) -> InvalidNetworkError:
    """A malformed node: bad attribute values, NaN/Inf or non-float weights."""
    return node_error(InvalidNetworkError, node, detail)


def float_weight(node: onnx.NodeProto, name: str, array: np.ndarray) -> np.ndarray:
    """`array` (the constant `name` read by `node`) as float32, losslessly: float16/bfloat16
    widen exactly; float64 must hold float32 values; other types and NaN/Inf are refused."""
    if not is_float(array):
        raise invalid(node, f"weight {name!r} has dtype {array.dtype}; it needs a float type")
    problem = nonfinite_where(array)
    if problem:
        raise invalid(node, f"weight {name!r} contains {problem}")
    out = array.astype(np.float32)
    if array.dtype == np.float64 and not np.array_equal(out, array):
        where = np.unravel_index(int(np.argmax(out != array)), array.shape)
        index = tuple(int(i) for i in where)
        raise unsupported(
            node,
            f"float64 weight {name!r} is not exactly a float32 ({float(array[where])!r} at index "
            f"{index}); float64 networks load only when no weight would be rounded: convert "
            "the model to float32 first",
        )
    return out


def check_finite(node: onnx.NodeProto, what: str, array: np.ndarray) -> np.ndarray:
    """`array` unchanged; InvalidNetworkError when scaling made it overflow to Inf."""
    problem = nonfinite_where(array)
    if problem:
        raise invalid(node, f"{what} contains {problem}")
    return array


def check_size(node: onnx.NodeProto, shape: tuple[int, ...]) -> None:
    """Refuse an output of more than MAX_ELEMENTS before it is computed."""
    try:
        check_elements(shape, "its output")
    except ValueError as err:
        raise invalid(node, str(err)) from err


def strides_dilations(node: onnx.NodeProto, attrs: dict, n: int) -> tuple[list, list]:
    strides = list(attrs.get("strides", [1] * n))
    dilations = list(attrs.get("dilations", [1] * n))
    if len(strides) != n or len(dilations) != n or min(strides + dilations) < 1:
        raise invalid(node, f"strides {strides} and dilations {dilations} need {n} values >= 1")
    return strides, dilations


def spatial_output(
    node: onnx.NodeProto,
    shape: tuple[int, ...],
    kernel: list,
    strides: list,
    pads: list,
    dilations: list,
) -> list[int]:
    """Output sizes of a window op (floor mode); ShapeMismatchError when a window does not fit."""
    out = []
    for size, k, s, p, d in zip(shape[2:], kernel, strides, pads, dilations):
        span = size + 2 * p - d * (k - 1) - 1
        if span < 0:
            raise mismatch(
                node,
                f"the window {kernel} (dilations {dilations}) is larger than the input "
                f"{shape} padded by {pads}",
            )
        out.append(span // s + 1)
    return out


def symmetric_pads(
    node: onnx.NodeProto, attrs: dict, shape: tuple[int, ...], kernel: list[int]
) -> list[int]:
    """Per-axis padding of Conv/AveragePool; auto_pad SAME_* only when it is symmetric."""
    spatial = shape[2:]
    strides, dilations = strides_dilations(node, attrs, len(kernel))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise invalid(node, f"unknown auto_pad {auto_pad!r}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            pads.append(total // 2 if total % 2 == 0 else -1)
        if -1 in pads:
            raise unsupported(node, f"auto_pad={auto_pad} gives asymmetric padding")
        return pads
    if auto_pad == "VALID":
        return [0] * len(kernel)
    pads = attrs.get("pads", [0] * (2 * len(kernel)))
    n = len(kernel)
    if len(pads) != 2 * n or min(pads) < 0:
        raise invalid(node, f"pads {list(pads)} need {2 * n} values >= 0")
    if list(pads[:n]) != list(pads[n:]):
        raise unsupported(node, f"asymmetric pads {list(pads)} are not supported")
    return list(pads[:n])
