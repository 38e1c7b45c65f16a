"""ONNX node -> torch.fx node translation (used by `verify.io.onnx_loader`): the affine layers
(Gemm, MatMul, Conv, BatchNormalization, AveragePool, GlobalAveragePool), reshapes and elementwise
arithmetic; the shape and other linear ops are in `verify.io.onnx_shapes`.

Every activation carries a batch-1 example tensor so that shapes are known while the graph is
built. The fx module is batch-first: our batch axis is always the first one and is never mixed
with the others (reshapes are written with -1 in the batch position). An ONNX tensor of shape
`S` is held either *batched* (`S[0] == 1` is our batch axis: the example has shape `S`) or
*unbatched* (our batch axis is added in front: the example has shape `(1, *S)`), e.g. inputs
declared `[1]`, `[5]` or `[12, 8]`. A reshape picks batched whenever `S` has rank >= 2 and
`S[0] == 1`; ops that need ONNX's axis 0 as the batch (Conv, pooling) rebatch, ops that act on
ONNX's axis 0 unbatch (both are free reshapes).

The emitted vocabulary is what the bound graph builder (`bounds.fx_handlers`) consumes:
`call_module` nn.Linear / nn.Conv2d / nn.ConvTranspose2d / nn.ReLU / nn.BatchNorm1d /
nn.BatchNorm2d / nn.AvgPool2d / nn.Flatten(1) / nn.Identity; `call_function` operator.add /
sub / mul / truediv / neg / getitem, getattr(shape), torch.reshape / permute / cat /
index_select / matmul / sum / mean / where and F.pad; `call_method` expand; `get_attr` for
constant tensors (registered buffers, without a batch dimension).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from verify.io.onnx_builder import GraphBuilder, Traced, Value, as_param, broadcast_operands
from verify.io.onnx_checks import (
    check_finite,
    check_size,
    float_weight,
    invalid,
    mismatch,
    spatial_output,
    strides_dilations,
    symmetric_pads,
    unsupported,
)
from verify.io.onnx_fold import flatten_axis, node_attributes, normalize_axes, resolve_reshape

BINARY_FUNCTIONS = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": operator.truediv,
}


def activation(node: onnx.NodeProto, inputs: list[Value], i: int = 0) -> Traced:
    if not isinstance(inputs[i], Traced):
        raise unsupported(node, f"input {i} must depend on the network input")
    return inputs[i]


def constant(node: onnx.NodeProto, inputs: list[Value], i: int) -> np.ndarray | None:
    """The i-th input as a constant array; None when absent; raises if it is an activation."""
    if i >= len(inputs) or inputs[i] is None:
        return None
    if isinstance(inputs[i], Traced):
        raise unsupported(node, f"input {i} ({node.input[i]!r}) must be a constant weight")
    return inputs[i]


def weight(node: onnx.NodeProto, inputs: list[Value], i: int) -> np.ndarray | None:
    """The i-th input as a validated float32 weight (see `float_weight`); None when absent."""
    array = constant(node, inputs, i)
    return None if array is None else float_weight(node, node.input[i], array)


def hint(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}_{node.output[0]}"


def _gemm(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Y = alpha * A @ op(B) + beta * C with constant B, C -> nn.Linear (weight alpha * op(B)^T);
    an unbatched `A [k, n]` becomes a product on its last axis."""
    attrs = node_attributes(node)
    x, B, C = activation(node, inputs), weight(node, inputs, 1), weight(node, inputs, 2)
    if attrs.get("transA", 0):
        raise unsupported(node, "transA=1 is not supported")
    if len(x.shape) != 2 or B is None or B.ndim != 2:
        got = None if B is None else B.shape
        raise unsupported(node, f"needs a 2-D input and weight, got shapes {x.shape} and {got}")
    trans_b = attrs.get("transB", 0)
    W = check_finite(node, "alpha * weight", attrs.get("alpha", 1.0) * (B if trans_b else B.T))
    out_features, in_features = W.shape
    if in_features != x.shape[1]:
        raise mismatch(
            node,
            f"input {node.input[0]!r} of shape {x.shape} has {x.shape[1]} features but weight "
            f"{node.input[1]!r} of shape {B.shape} (transB={trans_b}) takes {in_features}",
        )
    linear = nn.Linear(in_features, out_features, bias=C is not None)
    linear.weight = as_param(W)
    if C is not None:
        rows = x.shape[0]
        try:
            bias = np.broadcast_to(C, (rows, out_features))
        except ValueError as err:
            raise mismatch(
                node,
                f"bias {node.input[2]!r} of shape {C.shape} is not per-feature ({out_features})",
            ) from err
        bias = check_finite(node, "beta * bias", attrs.get("beta", 1.0) * bias)
        if not (bias == bias[:1]).all():  # a bias per row of an unbatched input
            linear = nn.Linear(in_features, out_features, bias=False)
            linear.weight = as_param(W)
            return b.function(operator.add, b.module(hint(node), linear, x),
                              b.buffer(f"{hint(node)}_bias", bias), batched=x.batched)  # fmt: skip
        linear.bias = as_param(bias[0])
    return b.module(hint(node), linear, x)


