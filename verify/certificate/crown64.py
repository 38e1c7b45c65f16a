"""The checker's own IBP and CROWN (Zhang et al. 2018), batched over K boxes, in float64 with
outward rounding (`arith`): every number returned is a sound bound of the exact real value.

A network is `layers`: `(W [n_j, n_{j-1}], c [n_j], relu)` with `v_j = W_j h_{j-1} + c_j`,
`h_0 = x`, `h_j = relu(v_j)` when `relu` else `v_j` (a last layer may be per box: `W [K, ..]`,
`c [K, ..]`). Boxes, intervals and slopes carry the batch first: `[K, n]`.

Backward pass (`backward`), for a row block `A [K, m, n_k]` over `v_k` (lower bound of
`A v_k`): going down, `A v_j = A c_j + (A W_j) h_{j-1}`; `fl(A W_j)` errs, summed against
`|h_{j-1}|`, by at most `product_slack` (T2). Through a ReLU, any `D` gives
`A relu(v) + G v >= D v + e` (T3, `relu_residual`): CROWN's choice is `D = A` (active), `0`
(inactive), and for an unstable neuron `alpha A` where `A >= 0` (the lower line, slope alpha in
[0, 1]) and `s A` where `A < 0` (the upper line, `s = u / (u - l)`), plus `G` (`betas`: a
Lagrangian term `G v <= 0` that the caller proves on the domain). A neuron stable in every box
with `G = 0` has `A relu(v) - D v = 0` exactly, so its residual is only computed where some box
has it unstable or `G != 0`. At the input, `min_{x in box} A x = A+ l + A- u`, rounded down.

Intermediate bounds (`intervals`): per layer, IBP from the previous bounds intersected with
CROWN's bounds of every neuron (rows `I` and `-I`; every neuron, IBP-stable ones too: their
tighter bounds tighten the next layer's IBP), the earlier ReLUs at CROWN's adaptive lower slope
(1 where `u >= -l`, else 0)."""

from __future__ import annotations

import numpy as np

from verify.certificate.arith import (
    adaptive_alpha,
    add_lo,
    affine_interval,
    bias_lo,
    l1_up,
    mv_lo,
    product_slack,
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
    a: np.ndarray, alpha: np.ndarray, lower: np.ndarray, upper: np.ndarray,
    g: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`(D [K, m, n], lower bound of sum_i e_i [K, m])` for `A relu(v) + G v >= D v + e` on
    [lower, upper] `[K, n]` (T3; `alpha` `[K, n]` or `[K, m, n]`, `g` `[K, n]` or None): `D`
    is `A` times the lower line's slope where `A >= 0`, the upper line's where `A < 0` (1 and 0
    for stable neurons), plus `G`; the residual is computed only at the (box, neuron) pairs
    where it can be non-zero (unstable, or `G != 0`)."""
    al = alpha[:, None, :] if alpha.ndim == 2 else alpha
    inactive, active = (upper <= 0)[:, None, :], (lower >= 0)[:, None, :]
    lower_slope = np.where(inactive, 0.0, np.where(active, 1.0, al))
    upper_slope = np.where(
        inactive, 0.0, np.where(active, 1.0, unstable_slopes(lower, upper)[:, None, :])
    )
    d = a * np.where(a >= 0, lower_slope, upper_slope)
    pairs = (lower < 0) & (upper > 0)
    if g is not None:
        d = d + g[:, None, :]
        pairs |= g != 0
    kk, ii = np.nonzero(pairs)
    if not len(kk):
        return d, np.zeros(a.shape[:2])
    g_pairs = None if g is None else g[kk, ii][:, None]
    low, high = lower[kk, ii][:, None], upper[kk, ii][:, None]
    residual = np.zeros((a.shape[0], a.shape[2], a.shape[1]))  # [K, n, m]
    residual[kk, ii] = relu_residual(a[kk, :, ii], d[kk, :, ii], low, high, g_pairs)
    return d, sum_lo(residual.transpose(0, 2, 1))


def backward(
    layers: list[Layer], bounds: Bounds, box: tuple[np.ndarray, np.ndarray], a: np.ndarray,
    k: int, alphas: dict[int, np.ndarray], betas: dict[int, np.ndarray] | None = None,
) -> np.ndarray:  # fmt: skip
    """Lower bounds `[K, m]` of `a v_k` (`a [K, m, n_k]`, layers numbered from 1) over the
    boxes: `bounds[j - 1]` are v_j's intervals (j < k used), `alphas[j]` ReLU j's lower slopes
    (default: adaptive), `betas[j]` the coefficient `G` added to v_j's after ReLU j's
    relaxation (the caller's Lagrangian term, `G v_j <= 0` on the domain)."""
    const = np.zeros(a.shape[:2])
    for j in range(k, 0, -1):
        w, c, _ = layers[j - 1]
        norm = l1_up(a)
        const = add_lo(const, bias_lo(a, norm, c))
        below_relu = j > 1 and layers[j - 2][2]
        low, high = bounds[j - 2] if j > 1 else box
        a, slack = product_slack(a, w, magnitude(low, high, below_relu), norm)
        const = add_lo(const, -slack)
        if below_relu:
            alpha = alphas.get(j - 1)
            alpha = adaptive_alpha(low, high) if alpha is None else alpha
            a, residual = relu_step(a, alpha, low, high, (betas or {}).get(j - 1))
            const = add_lo(const, residual)
    pos, neg = np.maximum(a, 0), np.minimum(a, 0)
    return add_lo(const, mv_lo(pos, box[0]), mv_lo(neg, box[1]))


def intervals(layers: list[Layer], box: tuple[np.ndarray, np.ndarray]) -> Bounds:
    """Sound intervals `[K, n_j]` of every `v_j` on the boxes `[K, n_0]` (module docstring)."""
    out: Bounds = []
    for k, (w, c, _) in enumerate(layers, start=1):
        prev = out[-1] if out else box
        below_relu = k > 1 and layers[k - 2][2]
        low, high = (np.maximum(prev[0], 0), np.maximum(prev[1], 0)) if below_relu else prev
        lo, hi = affine_interval(w, c, low, high)
        if k > 1:  # the rows I and -I in one pass: lower and upper bounds
            n = w.shape[0]
            eye = np.eye(n)
            a = np.broadcast_to(np.concatenate([eye, -eye]), (len(lo), 2 * n, n))
            both = backward(layers, out, box, a, k, {})
            lo, hi = np.maximum(lo, both[:, :n]), np.minimum(hi, -both[:, n:])
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
