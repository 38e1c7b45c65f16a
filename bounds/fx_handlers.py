"""Map torch.fx nodes to BoundOps (used by `bounds.graph.build_graph`).

The fx graph is interpreted on an example batch: every value is either a constant (folded
eagerly: weights, normalisation constants, shapes) or an `Act`, an activation produced by one of
our nodes. Each supported call on an activation appends one node spec
`(name, op, input names, shape)`; anything else raises UnsupportedOperationError.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from bounds.errors import InvalidNetworkError, UnsupportedOperationError
from bounds.ops import (
    ActivationOp,
    BoundOp,
    ConvOp,
    ElementwiseAffineOp,
    LinearOp,
    ReshapeOp,
    SumOp,
    avg_pool_as_conv,
)
from relaxations import get_relaxation

INPUT = "input"
NodeSpec = tuple[str, BoundOp | None, tuple[str, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Act:
    """An activation: the output of our node `name`, with its example value `[batch, *shape]`."""

    name: str
    value: Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape[1:])


class _Builder:
    """Accumulates node specs while the fx graph is interpreted."""

    def __init__(self, example: Tensor) -> None:
        self.specs: list[NodeSpec] = [(INPUT, None, (), tuple(example.shape[1:]))]
        self.dtype = example.dtype
        self.batch = example.shape[0]

    def add(self, name: str, op: BoundOp, inputs: list[Act]) -> Act:
        value = op.forward(*(a.value for a in inputs))
        self.specs.append((name, op, tuple(a.name for a in inputs), tuple(value.shape[1:])))
        return Act(name, value)

    def const(self, value: Any, node: str) -> Tensor:
        """A constant operand as a tensor in the network's dtype: a copy, so the graph is a
        snapshot that later in-place changes of the module's weights cannot alter."""
        if isinstance(value, Tensor):
            return value.detach().to(self.dtype, copy=True)
        if isinstance(value, (int, float)):
            return torch.tensor(float(value), dtype=self.dtype)
        raise UnsupportedOperationError(type(value).__name__, node, "unexpected operand")


def _unsupported(what: str, node: str, detail: str = "") -> UnsupportedOperationError:
    return UnsupportedOperationError(what, node, detail)


# --- activations -----------------------------------------------------------------------------


def _relu(b: _Builder, node: str, x: Act, inplace: bool = False) -> Act:
    return b.add(node, ActivationOp(get_relaxation("relu"), x.shape), [x])


def _reshape_result(b: _Builder, node: str, x: Act, out: Tensor) -> Act:
    """A reshape whose example result is `out`; it must keep the batch dimension apart."""
    if out.shape[0] != b.batch or out[0].numel() != x.value[0].numel():
        raise _unsupported("reshape", node, f"mixes the batch dimension ({tuple(out.shape)})")
    if tuple(out.shape[1:]) == x.shape:
        return x
    return b.add(node, ReshapeOp(x.shape, tuple(out.shape[1:])), [x])


# --- elementwise arithmetic -------------------------------------------------------------------


def _affine_const(b: _Builder, node: str, x: Act, scale: Any, shift: Any) -> Act:
    """`x * scale + shift` with constant operands that must not change `x`'s shape."""
    scale = None if scale is None else b.const(scale, node)
    shift = None if shift is None else b.const(shift, node)
    probe = x.value
    for t in (scale, shift):
        if t is not None:
            probe = probe + t
            if tuple(probe.shape) != tuple(x.value.shape):
                raise _unsupported("broadcast", node, f"constant of shape {tuple(t.shape)}")
    trim = [None if t is None else _drop_batch_dims(t, len(x.shape), node) for t in (scale, shift)]
    return b.add(node, ElementwiseAffineOp(x.shape, *trim), [x])


def _drop_batch_dims(t: Tensor, ndim: int, node: str) -> Tensor:
    while t.dim() > ndim:
        if t.shape[0] != 1:
            raise _unsupported("broadcast", node, "constant depends on the batch index")
        t = t[0]
    return t


def _arith(kind: str) -> Callable[..., Act]:
    def handler(b: _Builder, node: str, lhs: Any, rhs: Any, **kwargs: Any) -> Act:
        if kwargs.get("alpha", 1) != 1:
            raise _unsupported(kind, node, "alpha != 1")
        if isinstance(lhs, Act) and isinstance(rhs, Act):
            if kind not in ("add", "sub"):
                raise _unsupported(kind, node, "product or quotient of two activations")
            if lhs.shape != rhs.shape:
                raise _unsupported(kind, node, f"broadcast of {lhs.shape} and {rhs.shape}")
            return b.add(node, SumOp(lhs.shape, (1.0, 1.0 if kind == "add" else -1.0)), [lhs, rhs])
        if isinstance(lhs, Act):
            if kind == "add":
                return _affine_const(b, node, lhs, None, rhs)
            if kind == "sub":
                return _affine_const(b, node, lhs, None, -b.const(rhs, node))
            if kind == "mul":
                return _affine_const(b, node, lhs, rhs, None)
            return _affine_const(b, node, lhs, 1.0 / b.const(rhs, node), None)
        if kind == "add":
            return _affine_const(b, node, rhs, None, lhs)
        if kind == "sub":
            return _affine_const(b, node, rhs, -1.0, lhs)
        if kind == "mul":
            return _affine_const(b, node, rhs, lhs, None)
        raise _unsupported("div", node, "division by an activation")

    return handler


