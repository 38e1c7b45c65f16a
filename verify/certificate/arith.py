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
- (T3) for any reals A, D and z in [l, u], `A relu(z) - D z` is piecewise linear with one break
  at 0, so its minimum over [l, u] is attained at l, u or (when l < 0 < u) 0: `relu_residual`.
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


def matmul_err(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(fl(a @ b), err)` with `|fl(a @ b) - a @ b| <= err` entrywise (T2)."""
    n = a.shape[-1]
    value = a @ b
    mass = np.abs(a) @ np.abs(b)
    return value, up(2 * gamma(n + 2) * up(mass) + n * TINY)


def matmul_lo(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A lower bound of the exact `a @ b` (T2)."""
    value, err = matmul_err(a, b)
    return down(down(value) - err)


def sum_lo(x: np.ndarray) -> np.ndarray:
    """A lower bound of the exact sum of `x` over its last axis (T2 with b = 1)."""
    return matmul_lo(x, np.ones(x.shape[-1]))


def add_lo(*terms: np.ndarray) -> np.ndarray:
    """A lower bound of the exact sum of the terms (each addition rounded down, T1)."""
    total = np.asarray(terms[0], dtype=np.float64)
    for t in terms[1:]:
        total = down(total + t)
    return total


def affine_interval(
    w: np.ndarray, c: np.ndarray, lower: np.ndarray, upper: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Interval arithmetic: bounds of `w x + c` for x in [lower, upper] (`w [n, m]`): the lower
    one is `w+ lower + w- upper + c` rounded down (T1, T2), the upper one likewise up."""
    pos, neg = np.maximum(w, 0), np.minimum(w, 0)
    lo = add_lo(matmul_lo(pos, lower), matmul_lo(neg, upper), c)
    hi = -add_lo(matmul_lo(-pos, upper), matmul_lo(-neg, lower), -c)
    return lo, hi


def relu_residual(a: np.ndarray, d: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """A lower bound of `min_{z in [lower, upper]} a relu(z) - d z` per entry (T3; `a`, `d`
    `[m, n]`, the bounds `[n]`)."""

    def at(z: np.ndarray) -> np.ndarray:
        r = np.maximum(z, 0)
        return down(down(a * r) - up(d * z))

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
