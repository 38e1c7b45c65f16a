"""ONNX shape and linear ops -> torch.fx (used by `verify.io.onnx_loader`, next to
`verify.io.onnx_ops`): Transpose, Slice, Split, Concat, Gather with constant indices, Expand,
constant Pad, Cast between float types (to integer types and Gather of a constant table by
a variable index: embedding lookups, `verify.io.onnx_embedding`), Where with a constant condition,
ConvTranspose and Resize/Upsample (nearest and linear). Semantics follow the ONNX operator
specification (https://onnx.ai/onnx/operators/); each handler is checked against onnxruntime
in tests/test_onnx_general.py.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from verify.io import onnx_embedding as embedding
from verify.io.onnx_builder import GraphBuilder, Traced, Value, as_param, broadcast_operands
from verify.io.onnx_checks import check_size, float_weight, invalid, mismatch, unsupported
from verify.io.onnx_fold import node_attributes, normalize_axes
from verify.io.onnx_ops import activation, constant, hint, weight

Node = onnx.NodeProto


def axis_of(node: Node, axis: Any, rank: int) -> int:
    try:
        return normalize_axes(np.int64(axis), rank)[0]
    except ValueError as err:
        raise invalid(node, str(err)) from err


def int_list(node: Node, inputs: list[Value], i: int, attr: str) -> list[int] | None:
    """An integer list from attribute `attr` (old opsets) or constant input `i`."""
    value = node_attributes(node).get(attr)
    if value is None:
        value = constant(node, inputs, i)
    if value is None:
        return None
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise invalid(node, f"{attr} {array.tolist()} must be integers")
    return [int(v) for v in array.ravel()]


def _not_empty(node: Node, shape: tuple[int, ...]) -> None:
    if 0 in shape:
        raise unsupported(node, f"its result {list(shape)} has no elements")


# ----------------------------------------------------------------------------- permutations


def _transpose(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """A permutation that only moves size-1 axes is a reshape; others are torch.permute (our
    batch axis stays first: an ONNX permutation that moves axis 0 is applied unbatched)."""
    x = activation(node, inputs)
    rank = len(x.shape)
    perm = [int(p) for p in node_attributes(node).get("perm", reversed(range(rank)))]
    if sorted(perm) != list(range(rank)):
        raise invalid(node, f"perm={perm} is not a permutation of the {rank} axes")
    out = tuple(x.shape[p] for p in perm)
    moved = [p for p in perm if x.shape[p] != 1]
    if moved == sorted(moved):
        return b.reshape(x, out, node)
    if not (x.batched and perm[0] == 0):
        x = b.unbatched(x)
    dims = tuple(x.axis(p) for p in perm)
    return b.function(torch.permute, x, (0, *dims) if not x.batched else dims, batched=x.batched)


# ----------------------------------------------------------------------------- selections


def slice_indices(start: int, end: int, step: int, dim: int) -> range:
    """ONNX Slice's clamping of `start`/`end` on an axis of size `dim` (negative = from the end)."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), dim), min(max(end, 0), dim), step)
    return range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step)


def _select(b: GraphBuilder, node: Node, x: Traced, ranges: dict[int, range]) -> Traced:
    """`x` restricted to `ranges[axis]` (ONNX axes): one getitem for the increasing ranges,
    one index_select per decreasing one."""
    if x.batched and any(a == 0 and list(r) != [0] for a, r in ranges.items()):
        x = b.unbatched(x)
    ranges = {a: r for a, r in ranges.items() if list(r) != list(range(x.shape[a]))}
    index: list[Any] = [slice(None)] * x.example.dim()
    for a, r in ranges.items():
        if r.step > 0:
            index[x.axis(a)] = slice(r.start, r.start + len(r) * r.step, r.step)
    if any(s != slice(None) for s in index):
        x = b.function(operator.getitem, x, tuple(index), batched=x.batched)
    for a, r in ranges.items():
        if r.step < 0:
            buf = b.buffer(f"{hint(node)}_index", np.array(list(r), np.int64), np.int64)
            x = b.function(torch.index_select, x, x.axis(a), buf, batched=x.batched)
    return x


