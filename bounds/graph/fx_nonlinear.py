"""Nonlinear operations of several activations in torch.fx (used by `bounds.graph.fx_handlers`):
products (`x * y`, `x @ y`), quotients, elementwise max/min and max pooling.

- `x * y`: both broadcast to their common shape, then a `MultiActivationOp` with the McCormick
  relaxation (`relaxations/product.py`); `x * x` (the same node) is the square `pow(x, 2)`.
- `x @ y`: `x[..., n, k, None] * y[..., None, k, m]` summed over `k` (an elementwise product
  and a ReduceOp: exact rewriting).
- `x / y`: `x * reciprocal(y)`; `c / x` for a constant `c`: `c * reciprocal(x)`.
- `max(x, y) = y + relu(x - y)` and `min(x, y) = x - relu(x - y)` (exact), and max pooling as
  a balanced tree of such maxima over the window's strided slices (`IndexOp`s); padding is
  `-inf` (left out of the windows).
- `softmax(x)_i = 1 / (1 + sum_{j != i} exp(x_j - x_i))` (exact): the `n - 1` differences
  `y_k = x_{(i + k) mod n} - x_i` are affine (a rotation `IndexOp` and a `SumOp` each), and
  `relaxations/softmax.py` relaxes the function of them, sound for any range of the logits
  (the `j = i` term is the exact constant 1, and an overflowing `exp` gives the limit, not
  `inf`). Its last input is `P = sum_k min(exp(y_k), B)` (the `clipped_exp` relaxation: finite
  lines on any box), used for its bounds only: CROWN bounds `P` through the input as it bounded
  the sum of exps of the exp/sum/reciprocal composition, so the denominator's range is as tight
  as there. Two entries: `softmax(x)_i = sigmoid(x_i - x_{i+1})`; one entry: the constant 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bounds.graph import fx_shapes as shapes
from bounds.graph.fx_activations import activation
from bounds.graph.fx_common import (
    Act,
    Builder,
    affine_const,
    expand_to,
    reshape_result,
    unsupported,
)
from bounds.ops import IndexOp, MultiActivationOp, SumOp
from relaxations import get_relaxation
from relaxations.base import broadcast_shape


def common_shape(b: Builder, node: str, what: str, lhs: Act, rhs: Act) -> tuple[Act, Act]:
    """Both broadcast (per sample) to their common shape (`relaxations.base.broadcast_shape`)."""
    try:
        out = broadcast_shape(lhs.value.shape, rhs.value.shape)
    except ValueError as err:
        raise unsupported(what, node, f"broadcast of {lhs.shape} and {rhs.shape}") from err
    if len(out) != lhs.value.dim() or len(out) != rhs.value.dim():
        raise unsupported(what, node, f"broadcast of {lhs.shape} and {rhs.shape} over the batch")
    target = tuple(out[1:])
    return expand_to(b, f"{node}_0", lhs, target), expand_to(b, f"{node}_1", rhs, target)


def product(b: Builder, node: str, lhs: Act, rhs: Act) -> Act:
    """`lhs * rhs` of two activations."""
    if lhs.name == rhs.name:
        return activation(b, node, "pow", lhs, {"exponent": 2})
    lhs, rhs = common_shape(b, node, "mul", lhs, rhs)
    try:
        relaxation = get_relaxation("product")
    except KeyError as exc:
        raise unsupported("mul", node, str(exc)) from exc
    return b.add(node, MultiActivationOp(relaxation, lhs.shape), [lhs, rhs])


def quotient(b: Builder, node: str, lhs: Act, rhs: Act) -> Act:
    """`lhs / rhs` of two activations: `lhs * reciprocal(rhs)`."""
    inverse = activation(b, f"{node}_reciprocal", "reciprocal", rhs)
    return product(b, node, lhs, inverse)


def constant_over(b: Builder, node: str, numerator: Any, x: Act) -> Act:
    """`c / x` for a constant `c`: `c * reciprocal(x)`."""
    inverse = activation(b, f"{node}_reciprocal", "reciprocal", x)
    return affine_const(b, node, inverse, numerator, None)


def _unsqueezed(b: Builder, node: str, x: Act, dim: int) -> Act:
    return reshape_result(b, node, x, x.value.unsqueeze(dim))


def matmul(b: Builder, node: str, lhs: Act, rhs: Act) -> Act:
    """`lhs @ rhs` of two activations with at least two per-sample axes each (`[..., n, k]` @
    `[..., k, m]`): an elementwise product over `[..., n, k, m]` summed over `k`."""
    if len(lhs.shape) < 2 or len(rhs.shape) < 2:
        raise unsupported("matmul", node, f"of activations {lhs.shape} and {rhs.shape} "
                          "(each needs two axes besides the batch)")  # fmt: skip
    if lhs.shape[-1] != rhs.shape[-2]:
        raise unsupported("matmul", node, f"inner sizes differ: {lhs.shape} @ {rhs.shape}")
    left = _unsqueezed(b, f"{node}_left", lhs, -1)  # [..., n, k, 1]
    right = _unsqueezed(b, f"{node}_right", rhs, -3)  # [..., 1, k, m]
    prod = product(b, f"{node}_product", left, right)
    return shapes.reduce(mean=False)(b, node, prod, -2)


def maximum(b: Builder, node: str, lhs: Act, rhs: Act, minimum: bool = False) -> Act:
    """`max(lhs, rhs) = rhs + relu(lhs - rhs)` (`minimum`: `lhs - relu(lhs - rhs)`)."""
    lhs, rhs = common_shape(b, node, "min" if minimum else "max", lhs, rhs)
    diff = b.add(f"{node}_diff", SumOp(lhs.shape, (1.0, -1.0)), [lhs, rhs])
    hinge = activation(b, f"{node}_relu", "relu", diff)
    if minimum:
        return b.add(node, SumOp(lhs.shape, (1.0, -1.0)), [lhs, hinge])
    return b.add(node, SumOp(lhs.shape, (1.0, 1.0)), [rhs, hinge])


def _pair(value: Any, what: str, node: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return int(value[0]), int(value[1])
    raise unsupported("max_pool2d", node, f"{what}={value!r}")


def _window_index(size: int, out: int, k: int, stride: int, pad: int, dilation: int, i: int):
    """Input index along one axis of offset `i` of every output position's window, with each
    padded position (outside `[0, size)`) replaced by a position of the same window that is
    inside (max of a window is unchanged by repeating one of its elements: padding with
    `-inf`); None when some window has no position inside."""
    index = []
    for p in range(out):
        start = p * stride - pad
        inside = [start + j * dilation for j in range(k) if 0 <= start + j * dilation < size]
        if not inside:
            return None
        at = start + i * dilation
        index.append(at if 0 <= at < size else inside[0])
    return index


def max_pool2d(
    b: Builder, node: str, x: Act, kernel_size: Any, stride: Any = None, padding: Any = 0,
    dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False,
) -> Act:  # fmt: skip
    """Max pooling over `[C, H, W]`: for each kernel offset, the inputs it meets in every
    window (`IndexOp`s per axis), then a balanced tree of pairwise maxima. Padding (and the
    windows past the end in ceil mode) count as `-inf`, as in torch: a padded position never
    wins, so it is left out of its window (`_window_index`)."""
    if len(x.shape) != 3:
        raise unsupported("max_pool2d", node, f"input of shape {x.shape} (need [C, H, W])")
    kh, kw = _pair(kernel_size, "kernel_size", node)
    sh, sw = _pair(stride if stride not in (None, []) else (kh, kw), "stride", node)
    dh, dw = _pair(dilation, "dilation", node)
    ph, pw = _pair(padding, "padding", node)
    if return_indices:
        raise unsupported("max_pool2d", node, "return_indices")
    try:
        out: Tensor = torch.nn.functional.max_pool2d(
            x.value, (kh, kw), (sh, sw), (ph, pw), (dh, dw), bool(ceil_mode)
        )
    except RuntimeError as err:
        raise unsupported("max_pool2d", node, str(err).splitlines()[0]) from err
    (_, height, width), (oh, ow) = x.shape, out.shape[-2:]
    slices = []
    for i in range(kh):
        rows = _window_index(height, oh, kh, sh, ph, dh, i)
        for j in range(kw):
            cols = _window_index(width, ow, kw, sw, pw, dw, j)
            if rows is None or cols is None:
                raise unsupported("max_pool2d", node, "a window lies wholly in the padding")
            picked = b.add(f"{node}_window{i}_{j}_rows", IndexOp(x.shape, 1, rows), [x])
            slices.append(b.add(f"{node}_window{i}_{j}", IndexOp(picked.shape, 2, cols), [picked]))
    level = 0
    while len(slices) > 1:
        pairs = [(slices[k], slices[k + 1]) for k in range(0, len(slices) - 1, 2)]
        merged = [
            maximum(b, f"{node}_max{level}_{k}" if len(slices) > 2 else node, a, c)
            for k, (a, c) in enumerate(pairs)
        ]
        slices = merged + ([slices[-1]] if len(slices) % 2 else [])
        level += 1
    return slices[0]


def max_pool_module(b: Builder, node: str, x: Act, module: torch.nn.MaxPool2d) -> Act:
    return max_pool2d(b, node, x, module.kernel_size, module.stride, module.padding,
                      module.dilation, module.ceil_mode, module.return_indices)  # fmt: skip


def binary(kind: str) -> Callable[..., Act]:
    """fx handler for `torch.maximum` / `torch.minimum` of two activations."""

    def handler(b: Builder, node: str, lhs: Any, rhs: Any) -> Act:
        if isinstance(lhs, Act) and isinstance(rhs, Act):
            return maximum(b, node, lhs, rhs, minimum=kind == "minimum")
        x, c = (lhs, rhs) if isinstance(lhs, Act) else (rhs, lhs)
        if not isinstance(x, Act):
            raise unsupported(kind, node, "needs an operand that depends on the input")
        return _with_constant(b, node, x, b.const(c, node), kind == "minimum")

    return handler


def _with_constant(b: Builder, node: str, x: Act, c: Tensor, minimum: bool) -> Act:
    """`max(x, c) = c + relu(x - c)`, `min(x, c) = c - relu(c - x)` (c broadcast)."""
    sign = -1.0 if minimum else 1.0
    shifted = affine_const(b, f"{node}_shift", x, sign, -sign * c)  # sign (x - c)
    hinge = activation(b, f"{node}_relu", "relu", shifted)
    return affine_const(b, node, hinge, sign, c)


def softmax(b: Builder, node: str, x: Any, dim: Any = None, *args: Any, **kwargs: Any) -> Act:
    """`softmax(x, dim)` over one per-sample axis (see the module docstring)."""
    kwargs.pop("_stacklevel", None)
    dtype = kwargs.pop("dtype", None)
    if not isinstance(x, Act) or dim is None or args or kwargs or dtype is not None:
        raise unsupported("softmax", node, "needs an activation, an explicit dim and no dtype")
    ndim = x.value.dim()
    axis = dim + ndim if dim < 0 else dim
    if not 1 <= axis < ndim:
        raise unsupported("softmax", node, f"dim={dim} (the batch axis, or out of range)")
    n = x.shape[axis - 1]
    if n == 1:
        return affine_const(b, node, x, 0.0, 1.0)
    diffs = []
    for k in range(1, n):
        rotation = [(i + k) % n for i in range(n)]
        rolled = b.add(f"{node}_x{k}", IndexOp(x.shape, axis - 1, rotation), [x])
        pair = [x, rolled] if n == 2 else [rolled, x]  # n = 2: x_i - x_{i+1}, for sigmoid
        diffs.append(b.add(f"{node}_diff{k}", SumOp(x.shape, (1.0, -1.0)), pair))
    if n == 2:
        return activation(b, node, "sigmoid", diffs[0])
    clipped = [activation(b, f"{node}_exp{k + 1}", "clipped_exp", d) for k, d in enumerate(diffs)]
    total = clipped[0]
    for k, term in enumerate(clipped[1:]):
        total = b.add(f"{node}_sum{k + 2}", SumOp(x.shape, (1.0, 1.0)), [total, term])
    try:
        relaxation = get_relaxation("softmax", terms=n - 1)
    except (KeyError, ValueError) as exc:
        raise unsupported("softmax", node, str(exc)) from exc
    return b.add(node, MultiActivationOp(relaxation, x.shape), [*diffs, total])


def softmax_module(b: Builder, node: str, x: Act, module: torch.nn.Softmax) -> Act:
    return softmax(b, node, x, module.dim)