def _matmul(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """x @ W (-> nn.Linear without bias; a following Add may fill it) or W @ x (a product on
    the second-to-last axis, or nn.Linear(W) for a vector x) with a constant W."""
    if isinstance(inputs[0], Traced) and isinstance(inputs[1], Traced):
        raise unsupported(node, "product of two activations")
    left = not isinstance(inputs[0], Traced)
    x, W = activation(node, inputs, int(left)), weight(node, inputs, int(not left))
    if W is None or W.ndim not in (1, 2):
        raise unsupported(node, "needs a constant vector or matrix on one side")
    out_shape = _matmul_shape(node, inputs, W.shape, x.shape, left)
    check_size(node, out_shape)
    if W.ndim == 1:  # contract one axis and drop it: a product by a matrix, then a reshape
        col = W[:, None] if not left else W[None, :]
        y = _matmul_by(b, node, x, col, left)
        return b.reshape(y, out_shape, node)
    return _matmul_by(b, node, x, W, left)


def _matmul_shape(node, inputs, w_shape, x_shape, left: bool) -> tuple[int, ...]:
    a, c = (w_shape, x_shape) if left else (x_shape, w_shape)
    k_a, k_c = a[-1], c[0] if len(c) == 1 else c[-2]
    if k_a != k_c:
        i, j = (1, 0) if left else (0, 1)
        raise mismatch(
            node,
            f"input {node.input[i]!r} of shape {a} has {k_a} columns but "
            f"{'input' if left else 'weight'} {node.input[j]!r} of shape {c} has {k_c} rows",
        )
    if len(c) == 1:  # a vector on the right: its axis disappears
        return tuple(a[:-1])
    if len(a) == 1:  # a vector on the left
        return (*c[:-2], c[-1])
    return (*c[:-2], a[-2], c[-1]) if left else (*a[:-1], c[-1])


def _matmul_by(b: GraphBuilder, node: onnx.NodeProto, x: Traced, W: np.ndarray, left: bool):
    """`x @ W` or `W @ x` for a constant matrix `W`."""
    if not left:
        linear = nn.Linear(W.shape[0], W.shape[1], bias=False)
        linear.weight = as_param(W.T)
        return b.module(hint(node), linear, x)
    if len(x.shape) == 1:  # W @ v = v @ W^T
        linear = nn.Linear(W.shape[1], W.shape[0], bias=False)
        linear.weight = as_param(W)
        return b.module(hint(node), linear, x)
    if x.batched and len(x.shape) == 2:  # W contracts ONNX axis 0: our batch must move out
        x = b.unbatched(x)
    matrix = b.buffer(f"{hint(node)}_weight", W)
    y = b.function(torch.matmul, matrix, x, batched=x.batched)
    return b.reshape(y, y.shape, node)


def _conv(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    attrs = node_attributes(node)
    x, W, B = activation(node, inputs), weight(node, inputs, 1), weight(node, inputs, 2)
    if W is None or W.ndim not in (3, 4) or len(x.shape) != W.ndim:
        raise unsupported(node, "only 1-D and 2-D convolutions (3-D or 4-D input and weight)")
    x = b.batched(x, node)
    if W.ndim == 3:  # Conv1d as a Conv2d over a height of 1
        return _conv1d(b, node, x, W, B, attrs)
    group, name = attrs.get("group", 1), node.input[1]
    if group < 1 or W.shape[0] % group:
        raise invalid(node, f"group={group} does not divide the {W.shape[0]} filters of {name!r}")
    if x.shape[1] != W.shape[1] * group:
        raise mismatch(
            node,
            f"input {node.input[0]!r} of shape {x.shape} has {x.shape[1]} channels but kernel "
            f"{name!r} of shape {W.shape} (group={group}) expects {W.shape[1] * group}",
        )
    kernel = list(attrs.get("kernel_shape", W.shape[2:]))
    if kernel != list(W.shape[2:]):
        raise mismatch(node, f"kernel_shape {kernel} but kernel {name!r} has shape {W.shape}")
    if B is not None and B.shape != (W.shape[0],):
        raise mismatch(node, f"bias {node.input[2]!r} of shape {B.shape} needs ({W.shape[0]},)")
    strides, dilations = strides_dilations(node, attrs, 2)
    pads = symmetric_pads(node, attrs, x.shape, kernel)
    check_size(
        node, (1, W.shape[0], *spatial_output(node, x.shape, kernel, strides, pads, dilations))
    )
    conv = nn.Conv2d(
        W.shape[1] * group,
        W.shape[0],
        tuple(kernel),
        stride=tuple(strides),
        padding=tuple(pads),
        dilation=tuple(dilations),
        groups=group,
        bias=B is not None,
    )
    conv.weight = as_param(W)
    if B is not None:
        conv.bias = as_param(B)
    return b.module(hint(node), conv, x)


def _conv1d(b: GraphBuilder, node: onnx.NodeProto, x: Traced, W, B, attrs: dict) -> Traced:
    """`[1, C, L]` -> `[1, C, 1, L]`, a 2-D convolution with kernels `[O, C/g, 1, k]`, back."""
    lifted = {**attrs, "kernel_shape": [1, *attrs.get("kernel_shape", W.shape[2:])]}
    for key in ("strides", "dilations"):
        if key in attrs:
            lifted[key] = [1, *attrs[key]]
    if "pads" in attrs:
        pads = list(attrs["pads"])
        lifted["pads"] = [0, *pads[:1], 0, *pads[1:]] if len(pads) == 2 else pads
    copy = onnx.helper.make_node("Conv", list(node.input), list(node.output), name=node.name)
    copy.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in lifted.items())
    inputs = [b.reshape(x, (*x.shape[:2], 1, x.shape[2]), node), W[:, :, None, :], B]
    y = _conv(b, copy, inputs)
    return b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]), node)


