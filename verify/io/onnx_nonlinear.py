"""ONNX nonlinear nodes -> torch.fx (used by `verify.io.onnx_loader`, next to `onnx_ops` and
`onnx_shapes`): elementwise activations become the torch calls their relaxations declare
(`relaxations.registry`: each ONNX op with how it reads its attributes and constant inputs),
which `bounds.graph.fx_activations` maps back to the relaxations; MaxPool, Max/Min, Softmax and the
products of two activations (Mul, Div, MatMul) become the calls `bounds.fx_nonlinear` rewrites
exactly."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from relaxations.registry import InvalidNodeError, OnnxNode, onnx_ops
from verify.io.onnx_builder import GraphBuilder, Traced, Value, broadcast_operands
from verify.io.onnx_checks import invalid, spatial_output, symmetric_pads, unsupported
from verify.io.onnx_fold import node_attributes
from verify.io.onnx_ops import activation, constant, hint, pool_window

Handler = Callable[[GraphBuilder, onnx.NodeProto, list[Value]], Traced]


def _onnx_node(node: onnx.NodeProto, inputs: list[Value], x: Traced) -> OnnxNode:
    """What a relaxation's ONNX reader sees: attributes, constant inputs as tensors (an
    activation there is refused), the activation's shape."""
    constants = []
    for i in range(1, len(inputs)):
        value = constant(node, inputs, i)
        constants.append(None if value is None else torch.tensor(np.array(value)))
    attributes = node_attributes(node)
    return OnnxNode(node.op_type, attributes, tuple(constants), tuple(x.shape), x.batched)


def _registered(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Value]) -> Traced:
    """A node of a registered relaxation's ONNX op: the torch call its reader gives (a
    function, or a module class instantiated with the arguments), tensors as buffers."""
    entry, op = onnx_ops()[node.op_type]
    x = activation(node, inputs)
    try:
        call = entry.default_call() if op.read is None else op.read(_onnx_node(node, inputs, x))
    except InvalidNodeError as err:
        raise invalid(node, str(err)) from err
    except ValueError as err:
        raise unsupported(node, str(err)) from err
    if call is None:
        return x
    args = tuple(
        b.buffer(f"{hint(node)}_const", a.numpy()) if isinstance(a, torch.Tensor) else a
        for a in call.arguments
    )
    if isinstance(call.function, type) and issubclass(call.function, nn.Module):
        return b.module(hint(node), call.function(*args), x)
    return b.function(call.function, x, *args, batched=x.batched, hint=hint(node))


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


_STRUCTURAL: dict[str, Handler] = {
    "Softmax": _softmax,
    "MaxPool": _max_pool,
    "Max": _max_min,
    "Min": _max_min,
}


class _Handlers(Mapping):
    """The ONNX ops translated here, read live: Softmax, MaxPool, Max and Min, and every op a
    registered relaxation declares (`relaxations.registry`; plugins registered later too)."""

    def __getitem__(self, op_type: str) -> Handler:
        if op_type in _STRUCTURAL:
            return _STRUCTURAL[op_type]
        if op_type in onnx_ops():
            return _registered
        raise KeyError(op_type)

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(_STRUCTURAL), **dict.fromkeys(onnx_ops())})

    def __len__(self) -> int:
        return len({*_STRUCTURAL, *onnx_ops()})


HANDLERS: Mapping[str, Handler] = _Handlers()

# Mul, Div and MatMul of two activations (the constant forms stay in `onnx_ops`).
PRODUCTS: dict[str, Handler] = {"Mul": _product, "Div": _product, "MatMul": _matmul}
