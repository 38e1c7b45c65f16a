"""Map torch.fx nodes to BoundOps (used by `bounds.graph.build_graph`).

The fx graph is interpreted on an example batch: every value is either a constant (folded
eagerly: weights, normalisation constants, shapes) or an `Act`, an activation produced by one of
our nodes (`bounds.graph.fx_common`). Each supported call on an activation appends node specs
`(name, op, input names, shape)`; anything else raises UnsupportedOperationError. This file
maps activations, arithmetic and the affine layers; the shape and other linear operations
(indexing, cat, permute, pad, reductions, matmul, transposed convolutions, where,
interpolation, casts) are in `bounds.graph.fx_shapes`, integer indices and embedding lookups in
`bounds.graph.fx_embedding`. Finally, elementwise affine nodes (BatchNorm,
scalings) are folded into the affine op before them (`bounds.ops.compose`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from bounds.errors import InvalidNetworkError
from bounds.graph import fx_activations as activations
from bounds.graph import fx_embedding as embedding
from bounds.graph import fx_nonlinear as products
from bounds.graph import fx_shapes as shapes
from bounds.graph.fx_common import (
    INPUT,
    Act,
    Builder,
    NodeSpec,
    affine_const,
    reshape_result,
    unsupported,
)
from bounds.ops import (
    AdaptiveAvgPoolOp,
    ConvOp,
    LinearOp,
    ReshapeOp,
    SumOp,
    avg_pool_as_conv,
)
from bounds.ops.compose import fold_affine_chains

# --- elementwise arithmetic -------------------------------------------------------------------


def _arith(kind: str) -> Callable[..., Act]:
    def handler(b: Builder, node: str, lhs: Any, rhs: Any, **kwargs: Any) -> Act:
        if kwargs.get("alpha", 1) != 1:
            raise unsupported(kind, node, "alpha != 1")
        if isinstance(lhs, Act) and isinstance(rhs, Act):
            if kind == "mul":
                return products.product(b, node, lhs, rhs)
            if kind == "div":
                return products.quotient(b, node, lhs, rhs)
            return _sum_of_acts(b, node, kind, lhs, rhs)
        if isinstance(lhs, Act):
            if kind == "add":
                return affine_const(b, node, lhs, None, rhs)
            if kind == "sub":
                return affine_const(b, node, lhs, None, -b.const(rhs, node))
            if kind == "mul":
                return affine_const(b, node, lhs, rhs, None)
            return affine_const(b, node, lhs, 1.0 / b.const(rhs, node), None)
        if kind == "add":
            return affine_const(b, node, rhs, None, lhs)
        if kind == "sub":
            return affine_const(b, node, rhs, -1.0, lhs)
        if kind == "mul":
            return affine_const(b, node, rhs, lhs, None)
        return products.constant_over(b, node, lhs, rhs)

    return handler


def _sum_of_acts(b: Builder, node: str, kind: str, lhs: Act, rhs: Act) -> Act:
    """`lhs +- rhs`, both broadcast (per sample) to their common shape first."""
    lhs, rhs = products.common_shape(b, node, kind, lhs, rhs)
    return b.add(node, SumOp(lhs.shape, (1.0, 1.0 if kind == "add" else -1.0)), [lhs, rhs])


def _matmul(b: Builder, node: str, lhs: Any, rhs: Any) -> Act:
    if isinstance(lhs, Act) and isinstance(rhs, Act):
        return products.matmul(b, node, lhs, rhs)
    return shapes.matmul(b, node, lhs, rhs)


def _neg(b: Builder, node: str, x: Act) -> Act:
    return affine_const(b, node, x, -1.0, None)


# --- affine layers ------------------------------------------------------------------------------


def _linear(b: Builder, node: str, x: Act, weight: Any, bias: Any = None) -> Act:
    if isinstance(weight, Act) or isinstance(bias, Act):
        raise InvalidNetworkError(f"node {node!r}: weight or bias depends on the input")
    if len(x.shape) != 1:  # nn.Linear on the last axis of a larger per-sample tensor
        return shapes.matmul_const(b, node, x, b.const(weight, node).T, True, bias)
    bias_t = None if bias is None else b.const(bias, node)
    return b.add(node, LinearOp(b.const(weight, node), bias_t), [x])


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _conv(
    b: Builder,
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
        raise unsupported("conv2d", node, f"input of shape {x.shape}")
    weight = b.const(weight, node)
    kernel, dilation = tuple(weight.shape[2:]), _pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif all(d * (k - 1) % 2 == 0 for d, k in zip(dilation, kernel)):
            padding = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))
        else:
            raise unsupported("conv2d", node, "asymmetric 'same' padding")
    bias_t = None if bias is None else b.const(bias, node)
    op = ConvOp(weight, bias_t, x.shape, _pair(stride), _pair(padding), dilation, groups)
    return b.add(node, op, [x])


def _avg_pool(
    b: Builder,
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
        raise unsupported("avg_pool2d", node, "divisor_override")
    op = avg_pool_as_conv(x.shape, kernel, stride, padding, b.dtype)
    expected = F.avg_pool2d(x.value, kernel, stride, padding, ceil_mode, count_include_pad)
    if tuple(expected.shape[1:]) != op.out_shape:
        raise unsupported("avg_pool2d", node, "ceil_mode changes the output size")
    pooled = b.add(node, op, [x])
    if count_include_pad or not any(padding):
        return pooled
    ones = torch.ones(1, *x.shape, dtype=b.dtype)
    share = F.avg_pool2d(ones, kernel, stride, padding, False, True)[0]
    return affine_const(b, node + "_border", pooled, 1.0 / share, None)


def _adaptive_avg_pool(b: Builder, node: str, x: Act, output_size: Any) -> Act:
    """Adaptive average pooling to any output size (`None`: the input's size on that axis):
    where the output size divides the input's on both axes, the strided average pooling
    (a depthwise convolution); otherwise `AdaptiveAvgPoolOp` (overlapping or repeated
    windows, `bounds.ops.adaptive_pool`)."""
    if len(x.shape) != 3:
        raise unsupported("adaptive_avg_pool2d", node, f"input of shape {x.shape} (need [C, H, W])")
    sizes = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != 2:
        raise unsupported("adaptive_avg_pool2d", node, f"output_size={output_size!r}")
    height, width = x.shape[1:]
    oh, ow = (n if s is None else int(s) for s, n in zip(sizes, (height, width)))
    if min(oh, ow) < 1:
        raise InvalidNetworkError(f"node {node!r}: adaptive pooling to size {(oh, ow)}")
    if height % oh == 0 and width % ow == 0:
        kernel = (height // oh, width // ow)
        return b.add(node, avg_pool_as_conv(x.shape, kernel, kernel, (0, 0), b.dtype), [x])
    return b.add(node, AdaptiveAvgPoolOp(x.shape, (oh, ow), b.dtype), [x])


def _batch_norm(b: Builder, node: str, x: Act, bn: nn.modules.batchnorm._BatchNorm) -> Act:
    if bn.training:
        raise InvalidNetworkError(f"BatchNorm {node!r} is in training mode: call net.eval() first")
    if bn.running_mean is None:
        raise unsupported(type(bn).__name__, node, "no running statistics")
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias
    trailing = (1,) * (len(x.shape) - 1)
    return affine_const(b, node, x, scale.reshape(-1, *trailing), shift.reshape(-1, *trailing))


def _dropout(b: Builder, node: str, x: Act, *args: Any, training: bool = False, **kw: Any) -> Act:
    if training or (len(args) > 1 and args[1]):
        raise InvalidNetworkError(f"dropout {node!r} is in training mode: call net.eval() first")
    return x


# --- dispatch -------------------------------------------------------------------------------


def _call_module(b: Builder, node: str, mod: nn.Module, args: list, kwargs: dict) -> Act:
    x = args[0]
    if isinstance(mod, nn.Linear):
        return _linear(b, node, x, mod.weight, mod.bias)
    if isinstance(mod, nn.Conv2d):
        if mod.padding_mode != "zeros":
            raise unsupported("Conv2d", node, f"padding_mode={mod.padding_mode!r}")
        return _conv(b, node, x, mod.weight, mod.bias, mod.stride, mod.padding, mod.dilation,
                     mod.groups)  # fmt: skip
    act = activations.module_activation(b, node, mod, x)
    if act is not None:
        return act
    if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return _batch_norm(b, node, x, mod)
    if isinstance(mod, nn.MaxPool2d):
        return products.max_pool_module(b, node, x, mod)
    if isinstance(mod, nn.Softmax):
        return products.softmax_module(b, node, x, mod)
    if isinstance(mod, nn.AvgPool2d):
        return _avg_pool(b, node, x, mod.kernel_size, mod.stride, mod.padding, mod.ceil_mode,
                         mod.count_include_pad, mod.divisor_override)  # fmt: skip
    if isinstance(mod, nn.AdaptiveAvgPool2d):
        return _adaptive_avg_pool(b, node, x, mod.output_size)
    if isinstance(mod, (nn.Flatten, nn.Unflatten)):
        return reshape_result(b, node, x, mod(x.value))
    if isinstance(mod, nn.Identity):
        return x
    if isinstance(mod, nn.Dropout):
        return _dropout(b, node, x, training=mod.training)
    if isinstance(mod, nn.ConvTranspose2d):
        return shapes.conv_transpose_module(b, node, x, mod)
    if isinstance(mod, nn.Upsample):
        return shapes.interpolate_module(b, node, x, mod)
    if isinstance(mod, (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d)):
        return shapes.pad_module(b, node, x, mod)
    raise unsupported(type(mod).__name__, node)


_RESHAPES = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze}
_RESHAPE_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous"}

_FUNCTIONS: dict[Any, Callable[..., Act]] = {
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
    F.adaptive_avg_pool2d: _adaptive_avg_pool,
    F.max_pool2d: products.max_pool2d,
    torch.maximum: products.binary("maximum"),
    F.softmax: products.softmax,
    torch.softmax: products.softmax,
    torch.minimum: products.binary("minimum"),
    F.dropout: _dropout,
    operator.getitem: shapes.getitem,
    torch.index_select: shapes.index_select,
    torch.cat: shapes.cat,
    torch.concat: shapes.cat,
    torch.concatenate: shapes.cat,
    torch.stack: shapes.stack,
    torch.split: shapes.split,
    torch.chunk: shapes.chunk,
    torch.permute: shapes.permute,
    torch.transpose: shapes.transpose,
    torch.swapaxes: shapes.transpose,
    torch.broadcast_to: shapes.broadcast_to,
    F.pad: shapes.pad,
    torch.sum: shapes.reduce(mean=False),
    torch.mean: shapes.reduce(mean=True),
    F.conv_transpose2d: shapes.conv_transpose,
    torch.where: shapes.where,
    F.interpolate: shapes.interpolate,
}

_METHODS: dict[str, Callable[..., Act]] = {
    "add": _arith("add"),
    "sub": _arith("sub"),
    "mul": _arith("mul"),
    "div": _arith("div"),
    "neg": _neg,
    "matmul": _matmul,
    "softmax": products.softmax,
    "index_select": shapes.index_select,
    "split": shapes.split,
    "chunk": shapes.chunk,
    "permute": shapes.permute,
    "transpose": shapes.transpose,
    "swapaxes": shapes.transpose,
    "expand": shapes.expand,
    "expand_as": shapes.expand,
    "sum": shapes.reduce(mean=False),
    "mean": shapes.reduce(mean=True),
    "float": shapes.cast_to(torch.float32),
    "double": shapes.cast_to(torch.float64),
    "to": shapes.cast,
    "type": shapes.cast,
    "clone": shapes.identity,
    "detach": shapes.identity,
}


def _describe(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _call(b: Builder, gm: fx.GraphModule, node: fx.Node, args: list, kwargs: dict) -> Any:
    """Evaluate one call node: fold constants, else map it to a BoundOp."""
    flat: list[Any] = []
    fx.node.map_aggregate((args, kwargs), flat.append)
    if embedding.handles(node, flat):  # integer indices and embedding lookups
        return embedding.call(b, gm, node, args, kwargs)
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
            return reshape_result(b, node.name, args[0], out)
        handler = _METHODS.get(node.target) or activations.function_handler(node.target)
    else:
        if not has_act:
            return node.target(*args, **kwargs)
        if (
            node.target is getattr
            and isinstance(args[0], Act)
            and args[1] in ("shape", "dtype", "ndim", "device")
        ):
            return getattr(args[0].value, args[1])
        if node.target in _RESHAPES:
            out = node.target(args[0].value, *args[1:], **kwargs)
            return reshape_result(b, node.name, args[0], out)
        handler = _FUNCTIONS.get(node.target) or activations.function_handler(node.target)
    if handler is None:
        raise unsupported(_describe(node), node.name)
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


_IN_PLACE_FUNCTIONS = {torch.relu_, F.relu_}


def _in_place(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether `node` overwrites its first argument: a module with `inplace=True`
    (`nn.ReLU(inplace=True)`), a call with `inplace=True` (`F.relu(x, inplace=True)`), a
    tensor method ending in `_` (`x.relu_()`) or `torch.relu_`."""
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(node.target), "inplace", False))
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op == "call_function":
        return node.target in _IN_PLACE_FUNCTIONS or bool(node.kwargs.get("inplace"))
    return False


