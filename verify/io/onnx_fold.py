"""Constant folding of ONNX nodes in numpy (used by `verify.io.onnx_loader`).

A node whose inputs are all known at load time (initializers, `Constant` nodes, or the static
shape of an activation fed to `Shape`) is evaluated here, so that e.g. the
`Shape -> Gather -> Unsqueeze -> Concat -> Reshape` pattern of `x.view(x.size(0), -1)` reaches the
graph builder as a plain constant shape. Semantics follow the ONNX operator specification
(https://onnx.ai/onnx/operators/); only the ops needed for shape and weight arithmetic are here.

Also here, shared with the translation (`verify.io.onnx_ops`, `verify.io.onnx_shapes`): attribute
reading, axis normalisation and ONNX Reshape's shape rule. Result sizes are checked against
`MAX_ELEMENTS` (`verify.io.onnx_checks`) before anything is allocated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from verify.io.onnx_checks import check_elements

Attrs = dict[str, Any]
Folder = Callable[[Attrs, list[Any]], np.ndarray]


def normalize_axes(axes: Any, rank: int) -> list[int]:
    """Sorted non-negative axes; ValueError for non-integers, repeats or axes outside
    [-rank, rank)."""
    values = np.asarray(axes)
    if values.dtype.kind not in "iu":
        raise ValueError(f"axes {values.tolist()} must be integers")
    out = []
    for a in values.ravel().tolist():
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ValueError(f"axes {values.tolist()} repeat an axis")
    return sorted(out)


def node_attributes(node: onnx.NodeProto) -> Attrs:
    """The attributes of `node` as python values (str for strings, numpy for tensors)."""
    out: Attrs = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        out[attr.name] = value
    return out


def _constant(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            value = np.asarray(attrs[key])
            if key in ("value_float", "value_floats"):
                return value.astype(np.float32)
            return value.astype(np.int64) if key.startswith("value_int") else value
    raise ValueError(f"Constant without a supported value attribute ({sorted(attrs)})")


def _axes(attrs: Attrs, xs: list[Any], rank: int) -> list[int] | None:
    """Axes given as an attribute (opset < 13) or as the second input, made non-negative."""
    axes = attrs.get("axes")
    if axes is None and len(xs) > 1 and xs[1] is not None:
        axes = xs[1]
    return None if axes is None else normalize_axes(axes, rank)


def _squeeze(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    axes = _axes(attrs, xs, xs[0].ndim)
    return np.squeeze(xs[0]) if axes is None else np.squeeze(xs[0], axis=tuple(axes))


def _unsqueeze(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    if "axes" not in attrs and (len(xs) < 2 or xs[1] is None):
        raise ValueError("Unsqueeze needs axes")
    n_axes = len(np.ravel(attrs["axes"] if "axes" in attrs else xs[1]))
    out = xs[0]
    for axis in _axes(attrs, xs, xs[0].ndim + n_axes) or []:
        out = np.expand_dims(out, axis)
    return out


def resolve_reshape(in_shape: tuple[int, ...], shape: Any, allowzero: int = 0) -> tuple[int, ...]:
    """The output shape of ONNX Reshape: 0 copies the input dimension (unless allowzero), one -1
    takes what is left. ValueError (saying why) when `shape` does not fit `in_shape`."""
    values = np.asarray(shape)
    if values.dtype.kind not in "iu" or values.ndim > 1:
        raise ValueError(f"the target shape {values.tolist()} must be a 1-D integer tensor")
    target = [int(d) for d in values.ravel()]
    if not allowzero:
        for i, d in enumerate(target):
            if d == 0 and i >= len(in_shape):
                raise ValueError(f"0 at position {i} of {target} copies no dimension of {in_shape}")
            target[i] = in_shape[i] if d == 0 else d
    if any(d < -1 for d in target) or target.count(-1) > 1:
        raise ValueError(f"the target shape {target} has a size < -1 or several -1")
    total, known = math.prod(in_shape), math.prod(d for d in target if d != -1)
    if -1 in target and known and total % known == 0:
        target[target.index(-1)] = total // known
    if -1 in target or math.prod(target) != total:
        raise ValueError(f"cannot reshape {in_shape} ({total} elements) to {values.tolist()}")
    return tuple(target)


def _reshape(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    shape = attrs["shape"] if "shape" in attrs else xs[1]
    return xs[0].reshape(resolve_reshape(xs[0].shape, shape, attrs.get("allowzero", 0)))


def flatten_axis(axis: int, rank: int) -> int:
    """Flatten's axis in [0, rank]; ValueError outside [-rank, rank]."""
    if not -rank <= axis <= rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _flatten(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    axis = flatten_axis(attrs.get("axis", 1), xs[0].ndim)
    return xs[0].reshape(int(np.prod(xs[0].shape[:axis])), -1)


def _shape(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    dims = np.asarray(xs[0].shape, dtype=np.int64)
    return dims[attrs.get("start", 0) : attrs.get("end", len(dims))]


def _slice(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    data = xs[0]
    if "starts" in attrs:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = xs[1], xs[2]
        axes = xs[3] if len(xs) > 3 else None
        steps = xs[4] if len(xs) > 4 else None
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis) % data.ndim] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _div(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    a, b = xs
    if np.issubdtype(a.dtype, np.integer):
        if not np.all(b != 0):
            raise ValueError("integer division by zero")
        return np.trunc(a / b).astype(a.dtype)
    return (a / b).astype(a.dtype)


def _constant_of_shape(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    value = np.asarray(attrs.get("value", np.zeros(1, dtype=np.float32)))
    return np.full(tuple(int(d) for d in xs[0]), value.ravel()[0], dtype=value.dtype)


def _same_type(fn: Callable[..., np.ndarray]) -> Folder:
    """An elementwise numpy function whose result keeps the first input's dtype."""
    return lambda attrs, xs: np.asarray(fn(*xs)).astype(xs[0].dtype)


def _cast(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])
    except KeyError as err:
        raise ValueError(f"Cast to unknown type {attrs.get('to')}") from err
    return xs[0].astype(dtype)


def _transpose(attrs: Attrs, xs: list[Any]) -> np.ndarray:
    return np.transpose(xs[0], attrs.get("perm"))


def _reduction(fn: Callable[..., np.ndarray]) -> Folder:
    """ReduceSum/Mean/Max/Min/Prod on a constant: axes as an attribute or the second input
    (opset 13/18); none: every axis, or the input itself with `noop_with_empty_axes`."""

    def folder(attrs: Attrs, xs: list[Any]) -> np.ndarray:
        x = np.asarray(xs[0])
        axes = _axes(attrs, xs, x.ndim)
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.ndim))
        out = fn(x, axis=tuple(axes), keepdims=bool(attrs.get("keepdims", 1)))
        return np.asarray(out).astype(x.dtype)

    return folder


