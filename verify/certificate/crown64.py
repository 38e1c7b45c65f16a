"""The checker's own IBP and CROWN (Zhang et al. 2018) on a chain of affine layers and ReLUs, in
float64 with outward rounding (`arith`): every number returned is a sound bound of the exact
real value.

A network is `layers`: `(W [n_j, n_{j-1}], c [n_j], relu)` with `v_j = W_j h_{j-1} + c_j`,
`h_0 = x`, `h_j = relu(v_j)` when `relu` else `v_j`.

Backward pass (`backward`), for a row block `A` over `v_k` (lower bound of `A v_k`): going down,
`A v_j = A c_j + (A W_j) h_{j-1}`; `fl(A W_j)` errs by at most `err` (T2), so the exact value is
at least `A c_j + fl(A W_j) h_{j-1} - err |h_{j-1}|max`. Through a ReLU, any `D` gives
`A relu(v) >= D v + e` (T3, `relu_residual`); CROWN's choice: `D = A` (active), `0`
(inactive), and for an unstable neuron `alpha A` where `A >= 0` (the lower line, slope alpha in
[0, 1]) and `s A` where `A < 0` (the upper line, `s = u / (u - l)`). At the input,
`min_{x in box} A x = A+ l + A- u`, rounded down.

Intermediate bounds (`intervals`): per layer, IBP from the previous bounds intersected with
CROWN's bounds of every neuron (rows `I` and `-I`), the earlier ReLUs at CROWN's adaptive lower
slope (1 where `u >= -l`, else 0). The final objective is bounded with the slopes given
(`alphas`, the certificate's) at the unstable ReLUs."""

from __future__ import annotations

import numpy as np

from verify.certificate.arith import (
    adaptive_alpha,
    add_lo,
    affine_interval,
    matmul_err,
    matmul_lo,
    relu_residual,
    sum_lo,
    unstable_slopes,
)

Layer = tuple[np.ndarray, np.ndarray, bool]
Bounds = list[tuple[np.ndarray, np.ndarray]]


def magnitude(lower: np.ndarray, upper: np.ndarray, relu: bool) -> np.ndarray:
    """An upper bound of `|h|` for `h = relu(v)` (when `relu`) or `h = v`, v in [lower, upper]."""
    if relu:
        return np.maximum(upper, 0.0)
    return np.maximum(np.abs(lower), np.abs(upper))


def relu_step(
    a: np.ndarray, alpha: np.ndarray, lower: np.ndarray, upper: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`(D, lower bound of sum_i e_i)` for `A relu(v) >= D v + e` on [lower, upper] (T3)."""
    s = unstable_slopes(lower, upper)
    unstable = (lower < 0) & (upper > 0)
    relaxed = np.where(a >= 0, a * alpha, a * s)
    d = np.where(upper <= 0, 0.0, np.where(lower >= 0, a, np.where(unstable, relaxed, a)))
    return d, sum_lo(relu_residual(a, d, lower, upper))


def backward(
    layers: list[Layer], bounds: Bounds, box: tuple[np.ndarray, np.ndarray], a: np.ndarray,
    k: int, alphas: dict[int, np.ndarray],
) -> np.ndarray:  # fmt: skip
    """Lower bounds `[m]` of `a v_k` (`a [m, n_k]`, layers numbered from 1) over the box:
    `bounds[j]` are v_j's intervals (j < k used), `alphas[j]` ReLU j's lower slopes (default:
    adaptive)."""
    const = np.zeros(a.shape[0])
    for j in range(k, 0, -1):
        w, c, _ = layers[j - 1]
        const = add_lo(const, matmul_lo(a, c))
        a, err = matmul_err(a, w)
        below_relu = j > 1 and layers[j - 2][2]
        low, high = bounds[j - 2] if j > 1 else box
        const = add_lo(const, matmul_lo(-err, magnitude(low, high, below_relu)))
        if below_relu:
            alpha = alphas.get(j - 1)
            alpha = adaptive_alpha(low, high) if alpha is None else alpha
            a, residual = relu_step(a, alpha, low, high)
            const = add_lo(const, residual)
    pos, neg = np.maximum(a, 0), np.minimum(a, 0)
    return add_lo(const, matmul_lo(pos, box[0]), matmul_lo(neg, box[1]))


def intervals(layers: list[Layer], box: tuple[np.ndarray, np.ndarray]) -> Bounds:
    """Sound intervals of every `v_j` (module docstring): IBP intersected with CROWN."""
    out: Bounds = []
    for k, (w, c, _) in enumerate(layers, start=1):
        prev = out[-1] if out else box
        below_relu = k > 1 and layers[k - 2][2]
        low, high = (np.maximum(prev[0], 0), np.maximum(prev[1], 0)) if below_relu else prev
        lo, hi = affine_interval(w, c, low, high)
        if k > 1:  # the rows I and -I in one pass: lower and upper bounds
            eye = np.eye(w.shape[0])
            both = backward(layers, out, box, np.concatenate([eye, -eye]), k, {})
            lo, hi = np.maximum(lo, both[: len(eye)]), np.minimum(hi, -both[len(eye) :])
        out.append((lo, hi))
    return out


def point_interval(layers: list[Layer], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sound bounds of the network's exact output at the point `x` (IBP on `[x, x]`)."""
    low, high = x, x
    for w, c, relu in layers:
        low, high = affine_interval(w, c, low, high)
        if relu:
            low, high = np.maximum(low, 0), np.maximum(high, 0)
    return low, high
