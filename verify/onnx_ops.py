"""ONNX node -> torch.fx node translation (used by `verify.onnx_loader`).

Every activation carries a batch-1 example tensor so that shapes are known while the graph is
built; the batch dimension is always the first one and is never mixed with the others (reshapes
are written with -1 in the batch position). Only this vocabulary is emitted, for the bound graph
builder: `call_module` nn.Linear / nn.Conv2d / nn.ReLU / nn.BatchNorm1d / nn.BatchNorm2d /
nn.AvgPool2d / nn.Flatten(1) / nn.Identity; `call_function` operator.add / sub / mul / truediv
and torch.reshape; `get_attr` for constant tensors (registered buffers, without a batch
dimension: leading size-1 dimensions are dropped, broadcasting keeps the result unchanged).
"""

from __future__ import annotations

import builtins
import keyword
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from torch import fx, nn

from verify.onnx_fold import (
    check_finite,
    check_size,
    flatten_axis,
    float_weight,
    invalid,
    mismatch,
    node_attributes,
    normalize_axes,
    resolve_reshape,
    spatial_output,
    strides_dilations,
    symmetric_pads,
    unsupported,
)

BINARY_FUNCTIONS = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": operator.truediv,
}


# Attribute names of the returned GraphModule that submodules and buffers must not take.
_RESERVED = frozenset(dir(nn.Module())) | {
    "meta",
    "input_shape",
    "output_shape",
    "source_path",
    "self",
    *keyword.kwlist,
    *keyword.softkwlist,
    *dir(builtins),  # and the globals of fx's generated code:
    *("torch", "operator", "math", "fx_pytree", "pytree", "device", "inf", "nan", "typing"),
}


@dataclass
class Traced:
    """An fx node and its batch-1 example value (shapes are read from the example)."""

    node: fx.Node
    example: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.example.shape)


Value = Any  # Traced (depends on the network input) or np.ndarray (a constant)


def as_param(array: np.ndarray) -> nn.Parameter:
    tensor = torch.tensor(np.ascontiguousarray(array, dtype=np.float32))
    return nn.Parameter(tensor, requires_grad=False)


class GraphBuilder:
    """Accumulates the fx graph, its submodules and buffers, and the ONNX value environment."""

    def __init__(self, uses: dict[str, int]) -> None:
        self.root = nn.Module()
        self.graph = fx.Graph()
        self.env: dict[str, Value] = {}
        self.uses = uses
        self.elements = 0  # elements of all activation examples so far (batch 1)
        self._taken: set[str] = set()
        self._suffix: dict[str, int] = {}  # next suffix to try per base name

    def fresh_name(self, hint: str) -> str:
        """An ASCII Python identifier from `hint` (ONNX names may hold any character)."""
        base = re.sub(r"[^0-9a-z_]", "_", hint.lower()).strip("_") or "node"
        base = base if base[0].isalpha() else f"n_{base}"
        name, k = base, self._suffix.get(base, 1)
        while name in self._taken or name in _RESERVED or hasattr(fx.GraphModule, name):
            name, k = f"{base}_{k}", k + 1
        self._taken.add(name)
        self._suffix[base] = k
        return name

    def placeholder(self, hint: str, shape: tuple[int, ...]) -> Traced:
        self.elements += int(np.prod(shape))
        return Traced(self.graph.placeholder(self.fresh_name(hint)), torch.zeros(shape))

    def module(self, hint: str, module: nn.Module, x: Traced) -> Traced:
        module.eval().requires_grad_(False)
        name = self.fresh_name(hint)
        self.root.add_module(name, module)
        with torch.no_grad():
            example = module(x.example)
        return Traced(self.graph.call_module(name, (x.node,)), example)

    def buffer(self, hint: str, array: np.ndarray) -> Traced:
        name = self.fresh_name(hint)
        tensor = torch.tensor(np.ascontiguousarray(array, dtype=np.float32))
        self.root.register_buffer(name, tensor)
        return Traced(self.graph.get_attr(name), tensor)

    def function(self, fn: Callable[..., torch.Tensor], *args: Any) -> Traced:
        fx_args = tuple(a.node if isinstance(a, Traced) else a for a in args)
        examples = [a.example if isinstance(a, Traced) else a for a in args]
        with torch.no_grad():
            example = fn(*examples)
        return Traced(self.graph.call_function(fn, fx_args), example)

    def reshape(self, x: Traced, out_shape: tuple[int, ...]) -> Traced:
        """Per-sample reshape to `out_shape` (batch-1 shape; the batch is written as -1)."""
        return self.function(torch.reshape, x, (-1, *out_shape[1:]))


