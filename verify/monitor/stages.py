"""The pieces of a checksum of `verify.monitor.sums`, stage by stage (all in float64): the
layer (`nn.Linear`, `nn.Conv2d`), a BatchNorm of its output, an average pooling of its input.

A checksum reads `y`, the output of the last stage, and `x`, the input of the first, and holds

    1^T y = c^T x + d,    |fl(y)_i - y_i| <= g (|L| |x|)_i + e_i

for the whole chain's linear map `L` and constant `b` (`d = 1^T b`), with a relative error
`g` and an absolute one `e` (`E = 1^T e`) of the chain's float evaluation. The stages:

- the layer `y = L x + b0` scaled per output channel by `s` (1 without a BatchNorm):
  `c = L^T s`, `a = |L|^T |s|`, `b = s b0` (the bias repeated over the positions of a
  convolution's output); its own rounding `gamma_{n_c + 1} (|L| |x| + |b0|)` per element
  (`n_c` products and the bias; Higham, Accuracy and Stability of Numerical Algorithms, 2nd
  ed., Sec. 3.1): `g = gamma_{n_c + 1}`, `E = g 1^T |b|`;
- a BatchNorm in eval mode after it, `z = s (y - mean) + beta`, `s = w / sqrt(var + eps)`:
  `b = s b0 + shift`, `shift = beta - s mean` per channel (its magnitude `B = 1^T |b|` after
  any cancellation). The module evaluates it from its float parameters, in whatever order
  (`y alpha + (beta - mean alpha)` with `alpha = w / sqrt(var + eps)` as ATen's CPU kernel
  does, `(y - mean) / sqrt(var + eps) w + beta`, or cuDNN's), in at most `BN_ROUNDINGS`
  roundings per element, each of relative error at most `u` (an approximate reciprocal
  square root counts as two): `|fl(z) - z| <= gamma_{BN_ROUNDINGS} (|s| |fl(y)| + |s mean| +
  |beta|)` (Higham, Lemma 3.3), so `g' = g + beta + g beta` and `E' = (1 + beta) E + beta
  (1^T |s b0| + 1^T (|beta| + |s mean|))` (`beta` = that gamma; `_chain`);
- an average pooling before it, `x' = P x` (`P >= 0`, windows of at most `k` elements, a sum
  and at most two divisions): `c = P^T c`, `a = P^T a` (still `>= |c|`), `g' = g_p + g + g_p
  g` with `g_p = gamma_{k + 2}`: `|fl(y) - (L P x + b)| <= |L| g_p P |x| + g ((1 + g_p) |L| P
  |x|) + e`, and `|L| P` is what `a` is built from (`P >= 0`).

So the chain meets the tolerance of `verify.monitor.sums` with `g` in place of the single
layer's `gamma_{n_c + 1}` and `E` for its constant's rounding. `Sums.folded` counts the
float64 terms (and roundings) of each entry of `c`, `a` and `d`; `products` the roundings
that may underflow (each within `2^-126` absolute beyond the relative model).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from bounds.errors import UnsupportedOperationError
from bounds.ops import ConvOp, LinearOp

# Roundings of one element of a BatchNorm in eval mode, from its float parameters (module
# docstring): eps cast to the dtype, var + eps, the square root and the reciprocal (an
# approximate rsqrt: 2), the weight, mean * alpha, beta - mean * alpha, x * alpha and the add:
# 10 at most; 16 leaves room for other evaluation orders.
BN_ROUNDINGS = 16


def gamma(n: int, unit: float) -> float:
    """`gamma_n = n u / (1 - n u)` (Higham, Sec. 3.1); UnsupportedOperationError once `n u >=
    1/2`, where the error model no longer bounds anything useful."""
    if n * unit >= 0.5:
        raise UnsupportedOperationError("float error model", "", f"{n} terms exceed 1/(2u)")
    return n * unit / (1 - n * unit)


@dataclass(frozen=True)
class Sums:
    """The float64 pieces of one checksum (module docstring): `c`, `a` (over the flattened
    values the check reads), `d`; `bias` (`B = 1^T |b|`, the exact constant of the chain, after
    any cancellation), `slack` (`E`: the float evaluation of `y` errs by at most `g (|L| |x|)_i
    + e_i` per element, `E = 1^T e`), `error` (`g`), `d_terms` (the sum of the magnitudes of
    the terms of `d`, for its float64 rounding), `products`, `outputs` (`M`, the elements of
    `y`), `terms` (`n_c`, the products of one element of the layer's output) and `folded`
    (`r`)."""

    c: Tensor
    a: Tensor
    d: float
    bias: float
    slack: float
    error: float
    d_terms: float
    products: int
    outputs: int
    terms: int
    folded: int


# A BatchNorm's `(s, shift, magnitude)` per channel (`batch_norm_affine`).
Affine = tuple[Tensor, Tensor, Tensor]


def compose(first: float, second: float) -> float:
    """The relative error of two stages in sequence (module docstring)."""
    return first + second + first * second


def linear_sums(module: nn.Module, op: LinearOp, shape, affine: Affine | None,
                unit: float) -> Sums | None:  # fmt: skip
    """The pieces of an `nn.Linear` computing `op` (exactly its weights), followed by the
    BatchNorm `affine` (`batch_norm_affine`; None: none), or None."""
    if (
        type(module) is not nn.Linear
        or module.weight.shape != op.weight.shape
        or tuple(shape) != (op.weight.shape[0],)
    ):
        return None
    w64 = op.weight.double()
    b64 = _bias64(op.bias, w64.shape[0], w64)
    if not _same(module, w64, b64):
        return None
    m, n = w64.shape
    s = torch.ones(m, dtype=torch.float64) if affine is None else affine[0]
    return _chain(s @ w64, s.abs() @ w64.abs(), b64, affine, gamma(n + 1, unit), unit,
                  (m * n, m, n, m))  # fmt: skip


def conv_sums(module: nn.Module, op: ConvOp, shape, affine: Affine | None,
              unit: float) -> Sums | None:  # fmt: skip
    """The pieces of an `nn.Conv2d` computing `op` (exactly its weights and geometry),
    followed by the BatchNorm `affine` (None: none), or None: `c = L^T s` and `a = |L|^T |s|`
    are the adjoints of the convolution and of its absolute kernel applied to an output
    holding `s` per channel (input-shaped, flattened)."""
    if (
        type(module) is not nn.Conv2d
        or module.padding_mode != "zeros"
        or isinstance(module.padding, str)
        or module.weight.shape != op.weight.shape
        or tuple(module.stride) != tuple(op.stride)
        or tuple(module.padding) != tuple(op.padding)
        or tuple(module.dilation) != tuple(op.dilation)
        or module.groups != op.groups
        or tuple(shape) != tuple(op.out_shape)
    ):
        return None
    w64 = op.weight.double()
    b64 = _bias64(op.bias, w64.shape[0], w64)
    if not _same(module, w64, b64):
        return None
    s = torch.ones(w64.shape[0], dtype=torch.float64) if affine is None else affine[0]
    out = s.reshape(1, -1, 1, 1).expand(1, *op.out_shape)
    signed = ConvOp(w64, None, op.in_shape, op.stride, op.padding, op.dilation, op.groups)
    size = ConvOp(w64.abs(), None, op.in_shape, op.stride, op.padding, op.dilation, op.groups)
    c, a = signed.adjoint(out).reshape(-1), size.adjoint(out.abs()).reshape(-1)
    outputs = int(torch.Size(op.out_shape).numel())
    terms = int(w64[0].numel())  # (C_in / groups) kh kw products per output element
    folded = max(int(w64.shape[0]) * int(w64[0, 0].numel()), outputs)
    positions = outputs // int(w64.shape[0])
    return _chain(c, a, b64, affine, gamma(terms + 1, unit), unit,
                  (outputs * terms, outputs, terms, folded), positions)  # fmt: skip


def _chain(c: Tensor, a: Tensor, b0: Tensor, affine: Affine | None, error: float, unit: float,
           counts: tuple[int, int, int, int], positions: int = 1) -> Sums:  # fmt: skip
    """The pieces of a layer with bias `b0` (per channel, repeated over `positions`) and
    `(products, outputs, terms, folded)` = `counts`, its own rounding `error (|L| |x| +
    |b0|)` per element, and of the BatchNorm `affine` after it (module docstring): per element
    `|fl(z) - z| <= |fl(y) - y| + beta (|fl(y)| + |beta_c| + |s_c mean_c|)`, so `g' = g + beta
    + g beta`, `E' = (1 + beta) E + beta (1^T |s b0| + 1^T magnitude)`, the exact constant
    `s b0 + shift` (its magnitude after any cancellation), `beta = gamma_BN_ROUNDINGS`."""
    products, outputs, terms, folded = counts
    if affine is None:
        layer = float(b0.abs().sum()) * positions
        return Sums(c, a, float(b0.sum()) * positions, layer, error * layer, error, layer,
                    products, outputs, terms, folded)  # fmt: skip
    s, shift, magnitude = affine
    layer = float((s * b0).abs().sum()) * positions  # |s b0|, the scaled layer bias
    spread = float(magnitude.sum()) * positions
    exact = s * b0 + shift
    beta = gamma(BN_ROUNDINGS, unit)
    return Sums(c, a, float(exact.sum()) * positions, float(exact.abs().sum()) * positions,
                (1 + beta) * error * layer + beta * (layer + spread), compose(error, beta),
                layer + spread, products + BN_ROUNDINGS * outputs, outputs, terms,
                folded + 8)  # fmt: skip


def _bias64(bias: Tensor | None, rows: int, like: Tensor) -> Tensor:
    return bias.double() if bias is not None else like.new_zeros(rows)


def _same(module: nn.Module, w64: Tensor, b64: Tensor) -> bool:
    """Whether the module holds the bound graph's weights (exactly)."""
    own = module.bias if module.bias is not None else torch.zeros_like(b64)
    return torch.equal(module.weight.detach().double(), w64) and torch.equal(
        own.detach().double(), b64
    )


def batch_norm_affine(bn: nn.Module, channels: int, dtype: torch.dtype) -> Affine | None:
    """`(s, shift, magnitude)` per channel (float64) of a BatchNorm in eval mode: `z = s y +
    shift`, `shift = beta - s mean`, `magnitude = |beta| + |s mean|`; None when it is not one
    of `channels` channels with running statistics, or a scale is non-zero but so small that
    its rounding in `dtype` could underflow (the relative error model would not hold)."""
    if (
        not isinstance(bn, (nn.BatchNorm1d, nn.BatchNorm2d))
        or bn.training
        or bn.running_mean is None
        or bn.running_var is None
        or bn.num_features != channels
    ):
        return None
    mean, var = bn.running_mean.double(), bn.running_var.double()
    s = 1 / torch.sqrt(var + bn.eps)
    if bn.weight is not None:
        s = s * bn.weight.detach().double()
    beta = bn.bias.detach().double() if bn.bias is not None else torch.zeros_like(s)
    smallest = torch.finfo(dtype).tiny * 2.0**24
    if not bool(torch.isfinite(s).all()) or bool(((s != 0) & (s.abs() < smallest)).any()):
        return None
    return s, beta - s * mean, beta.abs() + (s * mean).abs()


def pool_window(module: nn.Module, in_shape, out_shape) -> int | None:
    """The most elements one output of an average pooling reads (`k`), or None for a pooling
    that is not an average with a positive divisor."""
    if isinstance(module, nn.AvgPool2d):
        if module.divisor_override is not None and module.divisor_override <= 0:
            return None
        kh, kw = _pair(module.kernel_size)
        return kh * kw
    if isinstance(module, nn.AdaptiveAvgPool2d):  # windows [floor(i H / o), ceil((i+1) H / o))
        (h, w), (oh, ow) = in_shape[-2:], out_shape[-2:]
        return (-(-h // oh) + 1) * (-(-w // ow) + 1)
    return None


def through_pool(layer: Sums, module: nn.Module, in_shape, unit: float) -> Sums | None:
    """The pieces of an average pooling `module` of inputs `[*in_shape]` followed by `layer`
    (which reads its output, flattened), or None: `c` and `a` mapped back by the pooling's
    adjoint, computed by differentiating the module itself in float64 (its own windows,
    padding and divisor)."""
    x = torch.zeros(2, *in_shape, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        pooled = module.forward(x)  # no hooks: the pooling as written
        k = pool_window(module, in_shape, pooled.shape[1:])
        if k is None or pooled[0].numel() != layer.c.numel():
            return None
        both = torch.stack([layer.c, layer.a]).reshape(pooled.shape)
        (grad,) = torch.autograd.grad(pooled, x, both)
    c, a = grad.detach().reshape(2, -1)
    return replace(layer, c=c, a=a, error=compose(gamma(k + 2, unit), layer.error),
                   products=layer.products + int(c.numel()),
                   folded=layer.folded + k + 2)  # fmt: skip


__all__ = ["BN_ROUNDINGS", "Affine", "Sums", "batch_norm_affine", "compose", "conv_sums",
           "gamma", "linear_sums", "pool_window", "through_pool"]  # fmt: skip