_VIEW_FUNCTIONS = {operator.getitem, torch.flatten, torch.reshape, torch.squeeze,
                   torch.unsqueeze, torch.permute, torch.transpose, torch.swapaxes, torch.narrow,
                   torch.select, torch.broadcast_to}  # fmt: skip
_VIEW_METHODS = {*_RESHAPE_METHODS, "permute", "transpose", "swapaxes", "expand", "expand_as",
                 "narrow", "select", "unflatten", "view_as", "t"}  # fmt: skip


def _is_view(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether `node` may be a view sharing storage with a differently shaped tensor."""
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), (nn.Flatten, nn.Unflatten))
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    return node.op == "call_function" and node.target in _VIEW_FUNCTIONS


def _overwrite(gm: fx.GraphModule, env: dict, node: fx.Node, source: fx.Node) -> None:
    """After the in-place op `node` on `source`, every later reader of the tensor sees the
    result: each fx value that is the same activation (aliases: identities, eval dropout)
    is rebound to it. An in-place op on a view of another tensor would change that tensor
    too, in another shape: refused."""
    old = env[source]
    if _is_view(gm, source):
        raise unsupported(_describe(node), node.name, "an in-place operation on a view")
    for key, value in env.items():
        if value is old:
            env[key] = env[node]


def interpret(gm: fx.GraphModule, example: Tensor) -> list[NodeSpec]:
    """Node specs of `gm` evaluated on `example` (`[batch, *input_shape]`)."""
    b = Builder(example)
    env: dict[fx.Node, Any] = {}
    result: Any = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if any(isinstance(v, Act) for v in env.values()):
                raise unsupported("second input", node.name, "networks must have one input")
            env[node] = Act(INPUT, example)
        elif node.op == "get_attr":
            env[node] = _fetch(gm, node.target)
        elif node.op == "output":
            result = fx.node.map_arg(node.args[0], env.__getitem__)
        else:
            args = list(fx.node.map_arg(node.args, env.__getitem__))
            kwargs = dict(fx.node.map_arg(node.kwargs, env.__getitem__))
            env[node] = _call(b, gm, node, args, kwargs)
            source = node.args[0] if node.args else None
            if _in_place(gm, node) and isinstance(source, fx.Node) and isinstance(env[node], Act):
                _overwrite(gm, env, node, source)
    if not isinstance(result, Act):
        raise unsupported("output", "output", "the network must return a single tensor")
    if result.name == INPUT:
        result = b.add("output_identity", ReshapeOp(result.shape, result.shape), [result])
    return fold_affine_chains(_prune(b.specs, result.name))
