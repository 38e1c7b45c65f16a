"""ONNX nonlinear nodes -> torch.fx (used by `verify.io.onnx_loader`, next to `onnx_ops` and
`onnx_shapes`): elementwise activations become the torch functions `bounds.fx_activations`
maps to relaxations (one line per op type), and MaxPool, Max/Min, Softmax and the products of
two activations (Mul, Div, MatMul) the calls `bounds.fx_nonlinear` rewrites exactly."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F

from verify.io.onnx_builder import GraphBuilder, Traced, Value, broadcast_operands
from verify.io.onnx_checks import invalid, spatial_output, symmetric_pads, unsupported
from verify.io.onnx_fold import node_attributes
from verify.io.onnx_ops import activation, constant, hint, pool_window

Handler = Callable[[GraphBuilder, onnx.NodeProto, list[Value]], Traced]


def _elementwise(fn: Callable[..., torch.Tensor]) -> Handler:
    def handler(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
        x = activation(node, inputs)
        return b.function(fn, x, batched=x.batched, hint=hint(node))

    return handler


def _leaky_relu(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    x = activation(node, inputs)
    slope = float(node_attributes(node).get("alpha", 0.01))
    return b.function(F.leaky_relu, x, slope, batched=x.batched, hint=hint(node))


def _prelu(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """PRelu with one constant slope, or one per channel (a slope of shape `[C, 1, ..., 1]` or
    `[C]` for a rank-2 input, broadcast over axis 1): F.leaky_relu or F.prelu."""
    x = activation(node, inputs)
    slope = constant(node, inputs, 1)
    if slope is None or np.size(slope) == 0:
        raise unsupported(node, "the slope must be a constant")
    flat = np.ravel(slope)
    if np.all(flat == flat[0]):
        return b.function(F.leaky_relu, x, float(flat[0]), batched=x.batched, hint=hint(node))
    channels = x.shape[1] if len(x.shape) > 1 else 0
    per_channel = np.shape(slope)[-(len(x.shape) - 1) :] if len(x.shape) > 1 else ()
    if not x.batched or flat.size != channels or int(np.prod(per_channel)) != channels:
        raise unsupported(node, f"slope of shape {np.shape(slope)} (one per channel of axis 1)")
    if len(per_channel) > 1 and any(d != 1 for d in per_channel[1:]):
        raise unsupported(node, f"slope of shape {np.shape(slope)} (one per channel of axis 1)")
    weight = b.buffer(f"{hint(node)}_slope", flat)
    return b.function(F.prelu, x, weight, batched=x.batched, hint=hint(node))


def _clip(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Clip with constant limits (inputs 1, 2 from opset 11; attributes before)."""
    x = activation(node, inputs)
    attrs = node_attributes(node)
    limits = []
    for i, key in ((1, "min"), (2, "max")):
        value = constant(node, inputs, i) if i < len(inputs) else attrs.get(key)
        if value is not None and np.size(value) != 1:
            raise unsupported(node, f"{key} must be a scalar constant")
        limits.append(None if value is None else float(np.ravel(value)[0]))
    if limits[0] is not None and limits[1] is not None and limits[0] > limits[1]:
        raise invalid(node, f"min {limits[0]} > max {limits[1]}")
    return b.function(torch.clamp, x, limits[0], limits[1], batched=x.batched, hint=hint(node))