def _batch_norm(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """nn.BatchNorm1d/2d on batched inputs of rank 2-4; otherwise (any rank, unbatched) the
    same per-channel map `x * scale + shift` (channels on ONNX axis 1)."""
    attrs = node_attributes(node)
    x = activation(node, inputs)
    params = [weight(node, inputs, i) for i in range(1, 5)]
    if attrs.get("training_mode", 0) or not attrs.get("spatial", 1):
        raise unsupported(node, "training_mode=1 or spatial=0 is not supported")
    if len(x.shape) < 2 or any(p is None for p in params):
        raise unsupported(node, f"input of shape {x.shape} (needs rank >= 2 and 4 constants)")
    channels = x.shape[1]
    for name, p in zip(node.input[1:], params):
        if p.size != channels:
            raise mismatch(
                node, f"{name!r} has {p.size} entries, the input {x.shape} has {channels} channels"
            )
    scale, shift, mean, var = (p.reshape(channels) for p in params)
    eps = attrs.get("epsilon", 1e-5)
    if not np.all(var + np.float32(eps) > 0):
        k = int(np.argmin(var + np.float32(eps) > 0))
        raise invalid(
            node, f"variance {node.input[4]!r} + epsilon {eps} must be > 0 ({var[k]} at index {k})"
        )
    if x.batched and len(x.shape) <= 4:
        cls = nn.BatchNorm2d if len(x.shape) == 4 else nn.BatchNorm1d
        bn = cls(channels, eps=eps)
        bn.weight, bn.bias = as_param(scale), as_param(shift)
        bn.running_mean = torch.tensor(mean, dtype=torch.float32)
        bn.running_var = torch.tensor(var, dtype=torch.float32)
        return b.module(hint(node), bn, x)
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + np.float32(eps))
    offset = shift - mean.astype(np.float64) * factor
    trailing = (1,) * (len(x.shape) - 2)
    name = hint(node)
    scaled = b.function(operator.mul, x, b.buffer(f"{name}_scale", factor.reshape(-1, *trailing)),
                        batched=x.batched)  # fmt: skip
    return b.function(operator.add, scaled, b.buffer(f"{name}_shift", offset.reshape(-1, *trailing)),
                      batched=x.batched)  # fmt: skip