def _slice(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    x = activation(node, inputs)
    starts, ends = int_list(node, inputs, 1, "starts"), int_list(node, inputs, 2, "ends")
    if starts is None or ends is None or len(starts) != len(ends):
        raise invalid(node, f"starts {starts} and ends {ends} must be given, of one length")
    axes = int_list(node, inputs, 3, "axes") or list(range(len(starts)))
    steps = int_list(node, inputs, 4, "steps") or [1] * len(starts)
    if len(axes) != len(starts) or len(steps) != len(starts) or 0 in steps:
        raise invalid(node, f"axes {axes} / steps {steps} do not fit starts {starts}")
    ranges: dict[int, range] = {}
    for start, end, axis, step in zip(starts, ends, axes, steps):
        a = axis_of(node, axis, len(x.shape))
        if a in ranges:
            raise invalid(node, f"axis {axis} is sliced twice")
        ranges[a] = slice_indices(start, end, step, x.shape[a])
    _not_empty(node, tuple(len(ranges.get(a, range(d))) for a, d in enumerate(x.shape)))
    return _select(b, node, x, ranges)


def _split(b: GraphBuilder, node: Node, inputs: list[Value]) -> list[Traced]:
    x = activation(node, inputs)
    attrs = node_attributes(node)
    a = axis_of(node, attrs.get("axis", 0), len(x.shape))
    sizes = int_list(node, inputs, 1, "split")
    n, dim = len(node.output), x.shape[a]
    if sizes is None:
        parts = attrs.get("num_outputs", n)
        chunk = -(-dim // parts)
        sizes = [min(chunk, dim - k * chunk) for k in range(parts)]
    if len(sizes) != n or sum(sizes) != dim or min(sizes) <= 0:
        raise invalid(node, f"split {sizes} into {n} outputs does not cover axis {a} ({dim})")
    out, start = [], 0
    for size in sizes:
        out.append(_select(b, node, x, {a: range(start, start + size)}))
        start += size
    return out


def _gather(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """Gather with constant indices on an activation: index_select, then the output shape; of
    a constant table by an activation: an embedding lookup (`verify.io.onnx_embedding`)."""
    if embedding.is_lookup(inputs):
        return embedding.lookup(b, node, inputs)
    x = activation(node, inputs)
    idx = constant(node, inputs, 1)
    if idx is None or idx.dtype.kind not in "iu":
        raise unsupported(node, "needs constant integer indices")
    a = axis_of(node, node_attributes(node).get("axis", 0), len(x.shape))
    dim = x.shape[a]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise invalid(node, f"indices {idx.tolist()} outside [-{dim}, {dim}) on axis {a}")
    flat = np.where(idx < 0, idx + dim, idx).astype(np.int64).ravel()
    out_shape = (*x.shape[:a], *idx.shape, *x.shape[a + 1 :])
    check_size(node, out_shape)
    _not_empty(node, out_shape)
    if x.batched and a == 0:
        x = b.unbatched(x)
    if not np.array_equal(flat, np.arange(dim)):
        buf = b.buffer(f"{hint(node)}_index", flat, np.int64)
        x = b.function(torch.index_select, x, x.axis(a), buf, batched=x.batched)
    return b.reshape(x, out_shape, node)


# ----------------------------------------------------------------------------- concatenation


def _concat(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """torch.cat of activations and constant blocks (repeated over our batch axis)."""
    values = [v for v in inputs if v is not None]
    rank = len(values[0].shape if isinstance(values[0], Traced) else np.shape(values[0]))
    if any(len(v.shape if isinstance(v, Traced) else np.shape(v)) != rank for v in values):
        raise mismatch(node, "its inputs have different ranks")
    a = axis_of(node, node_attributes(node).get("axis", 0), rank)
    acts = [v for v in values if isinstance(v, Traced)]
    batched = a != 0 and rank >= 2 and all(v.batched for v in acts)
    shapes = [v.shape if isinstance(v, Traced) else np.shape(v) for v in values]
    if len({tuple(s[:a]) + tuple(s[a + 1 :]) for s in shapes}) != 1:
        raise mismatch(node, f"input shapes {[list(s) for s in shapes]} differ off axis {a}")
    blocks = []
    for k, v in enumerate(values):
        if isinstance(v, Traced):
            blocks.append(v if v.batched == batched else b.unbatched(v))
        else:
            block = float_weight(node, node.input[k], v)
            blocks.append(b.batch_constant(f"{hint(node)}_block", block[0] if batched else block))
    out = (*shapes[0][:a], sum(s[a] for s in shapes), *shapes[0][a + 1 :])
    check_size(node, out)
    dim = a if batched else a + 1
    return b.function(torch.cat, blocks, dim, batched=batched)


# ----------------------------------------------------------------------------- broadcasts, pads


def _expand(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    x, shape = activation(node, inputs), int_list(node, inputs, 1, "shape")
    if shape is None:
        raise unsupported(node, "the target shape must be a constant")
    (x, _), batched, result = broadcast_operands(b, node, [x, np.broadcast_to(0, shape)])
    check_size(node, result)
    per_sample = result[1:] if batched else result
    if tuple(x.example.shape[1:]) == tuple(per_sample):
        return x
    return b.expand(x, tuple(per_sample))


def _pad(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    x, attrs = activation(node, inputs), node_attributes(node)
    mode = attrs.get("mode", "constant")
    if mode != "constant":
        raise unsupported(node, f"mode={mode!r} (only constant padding is supported)")
    pads = int_list(node, inputs, 1, "pads")
    rank = len(x.shape)
    axes = int_list(node, inputs, 3, "axes")
    axes = list(range(rank)) if axes is None else [axis_of(node, a, rank) for a in axes]
    if pads is None or len(pads) != 2 * len(axes):
        raise invalid(node, f"pads {pads} need 2 values per padded axis ({len(axes)} axes)")
    value = attrs.get("value", 0.0)
    given = constant(node, inputs, 2)
    if given is not None:
        value = float(np.ravel(float_weight(node, node.input[2], given))[0]) if given.size else 0.0
    widths = dict.fromkeys(range(rank), (0, 0))
    for k, a in enumerate(axes):
        widths[a] = (pads[k], pads[k + len(axes)])
    out = tuple(d + sum(widths[a]) for a, d in enumerate(x.shape))
    if min(out) <= 0:
        raise mismatch(node, f"pads {pads} leave no element of {list(x.shape)}")
    check_size(node, out)
    if x.batched and widths[0] != (0, 0):
        x = b.unbatched(x)
    if all(w == (0, 0) for w in widths.values()):
        return x
    torch_pads = [w for a in reversed(range(rank)) if x.axis(a) > 0 for w in widths[a]]
    return b.function(F.pad, x, torch_pads, "constant", float(value), batched=x.batched)


def _cast(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """Casts to float32/float64 are exact on our float32 values; half precision rounds."""
    x, to = activation(node, inputs), node_attributes(node).get("to")
    if to in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        return x if x.example.is_floating_point() else embedding.float_cast(b, node, x)
    if to in embedding.INTEGER_TYPES:  # embedding ids
        return embedding.integer_cast(b, node, x)
    name = onnx.TensorProto.DataType.Name(to) if to in onnx.TensorProto.DataType.values() else to
    raise unsupported(node, f"cast of an activation to {name} (only FLOAT and DOUBLE are exact)")


def _where(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    cond = constant(node, inputs, 0)
    if cond is None:
        raise unsupported(node, "the condition must be a constant")
    branches = [v if isinstance(v, Traced) else float_weight(node, node.input[k + 1], v)
                for k, v in enumerate(inputs[1:3])]  # fmt: skip
    (cond, *values), batched, result = broadcast_operands(b, node, [cond.astype(bool), *branches])
    check_size(node, result)
    args = [v if isinstance(v, Traced) else b.buffer(f"{hint(node)}_const", v) for v in values]
    mask = b.buffer(f"{hint(node)}_mask", cond, bool)
    return b.function(torch.where, mask, *args, batched=batched)


# ----------------------------------------------------------------------------- ConvTranspose


def _conv_transpose_pads(node: Node, attrs: dict, x: Traced, kernel, strides, dilations, out_pad):
    """Per-axis (begin, end) pads, from `pads`, `output_shape` or `auto_pad` (ONNX spec)."""
    n = len(kernel)
    auto_pad, output_shape = attrs.get("auto_pad", "NOTSET"), attrs.get("output_shape")
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [d * s for d, s in zip(x.shape[2:], strides)]
    if output_shape is not None:
        output_shape = list(output_shape)[-n:]
        pads = []
        for i in range(n):
            total = (strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i]
                     + 1 - output_shape[i])  # fmt: skip
            if total < 0:
                raise unsupported(node, f"output_shape {output_shape} needs negative padding")
            half = total // 2
            pads.append((half, total - half) if auto_pad == "SAME_UPPER" else (total - half, half))
        return pads
    if auto_pad not in ("NOTSET", "VALID"):
        raise invalid(node, f"unknown auto_pad {auto_pad!r}")
    flat = list(attrs.get("pads", [0] * (2 * n))) if auto_pad == "NOTSET" else [0] * (2 * n)
    if len(flat) != 2 * n or min(flat) < 0:
        raise invalid(node, f"pads {flat} need {2 * n} values >= 0")
    return [(flat[i], flat[i + n]) for i in range(n)]


def _conv_transpose(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """nn.ConvTranspose2d with the symmetric part of the padding, then F.pad with negative
    widths for the rest (asymmetric pads)."""
    attrs = node_attributes(node)
    x, W, B = activation(node, inputs), weight(node, inputs, 1), weight(node, inputs, 2)
    if W is None or W.ndim != 4 or len(x.shape) != 4:
        raise unsupported(node, "only 2-D transposed convolutions (4-D input and weight)")
    x = b.batched(x, node)
    group = attrs.get("group", 1)
    if group < 1 or W.shape[0] % group or x.shape[1] != W.shape[0]:
        raise mismatch(node, f"input {list(x.shape)} does not fit kernel {list(W.shape)} "
                       f"(group={group})")  # fmt: skip
    kernel = list(attrs.get("kernel_shape", W.shape[2:]))
    if kernel != list(W.shape[2:]):
        raise mismatch(node, f"kernel_shape {kernel} but kernel {node.input[1]!r} is {W.shape}")
    strides, dilations = list(attrs.get("strides", [1, 1])), list(attrs.get("dilations", [1, 1]))
    out_pad = list(attrs.get("output_padding", [0, 0]))
    if (
        len(strides) != 2
        or len(dilations) != 2
        or len(out_pad) != 2
        or min(strides + dilations) < 1
    ):
        raise invalid(node, f"strides {strides}, dilations {dilations}, output_padding {out_pad}")
    if any(p < 0 or p >= max(s, d) for p, s, d in zip(out_pad, strides, dilations)):
        raise unsupported(node, f"output_padding {out_pad} >= stride and dilation")
    channels = W.shape[1] * group
    if B is not None and B.shape != (channels,):
        raise mismatch(node, f"bias {node.input[2]!r} of shape {B.shape} needs ({channels},)")
    pads = _conv_transpose_pads(node, attrs, x, kernel, strides, dilations, out_pad)
    sym = [min(p) for p in pads]
    out = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
           - sum(pads[i]) for i in range(2)]  # fmt: skip
    if min(out) <= 0:
        raise mismatch(node, f"pads {pads} leave an empty output")
    check_size(node, (1, channels, *[o + sum(p) - 2 * s for o, p, s in zip(out, pads, sym)]))
    conv = nn.ConvTranspose2d(W.shape[0], channels, tuple(kernel), stride=tuple(strides),
                              padding=tuple(sym), output_padding=tuple(out_pad), groups=group,
                              bias=B is not None, dilation=tuple(dilations))  # fmt: skip
    conv.weight = as_param(W)
    if B is not None:
        conv.bias = as_param(B)
    y = b.module(hint(node), conv, x)
    crop = [(s - p[0], s - p[1]) for p, s in zip(pads, sym)]  # <= 0: remove these
    if any(c for pair in crop for c in pair):
        y = b.function(F.pad, y, [crop[1][0], crop[1][1], crop[0][0], crop[0][1]], batched=True)
    return y


# ----------------------------------------------------------------------------- Resize


def _source_coordinates(n: int, m: int, scale: float, transform: str) -> np.ndarray:
    """ONNX Resize's `x_original` of each of the `m` outputs on an axis of `n` inputs."""
    j = np.arange(m, dtype=np.float64)
    if transform == "half_pixel":
        return (j + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (j + 0.5) / scale - 0.5 if m > 1 else np.zeros(m)
    if transform == "align_corners":
        return j * (n - 1) / (m - 1) if m > 1 else np.zeros(m)
    if transform == "asymmetric":
        return j / scale
    if transform == "tf_half_pixel_for_nn":
        return (j + 0.5) / scale
    if transform == "half_pixel_symmetric":
        offset = n / 2 * (1 - m / (n * scale))
        return offset + (j + 0.5) / scale - 0.5
    raise ValueError(f"coordinate_transformation_mode={transform!r}")


_ROUNDING = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def axis_map(
    n: int, m: int, scale: float, transform: str, linear: bool, nearest_mode: str
) -> np.ndarray | None:
    """`[m, n]`: the weights of each output on the inputs of one axis (one-hot for nearest,
    two taps for linear, sources clamped to the axis as onnxruntime does); None for the
    identity. ValueError for modes we do not implement."""
    x = _source_coordinates(n, m, float(np.float32(scale)), transform)
    M = np.zeros((m, n))
    rows = np.arange(m)
    if not linear:
        if nearest_mode not in _ROUNDING:
            raise ValueError(f"nearest_mode={nearest_mode!r}")
        M[rows, np.clip(_ROUNDING[nearest_mode](x), 0, n - 1).astype(np.int64)] = 1.0
    else:
        x = np.clip(x, 0, n - 1)
        i0 = np.floor(x).astype(np.int64)
        i1 = np.minimum(i0 + 1, n - 1)
        np.add.at(M, (rows, i0), 1 - (x - i0))
        np.add.at(M, (rows, i1), x - i0)
    return None if m == n and np.array_equal(M, np.eye(n)) else M


def _resize(b: GraphBuilder, node: Node, inputs: list[Value]) -> Traced:
    """Nearest: index_select per resized axis; linear: a product by a constant matrix on each
    of the last two axes (see `verify.onnx_resize.axis_map`)."""
    x, attrs = activation(node, inputs), node_attributes(node)
    rank = len(x.shape)
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise unsupported(node, f"mode={mode!r} (nearest and linear are supported)")
    if attrs.get("antialias", 0) or attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise unsupported(node, "antialias / keep_aspect_ratio_policy")
    legacy = node.op_type == "Upsample" or _opset(b) < 11
    scales = attrs.get("scales") if node.op_type == "Upsample" else None
    if scales is None:
        scales = constant(node, inputs, 1 if legacy else 2)
    sizes = None if legacy else constant(node, inputs, 3)
    axes = attrs.get("axes", list(range(rank)))
    full_scales, out = [1.0] * rank, list(x.shape)
    if sizes is not None and np.size(sizes):
        for a, m in zip(axes, np.ravel(sizes)):
            full_scales[a], out[a] = int(m) / x.shape[a], int(m)
    elif scales is not None and np.size(scales):
        for a, s in zip(axes, np.ravel(scales).astype(np.float64)):
            full_scales[a], out[a] = float(s), int(np.floor(x.shape[a] * np.float32(s)))
    else:
        raise invalid(node, "needs scales or sizes")
    check_size(node, tuple(out))
    _not_empty(node, tuple(out))
    transform = (
        "asymmetric" if legacy else attrs.get("coordinate_transformation_mode", "half_pixel")
    )
    nearest_mode = "floor" if legacy else attrs.get("nearest_mode", "round_prefer_floor")
    for a in range(rank):
        try:
            M = axis_map(x.shape[a], out[a], full_scales[a], transform, mode != "nearest",
                         nearest_mode)  # fmt: skip
        except ValueError as err:
            raise unsupported(node, str(err)) from err
        if M is None:
            continue
        if x.batched and a == 0:
            x = b.unbatched(x)
        x = _apply_axis_map(b, node, x, a, M, mode != "nearest")
    return x


def _apply_axis_map(b: GraphBuilder, node: Node, x: Traced, a: int, M: np.ndarray, linear: bool):
    if not linear:
        buf = b.buffer(f"{hint(node)}_index", M.argmax(1).astype(np.int64), np.int64)
        return b.function(torch.index_select, x, x.axis(a), buf, batched=x.batched)
    rank = len(x.shape)
    if a == rank - 1:
        return b.function(torch.matmul, x, b.buffer(f"{hint(node)}_w", M.T), batched=x.batched)
    if a == rank - 2 and x.axis(a) > 0:
        return b.function(torch.matmul, b.buffer(f"{hint(node)}_h", M), x, batched=x.batched)
    raise unsupported(node, f"linear resize of axis {a} (only the last two axes)")


def _opset(b: GraphBuilder) -> int:
    return getattr(b, "opset", 17)


HANDLERS: dict[str, Callable[[GraphBuilder, Node, list[Value]], Any]] = {
    "Transpose": _transpose,
    "Slice": _slice,
    "Split": _split,
    "Gather": _gather,
    "Concat": _concat,
    "Expand": _expand,
    "Pad": _pad,
    "Cast": _cast,
    "Where": _where,
    "ConvTranspose": _conv_transpose,
    "Resize": _resize,
    "Upsample": _resize,
}