def _pow(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Pow by a constant integer exponent (x^1 is x; x^0 would be 1: refused)."""
    x = activation(node, inputs)
    exponent = constant(node, inputs, 1)
    if exponent is None or np.size(exponent) != 1:
        raise unsupported(node, "the exponent must be a scalar constant")
    value = float(np.ravel(exponent)[0])
    if value != int(value) or value < 1:
        raise unsupported(node, f"exponent {value} (only integers >= 1)")
    if value == 1:
        return x
    return b.function(torch.pow, x, int(value), batched=x.batched, hint=hint(node))


def _softmax(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Softmax over one axis (opset >= 13; before, over the flattened trailing axes: only when
    the axis is the last one)."""
    x = activation(node, inputs)
    opset = getattr(b, "opset", 17)
    rank = len(x.shape)
    axis = int(node_attributes(node).get("axis", -1 if opset >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise invalid(node, f"axis {axis} out of range for rank {rank}")
    if opset < 13 and axis != rank - 1:
        raise unsupported(node, f"opset {opset} Softmax over the flattened axes {axis}..")
    dim = x.axis(axis)
    if dim == 0 and x.batched:
        raise unsupported(node, "Softmax over the batch axis")
    return b.function(F.softmax, x, dim, batched=x.batched, hint=hint(node))


def _max_pool(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """2-D MaxPool, unpadded or padded symmetrically (pads count as `-inf`, as in ONNX and
    torch; bounds.fx_nonlinear rewrites it through ReLU); no ceil_mode."""
    if len(node.output) > 1 and node.output[1]:
        raise unsupported(node, "the Indices output")
    x, attrs, kernel, strides, dilations = pool_window(b, node, inputs, "max")
    if int(attrs.get("ceil_mode", 0)):
        raise unsupported(node, "ceil_mode")
    pads = symmetric_pads(node, attrs, x.shape, kernel)
    if any(2 * p > k for p, k in zip(pads, kernel)):
        raise unsupported(node, f"padding {pads} exceeds half the kernel {kernel}")
    spatial_output(node, x.shape, kernel, strides, pads, dilations)
    return b.function(F.max_pool2d, x, tuple(kernel), tuple(strides), tuple(pads),
                      tuple(dilations), batched=x.batched, hint=hint(node))  # fmt: skip


def _max_min(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Max / Min of activations (variadic, broadcasting)."""
    if not any(isinstance(v, Traced) for v in inputs):
        raise unsupported(node, "some input must depend on the network input")
    if len(inputs) == 1:
        return inputs[0]
    values, batched, _ = broadcast_operands(b, node, list(inputs))
    values = [v if isinstance(v, Traced) else b.buffer(f"{hint(node)}_const", v) for v in values]
    values.sort(key=lambda v: v.node.op == "get_attr")  # an activation first
    fn = torch.maximum if node.op_type == "Max" else torch.minimum
    return functools.reduce(
        lambda a, c: b.function(fn, a, c, batched=batched, hint=hint(node)), values
    )


def _product(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """Mul / Div of two activations (broadcasting)."""
    (x1, x2), batched, _ = broadcast_operands(b, node, inputs[:2])
    fn = operator.mul if node.op_type == "Mul" else operator.truediv
    return b.function(fn, x1, x2, batched=batched, hint=hint(node))


def _matmul(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """MatMul of two activations with at least two axes each, on the same batch layout."""
    x1, x2 = inputs[0], inputs[1]
    if len(x1.shape) < 2 or len(x2.shape) < 2 or len(x1.shape) != len(x2.shape):
        raise unsupported(node, f"of activations {x1.shape} and {x2.shape} (need equal ranks >= 2)")
    if x1.batched != x2.batched:
        x1, x2 = b.batched(x1, node), b.batched(x2, node)
    return b.function(torch.matmul, x1, x2, batched=x1.batched, hint=hint(node))


def two_activations(inputs: list[Value]) -> bool:
    return len(inputs) >= 2 and all(isinstance(v, Traced) for v in inputs[:2])


HANDLERS: dict[str, Handler] = {
    "Sigmoid": _elementwise(torch.sigmoid),
    "Tanh": _elementwise(torch.tanh),
    "Abs": _elementwise(torch.abs),
    "Sign": _elementwise(torch.sign),
    "Floor": _elementwise(torch.floor),
    "Exp": _elementwise(torch.exp),
    "Reciprocal": _elementwise(torch.reciprocal),
    "Sin": _elementwise(torch.sin),
    "Cos": _elementwise(torch.cos),
    "LeakyRelu": _leaky_relu,
    "PRelu": _prelu,
    "Clip": _clip,
    "Pow": _pow,
    "Softmax": _softmax,
    "MaxPool": _max_pool,
    "Max": _max_min,
    "Min": _max_min,
}

# Mul, Div and MatMul of two activations (the constant forms stay in `onnx_ops`).
PRODUCTS: dict[str, Handler] = {"Mul": _product, "Div": _product, "MatMul": _matmul}