def _arg(fn: Callable[..., np.ndarray]) -> Folder:
    """ArgMax/ArgMin on a constant (int64; `select_last_index` picks the last of ties)."""

    def folder(attrs: Attrs, xs: list[Any]) -> np.ndarray:
        x = np.asarray(xs[0])
        axis = normalize_axes(np.int64(attrs.get("axis", 0)), x.ndim)[0]
        if attrs.get("select_last_index", 0):
            out = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            out = fn(x, axis=axis)
        out = np.asarray(out, np.int64)
        return np.expand_dims(out, axis) if attrs.get("keepdims", 1) else out

    return folder


FOLDERS: dict[str, Folder] = {
    "Constant": _constant,
    "Identity": lambda attrs, xs: xs[0],
    "Dropout": lambda attrs, xs: xs[0],
    "Cast": _cast,
    "Shape": _shape,
    "Gather": lambda attrs, xs: np.take(xs[0], xs[1], axis=attrs.get("axis", 0)),
    "Concat": lambda attrs, xs: np.concatenate(xs, axis=attrs["axis"]),
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Slice": _slice,
    "ConstantOfShape": _constant_of_shape,
    "Expand": lambda attrs, xs: np.broadcast_to(
        xs[0], np.broadcast_shapes(xs[0].shape, tuple(int(d) for d in xs[1]))
    ).copy(),
    "Range": lambda attrs, xs: np.arange(xs[0], xs[1], xs[2]).astype(xs[0].dtype),
    "Add": _same_type(np.add),
    "Sub": _same_type(np.subtract),
    "Mul": _same_type(np.multiply),
    "Div": _div,
    "Neg": _same_type(np.negative),
    "Abs": _same_type(np.abs),
    "Sqrt": _same_type(np.sqrt),
    "Reciprocal": _same_type(np.reciprocal),
    "Relu": _same_type(lambda x: np.maximum(x, 0)),
    "MatMul": _same_type(np.matmul),
    "Min": _same_type(lambda *xs: np.minimum.reduce(np.broadcast_arrays(*xs))),
    "Max": _same_type(lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs))),
    "Equal": lambda attrs, xs: np.equal(xs[0], xs[1]),
    "Where": lambda attrs, xs: np.where(xs[0], xs[1], xs[2]),
    "ReduceSum": _reduction(np.sum),
    "ReduceMean": _reduction(np.mean),
    "ReduceMax": _reduction(np.max),
    "ReduceMin": _reduction(np.min),
    "ReduceProd": _reduction(np.prod),
    "ArgMax": _arg(np.argmax),
    "ArgMin": _arg(np.argmin),
}


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """np.matmul's result shape up to size-1 dimensions (1-D operands count as matrices)."""
    a, b = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    return (*np.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])