def _neg(b: _Builder, node: str, x: Act) -> Act:
    return _affine_const(b, node, x, -1.0, None)


# --- affine layers ------------------------------------------------------------------------------


def _linear(b: _Builder, node: str, x: Act, weight: Any, bias: Any = None) -> Act:
    if isinstance(weight, Act) or isinstance(bias, Act):
        raise InvalidNetworkError(f"node {node!r}: weight or bias depends on the input")
    if len(x.shape) != 1:
        raise _unsupported("linear", node, f"input of shape {x.shape}: flatten it first")
    bias_t = None if bias is None else b.const(bias, node)
    return b.add(node, LinearOp(b.const(weight, node), bias_t), [x])


def _matmul(b: _Builder, node: str, x: Any, w: Any) -> Act:
    if not isinstance(x, Act) or isinstance(w, Act) or getattr(w, "dim", lambda: 0)() != 2:
        raise _unsupported("matmul", node, "only activation @ constant matrix is supported")
    return _linear(b, node, x, b.const(w, node).T)


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _conv(
    b: _Builder,
    node: str,
    x: Act,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Act:
    if isinstance(weight, Act) or isinstance(bias, Act):
        raise InvalidNetworkError(f"node {node!r}: weight or bias depends on the input")
    if len(x.shape) != 3 or weight.dim() != 4:
        raise _unsupported("conv2d", node, f"input of shape {x.shape}")
    weight = b.const(weight, node)
    kernel, dilation = tuple(weight.shape[2:]), _pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif all(d * (k - 1) % 2 == 0 for d, k in zip(dilation, kernel)):
            padding = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))
        else:
            raise _unsupported("conv2d", node, "asymmetric 'same' padding")
    bias_t = None if bias is None else b.const(bias, node)
    op = ConvOp(weight, bias_t, x.shape, _pair(stride), _pair(padding), dilation, groups)
    return b.add(node, op, [x])


def _avg_pool(
    b: _Builder,
    node: str,
    x: Act,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Act:
    """Average pooling as a depthwise convolution; without `count_include_pad` the border
    windows are rescaled by a constant elementwise factor (still affine)."""
    kernel, padding = _pair(kernel_size), _pair(padding)
    stride = kernel if stride is None or stride == [] else _pair(stride)
    if divisor_override is not None:
        raise _unsupported("avg_pool2d", node, "divisor_override")
    op = avg_pool_as_conv(x.shape, kernel, stride, padding, b.dtype)
    expected = F.avg_pool2d(x.value, kernel, stride, padding, ceil_mode, count_include_pad)
    if tuple(expected.shape[1:]) != op.out_shape:
        raise _unsupported("avg_pool2d", node, "ceil_mode changes the output size")
    pooled = b.add(node, op, [x])
    if count_include_pad or not any(padding):
        return pooled
    ones = torch.ones(1, *x.shape, dtype=b.dtype)
    share = F.avg_pool2d(ones, kernel, stride, padding, False, True)[0]
    return _affine_const(b, node + "_border", pooled, 1.0 / share, None)


def _batch_norm(b: _Builder, node: str, x: Act, bn: nn.modules.batchnorm._BatchNorm) -> Act:
    if bn.training:
        raise InvalidNetworkError(f"BatchNorm {node!r} is in training mode: call net.eval() first")
    if bn.running_mean is None:
        raise _unsupported(type(bn).__name__, node, "no running statistics")
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias
    trailing = (1,) * (len(x.shape) - 1)
    return _affine_const(b, node, x, scale.reshape(-1, *trailing), shift.reshape(-1, *trailing))


def _dropout(b: _Builder, node: str, x: Act, *args: Any, training: bool = False, **kw: Any) -> Act:
    if training or (len(args) > 1 and args[1]):
        raise InvalidNetworkError(f"dropout {node!r} is in training mode: call net.eval() first")
    return x


# --- dispatch -------------------------------------------------------------------------------


def _call_module(b: _Builder, node: str, mod: nn.Module, args: list, kwargs: dict) -> Act:
    x = args[0]
    if isinstance(mod, nn.Linear):
        return _linear(b, node, x, mod.weight, mod.bias)
    if isinstance(mod, nn.Conv2d):
        if mod.padding_mode != "zeros":
            raise _unsupported("Conv2d", node, f"padding_mode={mod.padding_mode!r}")
        return _conv(b, node, x, mod.weight, mod.bias, mod.stride, mod.padding, mod.dilation,
                     mod.groups)  # fmt: skip
    if isinstance(mod, nn.ReLU):
        return _relu(b, node, x)
    if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return _batch_norm(b, node, x, mod)
    if isinstance(mod, nn.AvgPool2d):
        return _avg_pool(b, node, x, mod.kernel_size, mod.stride, mod.padding, mod.ceil_mode,
                         mod.count_include_pad, mod.divisor_override)  # fmt: skip
    if isinstance(mod, (nn.Flatten, nn.Unflatten)):
        return _reshape_result(b, node, x, mod(x.value))
    if isinstance(mod, nn.Identity):
        return x
    if isinstance(mod, nn.Dropout):
        return _dropout(b, node, x, training=mod.training)
    raise _unsupported(type(mod).__name__, node)


_RESHAPES = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze}
_RESHAPE_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous"}