def _activation(node: onnx.NodeProto, inputs: list[Value], i: int = 0) -> Traced:
    if not isinstance(inputs[i], Traced):
        raise unsupported(node, f"input {i} must depend on the network input")
    return inputs[i]


def _constant(node: onnx.NodeProto, inputs: list[Value], i: int) -> np.ndarray | None:
    """The i-th input as a constant array; None when absent; raises if it is an activation."""
    if i >= len(inputs) or inputs[i] is None:
        return None
    if isinstance(inputs[i], Traced):
        raise unsupported(node, f"input {i} ({node.input[i]!r}) must be a constant weight")
    return inputs[i]


def _weight(node: onnx.NodeProto, inputs: list[Value], i: int) -> np.ndarray | None:
    """The i-th input as a validated float32 weight (see `float_weight`); None when absent."""
    array = _constant(node, inputs, i)
    return None if array is None else float_weight(node, node.input[i], array)


def _hint(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}_{node.output[0]}"


def _gemm(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Y = alpha * A @ op(B) + beta * C with constant B, C -> nn.Linear (weight alpha * op(B)^T)."""
    attrs = node_attributes(node)
    x, B, C = _activation(node, inputs), _weight(node, inputs, 1), _weight(node, inputs, 2)
    if attrs.get("transA", 0):
        raise unsupported(node, "transA=1 is not supported")
    if len(x.shape) != 2 or B is None or B.ndim != 2:
        got = None if B is None else B.shape
        raise unsupported(node, f"needs a 2-D input and weight, got shapes {x.shape} and {got}")
    trans_b = attrs.get("transB", 0)
    weight = check_finite(node, "alpha * weight", attrs.get("alpha", 1.0) * (B if trans_b else B.T))
    out_features, in_features = weight.shape
    if in_features != x.shape[1]:
        raise mismatch(
            node,
            f"input {node.input[0]!r} of shape {x.shape} has {x.shape[1]} features but weight "
            f"{node.input[1]!r} of shape {B.shape} (transB={trans_b}) takes {in_features}",
        )
    linear = nn.Linear(in_features, out_features, bias=C is not None)
    linear.weight = as_param(weight)
    if C is not None:
        try:
            bias = np.broadcast_to(C, (1, out_features)).reshape(out_features)
        except ValueError as err:
            raise mismatch(
                node,
                f"bias {node.input[2]!r} of shape {C.shape} is not per-feature ({out_features})",
            ) from err
        linear.bias = as_param(check_finite(node, "beta * bias", attrs.get("beta", 1.0) * bias))
    return b.module(_hint(node), linear, x)


def _matmul(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """x @ W with a constant 2-D W -> nn.Linear without bias (a following Add may fill it)."""
    x, W = _activation(node, inputs), _weight(node, inputs, 1)
    if W is None or W.ndim != 2 or len(x.shape) < 2:
        raise unsupported(node, "needs an activation of rank >= 2 times a constant matrix")
    if x.shape[-1] != W.shape[0]:
        raise mismatch(
            node,
            f"input {node.input[0]!r} of shape {x.shape} has {x.shape[-1]} columns but weight "
            f"{node.input[1]!r} of shape {W.shape} has {W.shape[0]} rows",
        )
    check_size(node, (*x.shape[:-1], W.shape[1]))
    linear = nn.Linear(W.shape[0], W.shape[1], bias=False)
    linear.weight = as_param(W.T)
    return b.module(_hint(node), linear, x)


def _conv(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    attrs = node_attributes(node)
    x, W, B = _activation(node, inputs), _weight(node, inputs, 1), _weight(node, inputs, 2)
    if W is None or W.ndim != 4 or len(x.shape) != 4:
        raise unsupported(node, "only 2-D convolutions (4-D input and weight) are supported")
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
    return b.module(_hint(node), conv, x)


def _batch_norm(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    attrs = node_attributes(node)
    x = _activation(node, inputs)
    params = [_weight(node, inputs, i) for i in range(1, 5)]
    if attrs.get("training_mode", 0) or not attrs.get("spatial", 1):
        raise unsupported(node, "training_mode=1 or spatial=0 is not supported")
    if len(x.shape) not in (2, 3, 4) or any(p is None for p in params):
        raise unsupported(node, f"input of shape {x.shape} (needs rank 2-4 and 4 constants)")
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
    cls = nn.BatchNorm2d if len(x.shape) == 4 else nn.BatchNorm1d
    bn = cls(channels, eps=eps)
    bn.weight, bn.bias = as_param(scale), as_param(shift)
    bn.running_mean = torch.tensor(mean, dtype=torch.float32)
    bn.running_var = torch.tensor(var, dtype=torch.float32)
    return b.module(_hint(node), bn, x)


def _average_pool(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    attrs = node_attributes(node)
    x = _activation(node, inputs)
    kernel = list(attrs.get("kernel_shape", []))
    if len(kernel) != 2 or len(x.shape) != 4:
        raise unsupported(node, "only 2-D average pooling is supported")
    if min(kernel) < 1:
        raise invalid(node, f"kernel_shape {kernel} needs sizes >= 1")
    strides, dilations = strides_dilations(node, attrs, 2)
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
    return b.module(_hint(node), pool, x)


def _flatten(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Flatten(axis) equals nn.Flatten(1) on batch-first tensors iff dims 1..axis-1 are all 1."""
    x = _activation(node, inputs)
    try:
        axis = flatten_axis(node_attributes(node).get("axis", 1), len(x.shape))
    except ValueError as err:
        raise invalid(node, str(err)) from err
    if axis < 1 or any(d != 1 for d in x.shape[1:axis]):
        raise unsupported(node, f"axis={axis} on shape {x.shape} mixes the batch dimension")
    return b.module(_hint(node), nn.Flatten(start_dim=1), x)


def _identity(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = _activation(node, inputs)
    training = _constant(node, inputs, 2) if node.op_type == "Dropout" else None
    if training is not None and bool(np.ravel(training)[0]):
        raise unsupported(node, "Dropout in training mode")
    return b.module(_hint(node), nn.Identity(), x)


def _relu(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    return b.module(_hint(node), nn.ReLU(), _activation(node, inputs))


def _check_reshape(node: onnx.NodeProto, x: Traced, out_shape: tuple[int, ...]) -> None:
    if not out_shape or out_shape[0] != 1:
        raise unsupported(node, f"{x.shape} -> {out_shape} mixes the batch dimension")


def _reshape(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    attrs = node_attributes(node)
    x = _activation(node, inputs)
    shape = attrs.get("shape")
    shape = _constant(node, inputs, 1) if shape is None else np.asarray(shape)
    if shape is None:
        raise unsupported(node, "the target shape must be a constant")
    if shape.dtype.kind not in "iu":
        raise invalid(node, f"the target shape {shape.tolist()} is a {shape.dtype} tensor")
    try:
        out_shape = resolve_reshape(x.shape, shape, attrs.get("allowzero", 0))
    except ValueError as err:
        raise mismatch(node, f"input {node.input[0]!r}: {err}") from err
    _check_reshape(node, x, out_shape)
    return b.reshape(x, out_shape)


def _transpose(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """A transpose that keeps the batch first and only moves size-1 dims is a reshape."""
    x = _activation(node, inputs)
    perm = list(node_attributes(node).get("perm", reversed(range(len(x.shape)))))
    if sorted(perm) != list(range(len(x.shape))):
        raise invalid(node, f"perm={perm} is not a permutation of the {len(x.shape)} axes")
    moved = [p for p in perm if x.shape[p] != 1]
    if perm[0] != 0 or moved != sorted(moved):
        raise unsupported(node, f"perm={perm} on shape {x.shape} is not a plain reshape")
    return b.reshape(x, tuple(x.shape[p] for p in perm))


def _squeeze_axes(node: onnx.NodeProto, inputs: list[Value], rank: int) -> list[int] | None:
    axes = node_attributes(node).get("axes")
    if axes is None:
        axes = _constant(node, inputs, 1)
    try:
        return None if axes is None else normalize_axes(axes, rank)
    except ValueError as err:
        raise invalid(node, str(err)) from err


def _squeeze(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = _activation(node, inputs)
    axes = _squeeze_axes(node, inputs, len(x.shape))
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if 0 in axes:
        raise unsupported(node, f"axes {axes} of shape {x.shape} include the batch dimension")
    if any(x.shape[a] != 1 for a in axes):
        raise mismatch(node, f"axes {axes} of input {node.input[0]!r} {x.shape} are not all 1")
    return b.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _unsqueeze(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = _activation(node, inputs)
    given = node_attributes(node).get("axes", _constant(node, inputs, 1))
    if given is None:
        raise invalid(node, "Unsqueeze needs axes")
    axes = _squeeze_axes(node, inputs, len(x.shape) + np.size(given)) or []
    if 0 in axes:
        raise unsupported(node, "inserting a dimension before the batch dimension")
    out = list(x.shape)
    for axis in axes:
        out.insert(axis, 1)
    return b.reshape(x, tuple(out))


def _const_operand(node: onnx.NodeProto, k: int, x: Traced, const: np.ndarray) -> np.ndarray:
    """The constant (input k) as float32 without leading size-1 dims; it may not change x's
    shape."""
    const = float_weight(node, node.input[k], const)
    try:
        result = np.broadcast_shapes(const.shape, x.shape)
    except ValueError as err:
        raise mismatch(
            node,
            f"constant {node.input[k]!r} of shape {const.shape} does not broadcast with input "
            f"{node.input[1 - k]!r} of shape {x.shape}",
        ) from err
    if tuple(result) != x.shape:
        raise unsupported(node, f"constant {const.shape} would broadcast {x.shape} to {result}")
    dims = list(const.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return const.reshape(dims)


def _fuse_bias(b: GraphBuilder, x_name: str, x: Traced, const: np.ndarray) -> bool:
    """Add of a per-feature vector right after a bias-less Linear (MatMul) becomes its bias.

    Only when the Linear's output feeds nothing else (one ONNX use, no fx users yet)."""
    if x.node.op != "call_module" or x.node.users or const.ndim > 1 or b.uses[x_name] != 1:
        return False
    linear = b.root.get_submodule(x.node.target)
    if not isinstance(linear, nn.Linear) or linear.bias is not None:
        return False
    linear.bias = as_param(np.broadcast_to(const, (linear.out_features,)))
    x.example = x.example + linear.bias
    return True


def _binary(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Add/Sub of activations (residual); Add/Sub/Mul/Div with one constant side."""
    fn = BINARY_FUNCTIONS[node.op_type]
    lhs, rhs = inputs[0], inputs[1]
    if isinstance(lhs, Traced) and isinstance(rhs, Traced):
        shapes = f"{node.input[0]!r} {lhs.shape} and {node.input[1]!r} {rhs.shape}"
        try:
            np.broadcast_shapes(lhs.shape, rhs.shape)
        except ValueError as err:
            raise mismatch(node, f"activations {shapes} do not broadcast") from err
        if node.op_type not in ("Add", "Sub") or lhs.shape != rhs.shape:
            raise unsupported(node, f"of two activations {shapes}")
        return b.function(fn, lhs, rhs)
    const_first = not isinstance(lhs, Traced)
    if node.op_type == "Div" and const_first:
        raise unsupported(node, "division by an activation is not affine")
    x, const = (rhs, lhs) if const_first else (lhs, rhs)
    const = _const_operand(node, int(not const_first), x, const)
    if node.op_type == "Div" and not np.all(const != 0):
        k = np.unravel_index(int(np.argmin(const != 0)), const.shape)
        where = tuple(int(i) for i in k)
        raise invalid(node, f"division by zero: divisor {node.input[1]!r} is 0 at index {where}")
    if node.op_type == "Add" and _fuse_bias(b, node.input[int(const_first)], x, const):
        return x
    operand = b.buffer(f"{_hint(node)}_const", const)
    if const_first and node.op_type == "Sub":
        return b.function(fn, operand, x)
    return b.function(fn, x, operand)


HANDLERS: dict[str, Callable[[GraphBuilder, onnx.NodeProto, list[Value]], Traced]] = {
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Conv": _conv,
    "Relu": _relu,
    "BatchNormalization": _batch_norm,
    "AveragePool": _average_pool,
    "Flatten": _flatten,
    "Identity": _identity,
    "Dropout": _identity,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Add": _binary,
    "Sub": _binary,
    "Mul": _binary,
    "Div": _binary,
}
