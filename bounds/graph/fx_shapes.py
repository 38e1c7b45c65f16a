"""torch.fx -> BoundOp handlers for the exact linear and shape operations: indexing and
slicing, `index_select`, `cat`/`stack`, `split`/`chunk`, `permute`/`transpose`, `expand`,
constant `F.pad`, `sum`/`mean`, `matmul` by a constant on either side, transposed
convolutions, `where` with a constant condition, `F.interpolate` (nearest and linear), float
casts. Used by `bounds.graph.fx_handlers`; each handler gets the builder, the fx node's name and the
call's arguments (activations are `Act`s, everything else is constant).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bounds.graph.fx_common import Act, Builder, affine_const, expand_to, per_sample, reshape_result
from bounds.graph.fx_common import unsupported as _unsupported
from bounds.ops import (
    ConcatOp,
    ConvTransposeOp,
    IndexOp,
    LinearOp,
    MatMulOp,
    PadOp,
    PermuteOp,
    ReduceOp,
    SumOp,
)


def _dim(d: int, ndim: int, what: str, node: str) -> int:
    """`d` normalised for a tensor of `ndim` dims (batch included); never the batch."""
    if not -ndim <= d < ndim:
        raise _unsupported(what, node, f"dimension {d} out of range for {ndim} dims")
    d %= ndim
    if d == 0:
        raise _unsupported(what, node, "acts on the batch dimension")
    return d


# --- selections --------------------------------------------------------------------------------


def _select(b: Builder, name: str, x: Act, axis: int, index: list[int] | Tensor) -> Act:
    """`x.index_select(axis, index)` (axis counts the per-sample dims), or `x` when whole."""
    index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
    if torch.equal(index, torch.arange(x.shape[axis])):
        return x
    return b.add(name, IndexOp(x.shape, axis, index), [x])


def _expand_ellipsis(items: tuple, ndim: int, node: str) -> list:
    consuming = sum(1 for i in items if i is not None and i is not Ellipsis)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise _unsupported("getitem", node, "several Ellipsis")
    out: list = []
    for item in items:
        out += [slice(None)] * (ndim - consuming) if item is Ellipsis else [item]
    return out + [slice(None)] * (ndim - sum(1 for i in out if i is not None))


def getitem(b: Builder, node: str, x: Any, index: Any) -> Any:
    """`x[index]`: slices, integers, None, Ellipsis and one integer list/tensor, applied axis by
    axis as `IndexOp`s; then a reshape (dropped and inserted axes). Tuples (from `split`) are
    indexed directly."""
    if isinstance(x, (tuple, list)):
        return x[index]
    if not isinstance(x, Act):
        raise _unsupported("getitem", node, "index that depends on the input")
    out = x.value[index]
    items = _expand_ellipsis(index if isinstance(index, tuple) else (index,), x.value.dim(), node)
    consumed = [i for i in items if i is not None]
    if not (isinstance(consumed[0], slice) and consumed[0] == slice(None)):
        raise _unsupported("getitem", node, "indexes the batch dimension")
    current, advanced = x, 0
    for axis, item in enumerate(consumed[1:]):
        size = x.shape[axis]
        if isinstance(item, bool) or (isinstance(item, Tensor) and item.dtype == torch.bool):
            raise _unsupported("getitem", node, "boolean mask")
        if isinstance(item, int):
            index = [item % size] if -size <= item < size else None
            if index is None:
                raise _unsupported("getitem", node, f"index {item} out of range")
        elif isinstance(item, slice):
            index = list(range(*item.indices(size)))
        else:
            advanced += 1
            index = torch.as_tensor(item).reshape(-1).long() % size
        current = _select(b, f"{node}_axis{axis + 1}", current, axis, index)
    if advanced > 1:
        raise _unsupported("getitem", node, "several advanced (tensor) indices")
    result = reshape_result(b, node, current, out)
    if not torch.equal(result.value, out):
        raise _unsupported("getitem", node, "index pattern not reproduced exactly")
    return result


def index_select(b: Builder, node: str, x: Act, dim: int, index: Tensor) -> Act:
    if isinstance(index, Act):
        raise _unsupported("index_select", node, "indices that depend on the input")
    axis = _dim(dim, x.value.dim(), "index_select", node) - 1
    return _select(b, node, x, axis, torch.as_tensor(index).long())


def split(b: Builder, node: str, x: Act, size_or_sections: Any, dim: int = 0) -> tuple:
    """`torch.split` / `Tensor.split`: a tuple of slices along `dim`."""
    axis = _dim(dim, x.value.dim(), "split", node) - 1
    pieces = torch.split(x.value, size_or_sections, dim=axis + 1)
    out, start = [], 0
    for k, piece in enumerate(pieces):
        size = piece.shape[axis + 1]
        out.append(_select(b, f"{node}_{k}", x, axis, list(range(start, start + size))))
        start += size
    return tuple(out)


def chunk(b: Builder, node: str, x: Act, chunks: int, dim: int = 0) -> tuple:
    axis = _dim(dim, x.value.dim(), "chunk", node)
    sizes = [p.shape[axis] for p in torch.chunk(x.value, chunks, dim=axis)]
    return split(b, node, x, sizes, dim)


def cat(b: Builder, node: str, tensors: Any, dim: int = 0) -> Act:
    """`torch.cat` of activations and constant blocks (repeating one row over the batch)."""
    tensors = list(tensors)
    acts = [t for t in tensors if isinstance(t, Act)]
    ndim = acts[0].value.dim()
    axis = _dim(dim, ndim, "cat", node) - 1
    parts, inputs = [], []
    for t in tensors:
        if isinstance(t, Act):
            parts.append(len(inputs))
            inputs.append(t)
        else:
            parts.append(per_sample(b.const(t, node), ndim - 1, node))
    try:
        op = ConcatOp([a.shape for a in inputs], axis, parts)
    except ValueError as err:
        raise _unsupported("cat", node, str(err)) from err
    return b.add(node, op, inputs)


def stack(b: Builder, node: str, tensors: Any, dim: int = 0) -> Act:
    tensors = list(tensors)
    ndim = next(t for t in tensors if isinstance(t, Act)).value.dim() + 1
    d = _dim(dim, ndim, "stack", node)
    grown = []
    for k, t in enumerate(tensors):
        if isinstance(t, Act):
            grown.append(reshape_result(b, f"{node}_{k}", t, t.value.unsqueeze(d)))
        else:
            grown.append(torch.as_tensor(t).unsqueeze(d))
    return cat(b, node, grown, d)


# --- permutations and broadcasts ---------------------------------------------------------------


def _permute_act(b: Builder, node: str, x: Act, dims: list[int]) -> Act:
    ndim = x.value.dim()
    dims = [d % ndim for d in dims]
    if sorted(dims) != list(range(ndim)) or dims[0] != 0:
        raise _unsupported("permute", node, f"dims {dims} move the batch dimension")
    perm = tuple(d - 1 for d in dims[1:])
    if perm == tuple(range(len(perm))):
        return x
    return b.add(node, PermuteOp(x.shape, perm), [x])


def permute(b: Builder, node: str, x: Act, *dims: Any) -> Act:
    flat = list(dims[0]) if len(dims) == 1 and not isinstance(dims[0], int) else list(dims)
    return _permute_act(b, node, x, flat)


def transpose(b: Builder, node: str, x: Act, dim0: int, dim1: int) -> Act:
    order = list(range(x.value.dim()))
    d0, d1 = dim0 % len(order), dim1 % len(order)
    order[d0], order[d1] = order[d1], order[d0]
    return _permute_act(b, node, x, order)


def expand(b: Builder, node: str, x: Act, *sizes: Any) -> Act:
    """`Tensor.expand`, `expand_as`, `torch.broadcast_to`: per-sample broadcasts only."""
    if not isinstance(x, Act):  # a constant expanded like an activation: stays a constant
        return x.expand_as(sizes[0].value) if isinstance(sizes[0], Act) else x.expand(*sizes)
    if len(sizes) == 1 and isinstance(sizes[0], Act):
        out = x.value.expand_as(sizes[0].value)
    else:
        flat = sizes[0] if len(sizes) == 1 and not isinstance(sizes[0], int) else sizes
        out = x.value.expand(*flat)
    if out.dim() != x.value.dim() or out.shape[0] != b.batch:
        raise _unsupported("expand", node, f"adds dimensions before the batch ({tuple(out.shape)})")
    return expand_to(b, node, x, tuple(out.shape[1:]))


def broadcast_to(b: Builder, node: str, x: Act, size: Any) -> Act:
    return expand(b, node, x, size)


def pad(b: Builder, node: str, x: Act, pad: Any, mode: str = "constant", value: Any = None) -> Act:
    """`F.pad` in constant mode (negative widths crop); never the batch dimension."""
    if mode != "constant":
        raise _unsupported("pad", node, f"mode={mode!r} (only constant padding is affine here)")
    pad = [int(p) for p in pad]
    k = len(pad) // 2
    if len(pad) % 2 or k > x.value.dim() or (k == x.value.dim() and any(pad[-2:])):
        raise _unsupported("pad", node, f"pad {pad} on {x.value.dim()} dims")
    widths = [(0, 0)] * len(x.shape)
    for j in range(min(k, len(x.shape))):
        widths[len(x.shape) - 1 - j] = (pad[2 * j], pad[2 * j + 1])
    if not any(w for pair in widths for w in pair):
        return x
    try:
        op = PadOp(x.shape, tuple(widths), 0.0 if value is None else float(value), b.dtype)
    except ValueError as err:
        raise _unsupported("pad", node, str(err)) from err
    return b.add(node, op, [x])


def reduce(mean: bool) -> Callable[..., Act]:
    what = "mean" if mean else "sum"

    def handler(b: Builder, node: str, x: Act, dim: Any = None, keepdim: bool = False,
                *, dtype: Any = None, axis: Any = None) -> Act:  # fmt: skip
        dim = axis if dim is None else dim
        if dim is None or (isinstance(dim, (tuple, list)) and not dim):
            raise _unsupported(what, node, "reduces over the batch dimension (give dim=)")
        dims = [dim] if isinstance(dim, int) else list(dim)
        axes = tuple(_dim(d, x.value.dim(), what, node) - 1 for d in dims)
        return b.add(node, ReduceOp(x.shape, axes, bool(keepdim), mean), [x])

    return handler


# --- products by constants, transposed convolutions ----------------------------------------------


def matmul_const(
    b: Builder, node: str, x: Act, weight: Tensor, right: bool, bias: Any = None
) -> Act:
    """`x @ weight` (`right`) or `weight @ x` for a constant vector or matrix."""
    w = b.const(weight, node)
    while w.dim() > 2 and w.shape[0] == 1:
        w = w[0]
    if w.dim() > 2:
        raise _unsupported("matmul", node, f"a constant of shape {tuple(w.shape)} (batched)")
    bias_t = None if bias is None else b.const(bias, node)
    if w.dim() == 1:  # a vector: contract one axis, then drop it
        if bias_t is not None:
            raise _unsupported("matmul", node, "a bias with a vector weight")
        col = w[:, None] if right else w[None, :]
        y = matmul_const(b, f"{node}_vec", x, col, right)
        out = x.value @ w if right else w @ x.value
        return reshape_result(b, node, y, out)
    if len(x.shape) == 1:
        if not right:
            raise _unsupported("matmul", node, "a constant matrix times a per-sample vector "
                               "(it would contract the batch dimension)")  # fmt: skip
        return b.add(node, LinearOp(w.T.contiguous(), bias_t), [x])
    try:
        op = MatMulOp(w, x.shape, right, bias_t)
    except ValueError as err:
        raise _unsupported("matmul", node, str(err)) from err
    return b.add(node, op, [x])


def matmul(b: Builder, node: str, lhs: Any, rhs: Any) -> Act:
    if isinstance(lhs, Act) and isinstance(rhs, Act):
        raise _unsupported("matmul", node, "product of two activations (bounds.graph.fx_nonlinear)")
    if isinstance(lhs, Act):
        return matmul_const(b, node, lhs, rhs, right=True)
    return matmul_const(b, node, rhs, lhs, right=False)


def conv_transpose(
    b: Builder, node: str, x: Act, weight: Any, bias: Any = None, stride: Any = 1,
    padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1,
) -> Act:  # fmt: skip
    """`F.conv_transpose2d` (its argument order: groups before dilation)."""
    if isinstance(weight, Act) or isinstance(bias, Act):
        raise _unsupported("conv_transpose2d", node, "weight or bias depends on the input")
    if len(x.shape) != 3 or getattr(weight, "dim", lambda: 0)() != 4:
        raise _unsupported("conv_transpose2d", node, f"input of shape {x.shape}")
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    bias_t = None if bias is None else b.const(bias, node)
    try:
        op = ConvTransposeOp(b.const(weight, node), bias_t, x.shape, pair(stride), pair(padding),
                             pair(output_padding), pair(dilation), groups)  # fmt: skip
    except ValueError as err:
        raise _unsupported("conv_transpose2d", node, str(err)) from err
    return b.add(node, op, [x])


def conv_transpose_module(b: Builder, node: str, x: Act, mod: nn.ConvTranspose2d) -> Act:
    if mod.padding_mode != "zeros":
        raise _unsupported("ConvTranspose2d", node, f"padding_mode={mod.padding_mode!r}")
    return conv_transpose(b, node, x, mod.weight, mod.bias, mod.stride, mod.padding,
                          mod.output_padding, mod.groups, mod.dilation)  # fmt: skip


# --- where, casts, interpolation ---------------------------------------------------------------


def where(b: Builder, node: str, cond: Any, lhs: Any, rhs: Any) -> Act:
    """`torch.where(cond, lhs, rhs)` with a constant `cond`: `m lhs + (1 - m) rhs`, exact."""
    if isinstance(cond, Act):
        raise _unsupported("where", node, "a condition that depends on the input")
    values = [v.value if isinstance(v, Act) else v for v in (lhs, rhs)]
    out = torch.where(torch.as_tensor(cond), *values)
    if out.dim() < 1 or out.shape[0] != b.batch:
        raise _unsupported(
            "where", node, f"broadcasts over the batch dimension ({tuple(out.shape)})"
        )
    target = tuple(out.shape[1:])
    mask = per_sample(b.const(torch.as_tensor(cond), node), len(target), node)
    branches = [expand_to(b, f"{node}_{k}", v, target) if isinstance(v, Act) else v
                for k, v in enumerate((lhs, rhs))]  # fmt: skip
    left, right = branches
    if not isinstance(right, Act):
        return affine_const(b, node, left, mask, (1 - mask) * b.const(right, node))
    if not isinstance(left, Act):
        return affine_const(b, node, right, 1 - mask, mask * b.const(left, node))
    scaled = [affine_const(b, f"{node}_{k}m", v, m, None)
              for k, (v, m) in enumerate(((left, mask), (right, 1 - mask)))]  # fmt: skip
    return b.add(node, SumOp(target), scaled)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def cast(b: Builder, node: str, x: Act, *args: Any, **kwargs: Any) -> Act:
    """`.float()`, `.double()`, `.to(...)`, `.type(...)` of an activation: the identity when no
    value changes (to the graph's float type or a wider one, or to a device); casts that round
    (to a narrower float type) or leave floats are refused."""
    targets = [v for v in (*args, *kwargs.values()) if isinstance(v, (torch.dtype, str))]
    for v in targets:
        dtype = v if isinstance(v, torch.dtype) else _DTYPE_NAMES.get(v)
        if isinstance(v, str) and dtype is None and not v.startswith(("cpu", "cuda")):
            raise _unsupported("cast", node, f"to {v!r}")
        if dtype is not None and not _exact_cast(b.dtype, dtype):
            raise _unsupported("cast", node, f"{b.dtype} to {dtype} changes values")
    return x


_DTYPE_NAMES = {"torch.float32": torch.float32, "torch.float64": torch.float64,
                "torch.FloatTensor": torch.float32, "torch.DoubleTensor": torch.float64}  # fmt: skip


def _exact_cast(source: torch.dtype, target: torch.dtype) -> bool:
    return target == torch.float64 or (target == torch.float32 and source == torch.float32)


def cast_to(dtype: torch.dtype) -> Callable[..., Act]:
    """`.float()` / `.double()`."""

    def handler(b: Builder, node: str, x: Act, *args: Any, **kwargs: Any) -> Act:
        return cast(b, node, x, dtype)

    return handler


def identity(b: Builder, node: str, x: Act, *args: Any, **kwargs: Any) -> Act:
    return x


def _axis_matrix(n: int, m: int, mode: str, scale: Any, align: Any) -> Tensor:
    """`[m, n]`: torch's 1-D interpolation of `n` samples to `m` (rows of weights)."""
    eye = torch.eye(n, dtype=torch.float64).reshape(1, n, n)
    kwargs = {"size": m} if scale is None else {"scale_factor": scale}
    if mode == "linear":
        kwargs["align_corners"] = bool(align)
    return F.interpolate(eye, mode=mode, **kwargs)[0].T


def interpolate(
    b: Builder, node: str, x: Act, size: Any = None, scale_factor: Any = None,
    mode: str = "nearest", align_corners: Any = None, recompute_scale_factor: Any = None,
    antialias: bool = False,
) -> Act:  # fmt: skip
    """`F.interpolate` in nearest or (bi)linear mode on 1 or 2 spatial axes: an `IndexOp`
    (nearest) or a product by a constant matrix (linear) per axis."""
    out = F.interpolate(x.value, size, scale_factor, mode, align_corners, recompute_scale_factor,
                        antialias)  # fmt: skip
    spatial = len(x.shape) - 1
    linear = mode in ("linear", "bilinear")
    if mode not in ("nearest", "linear", "bilinear") or antialias or spatial not in (1, 2):
        raise _unsupported("interpolate", node, f"mode={mode!r} on {spatial} spatial axes")
    scales = scale_factor if isinstance(scale_factor, (tuple, list)) else [scale_factor] * spatial
    if recompute_scale_factor:
        scales = [None] * spatial
    current = x
    for k in range(spatial):
        n, m = x.shape[1 + k], out.shape[2 + k]
        M = _axis_matrix(n, m, "linear" if linear else "nearest", scales[k], align_corners)
        name = f"{node}_axis{k + 2}"
        if not linear:
            current = _select(b, name, current, 1 + k, M.argmax(1))
        elif k == spatial - 1:
            current = matmul_const(b, name, current, M.T.contiguous(), right=True)
        else:
            current = matmul_const(b, name, current, M, right=False)
    if tuple(current.value.shape) != tuple(out.shape) or not torch.allclose(
        current.value, out, rtol=1e-5, atol=1e-6 * (1 + float(out.abs().max()))
    ):
        raise _unsupported("interpolate", node, "not reproduced by separable axis maps")
    return current


def interpolate_module(b: Builder, node: str, x: Act, mod: nn.Upsample) -> Act:
    return interpolate(b, node, x, mod.size, mod.scale_factor, mod.mode, mod.align_corners,
                       mod.recompute_scale_factor)  # fmt: skip


def pad_module(b: Builder, node: str, x: Act, mod: nn.Module) -> Act:
    return pad(b, node, x, mod.padding, "constant", mod.value)