_FUNCTIONS: dict[Any, Callable[..., Act]] = {
    torch.relu: _relu,
    F.relu: _relu,
    operator.add: _arith("add"),
    torch.add: _arith("add"),
    operator.sub: _arith("sub"),
    torch.sub: _arith("sub"),
    operator.mul: _arith("mul"),
    torch.mul: _arith("mul"),
    operator.truediv: _arith("div"),
    torch.div: _arith("div"),
    operator.neg: _neg,
    torch.neg: _neg,
    F.linear: _linear,
    torch.matmul: _matmul,
    operator.matmul: _matmul,
    F.conv2d: _conv,
    F.avg_pool2d: _avg_pool,
    F.dropout: _dropout,
}

_METHODS: dict[str, Callable[..., Act]] = {
    "relu": _relu,
    "add": _arith("add"),
    "sub": _arith("sub"),
    "mul": _arith("mul"),
    "div": _arith("div"),
    "neg": _neg,
    "matmul": _matmul,
}


def _describe(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _call(b: _Builder, gm: fx.GraphModule, node: fx.Node, args: list, kwargs: dict) -> Any:
    """Evaluate one call node: fold constants, else map it to a BoundOp."""
    flat: list[Any] = []
    fx.node.map_aggregate((args, kwargs), flat.append)
    has_act = any(isinstance(v, Act) for v in flat)
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return _call_module(b, node.name, mod, args, kwargs) if has_act else mod(*args, **kwargs)
    if node.op == "call_method":
        if not has_act:
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if isinstance(args[0], Act) and node.target in ("size", "dim"):
            return getattr(args[0].value, node.target)(*args[1:], **kwargs)
        if node.target in _RESHAPE_METHODS and isinstance(args[0], Act):
            out = getattr(args[0].value, node.target)(*args[1:], **kwargs)
            return _reshape_result(b, node.name, args[0], out)
        handler = _METHODS.get(node.target)
    else:
        if not has_act:
            return node.target(*args, **kwargs)
        if node.target is getattr and isinstance(args[0], Act) and args[1] in ("shape", "dtype"):
            return getattr(args[0].value, args[1])
        if node.target in _RESHAPES:
            out = node.target(args[0].value, *args[1:], **kwargs)
            return _reshape_result(b, node.name, args[0], out)
        handler = _FUNCTIONS.get(node.target)
    if handler is None:
        raise _unsupported(_describe(node), node.name)
    return handler(b, node.name, *args, **kwargs)


def _fetch(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _prune(specs: list[NodeSpec], output: str) -> list[NodeSpec]:
    """Keep the ancestors of `output`, in order, ending with it."""
    by_name = {s[0]: s for s in specs}
    needed, stack = set(), [output]
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(by_name[name][2])
    kept = [s for s in specs if s[0] in needed and s[0] != output]
    return [*kept, by_name[output]]


def interpret(gm: fx.GraphModule, example: Tensor) -> list[NodeSpec]:
    """Node specs of `gm` evaluated on `example` (`[batch, *input_shape]`)."""
    b = _Builder(example)
    env: dict[fx.Node, Any] = {}
    result: Any = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if any(isinstance(v, Act) for v in env.values()):
                raise _unsupported("second input", node.name, "networks must have one input")
            env[node] = Act(INPUT, example)
        elif node.op == "get_attr":
            env[node] = _fetch(gm, node.target)
        elif node.op == "output":
            result = fx.node.map_arg(node.args[0], env.__getitem__)
        else:
            args = list(fx.node.map_arg(node.args, env.__getitem__))
            kwargs = dict(fx.node.map_arg(node.kwargs, env.__getitem__))
            env[node] = _call(b, gm, node, args, kwargs)
    if not isinstance(result, Act):
        raise _unsupported("output", "output", "the network must return a single tensor")
    if result.name == INPUT:
        result = b.add("output_identity", ReshapeOp(result.shape, result.shape), [result])
    return _prune(b.specs, result.name)