def _range_length(attrs: Attrs, xs: list[Any]) -> tuple[int]:
    start, limit, delta = (float(np.ravel(x)[0]) for x in xs[:3])
    if delta == 0:
        raise ValueError("Range with delta 0")
    return (max(math.ceil((limit - start) / delta), 0),)


def _gather_shape(attrs: Attrs, xs: list[Any]) -> tuple[int, ...]:
    data, indices = np.shape(xs[0]), np.shape(xs[1])
    axis = normalize_axes(np.int64(attrs.get("axis", 0)), len(data))[0]
    return (*data[:axis], *indices, *data[axis + 1 :])


def _broadcast(attrs: Attrs, xs: list[Any]) -> tuple[int, ...]:
    return np.broadcast_shapes(*(np.shape(x) for x in xs))


# Result shapes of the folders whose output can be much larger than their inputs, checked
# against MAX_ELEMENTS before anything is allocated.
_RESULT_SHAPES: dict[str, Callable[[Attrs, list[Any]], Any]] = {
    "ConstantOfShape": lambda attrs, xs: np.ravel(xs[0]).tolist(),
    "Expand": lambda attrs, xs: np.broadcast_shapes(
        np.shape(xs[0]), tuple(int(d) for d in np.ravel(xs[1]))
    ),
    "Range": _range_length,
    "MatMul": lambda attrs, xs: _matmul_shape(np.shape(xs[0]), np.shape(xs[1])),
    "Gather": _gather_shape,
    "Concat": lambda attrs, xs: (sum(np.size(x) for x in xs),),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Min", "Max", "Equal", "Where"), _broadcast),
}


def fold(node: onnx.NodeProto, inputs: list[Any]) -> np.ndarray:
    """Evaluate `node` (first output only) on constant numpy `inputs` (None for absent ones).

    Raises KeyError when the op cannot be folded and ValueError/IndexError on malformed nodes
    (also when the result would exceed MAX_ELEMENTS). NaN/Inf results are returned as they are
    (numpy's warnings silenced): the caller checks them.
    """
    folder = FOLDERS[node.op_type]
    attrs = node_attributes(node)
    if node.op_type in _RESULT_SHAPES:
        check_elements(_RESULT_SHAPES[node.op_type](attrs, inputs), f"{node.op_type}'s result")
    with np.errstate(all="ignore"):
        return np.asarray(folder(attrs, inputs))