def pool_window(
    b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value], what: str
) -> tuple[Traced, dict, list[int], list[int], list[int]]:
    """`(x batched, attributes, kernel, strides, dilations)` of a 2-D pooling node, checked:
    a 4-D input and a kernel of two sizes >= 1."""
    attrs = node_attributes(node)
    x = activation(node, inputs)
    kernel = list(attrs.get("kernel_shape", []))
    if len(kernel) != 2 or len(x.shape) != 4:
        raise unsupported(node, f"only 2-D {what} pooling is supported")
    x = b.batched(x, node)
    if min(kernel) < 1:
        raise invalid(node, f"kernel_shape {kernel} needs sizes >= 1")
    strides, dilations = strides_dilations(node, attrs, 2)
    return x, attrs, kernel, strides, dilations


def _average_pool(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x, attrs, kernel, strides, dilations = pool_window(b, node, inputs, "average")
    if any(d != 1 for d in dilations):
        raise unsupported(node, "dilated average pooling is not supported")
    pads = symmetric_pads(node, attrs, x.shape, kernel)
    if any(2 * p > k for p, k in zip(pads, kernel)):
        raise unsupported(node, f"padding {pads} exceeds half the kernel {kernel}")
    spatial_output(node, x.shape, kernel, strides, pads, dilations)
    pool = nn.AvgPool2d(
        tuple(kernel),
        stride=tuple(strides),
        padding=tuple(pads),
        ceil_mode=bool(attrs.get("ceil_mode", 0)),
        count_include_pad=bool(attrs.get("count_include_pad", 0)),
    )
    return b.module(hint(node), pool, x)


def _global_average_pool(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """GlobalAveragePool: the mean over every spatial axis (2 onwards), kept as size-1 axes
    (torch.mean with keepdim; `torch.onnx.export` writes `nn.AdaptiveAvgPool2d(1)` so)."""
    x = activation(node, inputs)
    if len(x.shape) < 3:
        raise unsupported(node, f"input of shape {list(x.shape)}: it needs spatial axes")
    x = b.batched(x, node)
    axes = tuple(range(2, len(x.shape)))
    return b.function(torch.mean, x, axes, True, batched=True, hint=hint(node))


def _flatten(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Flatten(axis): the reshape to `(prod(shape[:axis]), prod(shape[axis:]))`; nn.Flatten(1)
    when that keeps a batched input's batch axis."""
    x = activation(node, inputs)
    try:
        axis = flatten_axis(node_attributes(node).get("axis", 1), len(x.shape))
    except ValueError as err:
        raise invalid(node, str(err)) from err
    if x.batched and axis >= 1 and all(d == 1 for d in x.shape[1:axis]):
        return b.module(hint(node), nn.Flatten(start_dim=1), x)
    return b.reshape(x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))), node)


