"""The checker's own arithmetic: float64 with every result rounded outwards, so that each number
it returns is a sound bound on the exact real value (no code of `bounds/` or `relaxations/`).

Theorems relied on (u = 2^-53, the unit roundoff of float64 round-to-nearest):
- (T1) a float operation's result is within half an ulp of the exact one (normal range), so
  `nextafter(fl(x op y), -inf)` is <= the exact `x op y` and `nextafter(.., +inf)` is >= it;
  `TINY` (2^-1022 per term) also covers products that underflow.
- (T2) (Higham, Accuracy and Stability, Th. 3.4) a dot product of length n, summed in any order
  (FMA or not), errs by at most gamma_n * sum_i |a_i b_i|, gamma_n = n u / (1 - n u); the sum
  `fl(sum |a_i b_i|)` is itself at least the exact one times (1 - gamma_n), so
  `2 gamma_{n+2} fl(sum |a_i b_i|)` (rounded up) bounds the error for n u < 0.01.
- (T3) for any reals A, G, D and z in [l, u], `A relu(z) + G z - D z` is piecewise linear with
  one break at 0, so its minimum over [l, u] is attained at l, u or (when l < 0 < u) 0:
  `relu_residual`.
  Hence `A relu(z) >= D z + e` for ANY D, whatever rounding produced it (CROWN's slopes only
  choose D; soundness never depends on them).
"""

from __future__ import annotations

import numpy as np

U = 2.0**-53
TINY = 2.0**-1022


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u), rounded up (T2)."""
    return float(np.nextafter(n * U / (1 - n * U), np.inf))


def down(x: np.ndarray) -> np.ndarray:
    """One step towards -inf (T1): a lower bound of the exact value `x` was rounded from."""
    return np.nextafter(np.asarray(x, dtype=np.float64) - TINY, -np.inf)


def up(x: np.ndarray) -> np.ndarray:
    """One step towards +inf (T1)."""
    return np.nextafter(np.asarray(x, dtype=np.float64) + TINY, np.inf)


def mv(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`fl(a x)` over the last axis, batched: `a [..., m, n]`, `x [..., n]` -> `[..., m]`."""
    if a.ndim == 2:
        return x @ a.T
    if x.ndim == 1:
        return a @ x
    return np.matmul(a, x[..., None])[..., 0]


def mv_lo(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A lower bound of the exact `a x` (`mv`'s shapes; T2)."""
    n = a.shape[-1]
    err = up(2 * gamma(n + 2) * up(mv(np.abs(a), np.abs(x))) + n * TINY)
    return down(down(mv(a, x)) - err)


def l1_up(a: np.ndarray) -> np.ndarray:
    """`fl(sum_i |a_i|)` over the last axis, rounded up: at least the exact sum times
    `1 - gamma_n` (T2), which the `2 gamma` factors below absorb."""
    return up(np.abs(a).sum(axis=-1))


def bias_lo(a: np.ndarray, norm: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A lower bound `[K, m]` of the exact `a c` (`a [K, m, n]`, `c [n]` or `[K, n]`) from
    `norm = l1_up(a)`: `|fl(a c) - a c| <= gamma_n ||a||_1 max |c|` (T2)."""
    n = a.shape[-1]
    c_max = np.abs(c).max(axis=-1, initial=0.0)
    c_max = c_max if np.ndim(c_max) == 0 else c_max[:, None]
    err = up(up(4 * gamma(n + 2) * norm) * c_max + n * TINY)
    return down(down(mv(a, c)) - err)


def product_slack(
    a: np.ndarray, w: np.ndarray, h: np.ndarray, norm: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`(fl(a @ w), s)`: `a [K, m, n]`, `w [n, p]` or `[K, n, p]`, `h [K, p] >= 0`, `norm =
    l1_up(a)`, and `s [K, m]` with `sum_j |fl(a w)_j - (a w)_j| h_j <= s` (T2, summed over j:
    each entry errs by at most `gamma_n sum_i |a_i| |w_ij| <= gamma_n ||a||_1 max_i |w_ij|`,
    plus `n TINY` for underflow; `4 gamma_{n+2}` covers the rounding of the sums, each of
    non-negative terms and so within a factor `1 - gamma` of its exact value)."""
    n = a.shape[-1]
    if w.ndim == 2:
        value = (a.reshape(-1, n) @ w).reshape(*a.shape[:-1], w.shape[1])
    else:
        value = a @ w
    column_max = np.abs(w).max(axis=-2)
    weighted = up(np.sum(column_max * h, axis=-1))  # [K]
    slack = up(up(4 * gamma(n + 2) * norm) * weighted[:, None])
    return value, up(slack + up(n * TINY * up(h.sum(axis=-1)))[:, None])


def sum_lo(x: np.ndarray) -> np.ndarray:
    """A lower bound of the exact sum of `x` over its last axis (T2 with b = 1)."""
    return mv_lo(x, np.ones(x.shape[-1]))


def add_lo(*terms: np.ndarray) -> np.ndarray:
    """A lower bound of the exact sum of the terms (each addition rounded down, T1)."""
    total = np.asarray(terms[0], dtype=np.float64)
    for t in terms[1:]:
        total = down(total + t)
    return total


def affine_interval(
    w: np.ndarray, c: np.ndarray, lower: np.ndarray, upper: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Interval arithmetic: bounds of `w x + c` for x in [lower, upper] (`w [n, m]` or
    `[K, n, m]`, the bounds `[m]` or `[K, m]`): the lower one is `w+ lower + w- upper + c`
    rounded down (T1, T2), the upper one likewise up."""
    pos, neg = np.maximum(w, 0), np.minimum(w, 0)
    lo = add_lo(mv_lo(pos, lower), mv_lo(neg, upper), c)
    hi = -add_lo(mv_lo(-pos, upper), mv_lo(-neg, lower), -c)
    return lo, hi


def relu_residual(a: np.ndarray, d: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                  g: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """A lower bound of `min_{z in [lower, upper]} a relu(z) + g z - d z` per entry (T3;
    `a`, `d` `[..., n]`, the bounds and `g` broadcast to them; `g` None: 0)."""

    def at(z: np.ndarray) -> np.ndarray:
        r = down(a * np.maximum(z, 0))
        if g is not None:
            r = down(r + down(g * z))
        return down(r - up(d * z))

    low = np.minimum(at(lower), at(upper))
    crosses = (lower < 0) & (upper > 0)
    return np.where(crosses, np.minimum(low, 0.0), low)


def unstable_slopes(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The upper line's slope `u / (u - l)` of an unstable ReLU (1 when active, 0 when
    inactive); any value is sound (T3), this one is CROWN's."""
    width = np.where(upper > lower, upper - lower, 1.0)
    s = np.clip(upper / width, 0.0, 1.0)
    return np.where(lower >= 0, 1.0, np.where(upper <= 0, 0.0, s))


def adaptive_alpha(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """CROWN's adaptive lower slope: 1 where `u >= -l`, else 0."""
    return (upper >= -lower).astype(np.float64)