def _identity(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = activation(node, inputs)
    training = constant(node, inputs, 2) if node.op_type == "Dropout" else None
    if training is not None and bool(np.ravel(training)[0]):
        raise unsupported(node, "Dropout in training mode")
    return b.module(hint(node), nn.Identity(), x)


def _reshape(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    attrs = node_attributes(node)
    x = activation(node, inputs)
    shape = attrs.get("shape")
    shape = constant(node, inputs, 1) if shape is None else np.asarray(shape)
    if shape is None:
        raise unsupported(node, "the target shape must be a constant")
    if shape.dtype.kind not in "iu":
        raise invalid(node, f"the target shape {shape.tolist()} is a {shape.dtype} tensor")
    try:
        out_shape = resolve_reshape(x.shape, shape, attrs.get("allowzero", 0))
    except ValueError as err:
        raise mismatch(node, f"input {node.input[0]!r}: {err}") from err
    return b.reshape(x, out_shape, node)


def _squeeze_axes(node: onnx.NodeProto, inputs: list[Value], rank: int) -> list[int] | None:
    axes = node_attributes(node).get("axes")
    if axes is None:
        axes = constant(node, inputs, 1)
    try:
        return None if axes is None else normalize_axes(axes, rank)
    except ValueError as err:
        raise invalid(node, str(err)) from err


def _squeeze(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = activation(node, inputs)
    axes = _squeeze_axes(node, inputs, len(x.shape))
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise mismatch(node, f"axes {axes} of input {node.input[0]!r} {x.shape} are not all 1")
    return b.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes), node)


def _unsqueeze(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = activation(node, inputs)
    given = node_attributes(node).get("axes", constant(node, inputs, 1))
    if given is None:
        raise invalid(node, "Unsqueeze needs axes")
    axes = _squeeze_axes(node, inputs, len(x.shape) + np.size(given)) or []
    out = list(x.shape)
    for axis in axes:
        out.insert(axis, 1)
    return b.reshape(x, tuple(out), node)


def _const_operand(node: onnx.NodeProto, k: int, const: np.ndarray) -> np.ndarray:
    """The constant (input k) as a float32 weight."""
    return float_weight(node, node.input[k], const)


def _fuse_bias(b: GraphBuilder, x_name: str, x: Traced, const: np.ndarray) -> bool:
    """Add of a per-feature vector right after a bias-less Linear (MatMul) becomes its bias.

    Only when the Linear's output feeds nothing else (one ONNX use, no fx users yet, no other
    ONNX name bound to the same fx node)."""
    if x.node.op != "call_module" or x.node.users or const.ndim > 1 or b.uses[x_name] != 1:
        return False
    if sum(1 for v in b.env.values() if isinstance(v, Traced) and v.node is x.node) != 1:
        return False
    linear = b.root.get_submodule(x.node.target)
    if not isinstance(linear, nn.Linear) or linear.bias is not None:
        return False
    if const.size not in (1, linear.out_features):
        return False
    linear.bias = as_param(np.broadcast_to(const, (linear.out_features,)))
    x.example = x.example + linear.bias
    return True


def _binary(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Add/Sub of activations (residual, broadcasting); Add/Sub/Mul/Div with one constant side
    (any broadcast: the activation is expanded when the constant is larger)."""
    fn = BINARY_FUNCTIONS[node.op_type]
    lhs, rhs = inputs[0], inputs[1]
    if isinstance(lhs, Traced) and isinstance(rhs, Traced):
        if node.op_type not in ("Add", "Sub"):
            shapes = f"{node.input[0]!r} {lhs.shape} and {node.input[1]!r} {rhs.shape}"
            raise unsupported(node, f"of two activations {shapes}")
        (x1, x2), batched, _ = broadcast_operands(b, node, [lhs, rhs])
        return b.function(fn, x1, x2, batched=batched)
    const_first = not isinstance(lhs, Traced)
    if node.op_type == "Div" and const_first:  # c / x: the reciprocal (bounds.fx_nonlinear)
        (c, x), batched, _ = broadcast_operands(b, node, [lhs, rhs])
        return b.function(fn, b.buffer(f"{hint(node)}_const", c), x, batched=batched)
    k = int(not const_first)
    const = _const_operand(node, k, rhs if not const_first else lhs)
    if node.op_type == "Div" and not np.all(const != 0):
        where = tuple(int(i) for i in np.unravel_index(int(np.argmin(const != 0)), const.shape))
        raise invalid(node, f"division by zero: divisor {node.input[1]!r} is 0 at index {where}")
    x = rhs if const_first else lhs
    try:
        grows = tuple(np.broadcast_shapes(const.shape, x.shape)) != x.shape
    except ValueError as err:
        raise mismatch(
            node,
            f"constant {node.input[k]!r} of shape {const.shape} does not broadcast with input "
            f"{node.input[1 - k]!r} of shape {x.shape}",
        ) from err
    if node.op_type == "Add" and not grows:
        dims = list(const.shape)
        while dims and dims[0] == 1:
            dims.pop(0)
        if len(dims) <= 1 and _fuse_bias(b, node.input[int(const_first)], x, const.reshape(dims)):
            return x
    (x, const), batched, _ = broadcast_operands(b, node, [x, const])
    operand = b.buffer(f"{hint(node)}_const", const)
    if const_first and node.op_type == "Sub":
        return b.function(fn, operand, x, batched=batched)
    return b.function(fn, x, operand, batched=batched)


def _neg(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = activation(node, inputs)
    return b.function(operator.neg, x, batched=x.batched)


HANDLERS: dict[str, Callable[[GraphBuilder, onnx.NodeProto, list[Value]], Any]] = {
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Conv": _conv,
    "BatchNormalization": _batch_norm,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool,
    "Flatten": _flatten,
    "Identity": _identity,
    "Dropout": _identity,
    "Reshape": _reshape,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Add": _binary,
    "Sub": _binary,
    "Mul": _binary,
    "Div": _binary,
    "Neg": _neg,
}
