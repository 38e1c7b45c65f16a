"""Bounds that hold in floating point: the one argument, and the helpers every op uses.

A bound is a statement about the network in exact (real) arithmetic on its stored weights. We
compute it in IEEE 754 arithmetic (float32 or float64, round to nearest), so every computed
quantity that a bound rests on is widened by a proven bound on its rounding error.

The model (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Sec. 2.2, 3.1):
with unit roundoff `u` (2^-24 for float32, 2^-53 for float64), each operation satisfies
`fl(a op b) = (a op b)(1 + d) + e`, `|d| <= u`, `|e| <= eta`, where `eta` is the underflow
term. We take `eta` = the smallest *normal* number of the dtype, so that flushing subnormals to
zero (FTZ/DAZ, as some GPU kernels do) is covered too.

Sums of products (Higham eq. 3.4, for any order of summation, blocked, pairwise or with FMA):
if every term `a_i b_i` of `s = sum_i a_i b_i` passes through at most `k` roundings on its way
to the result, `|fl(s) - s| <= gamma_k sum_i |a_i b_i| + k n eta`, `gamma_k = k u / (1 - k u)`.
An affine op `y = L x + b` whose matrix has at most `n` non-zeros per row, evaluated at interval
endpoints as `L+ l + L- u + b`, gives each term at most `n + 2` roundings (one product, at most
`n - 1` additions inside each part, one to add the parts and one for the bias); we add
`CONSTANT_ROUNDINGS` more for constants that were derived by rounded arithmetic from the stored
weights (BatchNorm folding, compositions of elementwise maps): a constant `c' = c (1 + d_1)...
(1 + d_j)` contributes like j extra roundings of each product. So

    |computed - exact| <= gamma_(n + 2 + CONSTANT_ROUNDINGS) (|L| m + |b|) + (2n + 2) eta,

with `m = max(|l|, |u|)` elementwise. The error bound is itself computed in floating point:
every term is non-negative, so its computed value is at least `(1 - gamma) x` the exact one;
`error_bound` doubles it (valid while gamma <= 0.4, else the bound is infinite).

A linear bound `A . v` pushed backward through the network (CROWN and its relatives) is a sum
of such sums: each backward step's rounding, and each concretisation, is bounded the same way
against magnitudes `m_v = max(|l_v|, |u_v|)` of the nodes' (sound) intervals; see
`bounds.methods.backward.backward_pass`.

Elementwise nonlinear functions (exp, tanh, sin, ...) come from the platform's math library;
we assume each result within `ulps` units in the last place (`Relaxation.rounding_ulps`,
default `DEFAULT_ULPS` = 8: glibc, SLEEF and CUDA's libdevice document at most 1-4 ulp for
these in both precisions). Their intervals are widened by that many ulps, relative.

Precision: the tracked passes of a float32 network run in float64 on a float64 copy of its graph
(`Graph.float64`; float32 weights convert exactly) and their results are rounded outward to
float32 (`outward`): `gamma_k` in float32 is about 6e-8 k of the magnitudes (3e-5 for a fan-out
of 256, measured as 9-35% wider final bounds on mnist 256x6), in float64 about 1e-16 k.

Finally, `lower_minus` and `upper_plus` round: `fl(a - e)` is within half an ulp of `a - e`, so one `nextafter`
step towards -inf gives a value below it; NaN (e.g. `inf - inf`) becomes -inf (lower) or +inf
(upper), which is always valid.

What is *not* covered: TF32 or other reduced-precision matmuls (their `u` is 2^-11; the
monitors model them separately), and compilers that reassociate beyond the model (none of
Inductor's rewrites change the number of roundings per term beyond `n + 2`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from bounds.types import Interval, rounded_down, rounded_up

if TYPE_CHECKING:  # the graph's module imports the ops, which import this one
    from bounds.graph.graph import Graph

CONSTANT_ROUNDINGS = 8  # roundings allowed in constants derived from the stored weights
DEFAULT_ULPS = 8  # accuracy assumed of elementwise library functions


def unit_roundoff(dtype: torch.dtype) -> float:
    """`u`: half the distance from 1 to the next float (2^-24 float32, 2^-53 float64)."""
    return torch.finfo(dtype).eps / 2


def eta(dtype: torch.dtype) -> float:
    """The underflow term: the smallest normal number (covers flushing subnormals to zero)."""
    return torch.finfo(dtype).tiny


def gamma(k: int, dtype: torch.dtype) -> float:
    """`gamma_k = k u / (1 - k u)` for `k` roundings of unit roundoff `u`; inf once `k u >=
    0.4` (where `error_bound`'s doubling stops covering the bound's own rounding). Callers
    whose products involve derived constants add `CONSTANT_ROUNDINGS` to `k`."""
    ku = k * unit_roundoff(dtype)
    return math.inf if ku >= 0.4 else ku / (1 - ku)


def error_bound(magnitude: Tensor, k: int | Tensor, terms: int | Tensor = 1) -> Tensor:
    """A proven bound on `|computed - exact|` of sums whose terms pass through at most `k`
    roundings, given the computed sum of the terms' magnitudes `magnitude` (>= 0) and the
    number of terms per sum `terms` (an int, or a tensor counting the non-zero terms of each
    sum: a sum of zeros is exact): `2 gamma_k magnitude + 2 (k + terms) eta`. NaN (a
    magnitude of `0 * inf`) becomes inf."""
    if isinstance(k, Tensor):  # per sum: inf where k u >= 0.4
        ku = k.to(magnitude.dtype) * unit_roundoff(magnitude.dtype)
        g = torch.where(ku < 0.4, ku / (1 - ku), math.inf)
    else:
        g = gamma(k, magnitude.dtype)
    if isinstance(terms, Tensor):
        under = torch.where(terms > 0, 2 * (k + terms) * eta(magnitude.dtype), 0.0)
    else:
        under = 2 * (k + terms) * eta(magnitude.dtype)
    err = magnitude * (2 * g) + under
    return torch.nan_to_num(err, nan=math.inf)


def magnitude(iv: Interval) -> Tensor:
    """`max(|lower|, |upper|)`: the largest absolute value in the interval (NaN-free: an
    unknown end is inf)."""
    m = torch.maximum(iv.lower.abs(), iv.upper.abs())
    return torch.nan_to_num(m, nan=math.inf)


def down(t: Tensor) -> Tensor:
    """One step towards -inf (NaN becomes -inf)."""
    t = torch.nan_to_num(t, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    return torch.nextafter(t, t.new_tensor(-math.inf))


def up(t: Tensor) -> Tensor:
    """One step towards +inf (NaN becomes +inf)."""
    t = torch.nan_to_num(t, nan=math.inf, posinf=math.inf, neginf=-math.inf)
    return torch.nextafter(t, t.new_tensor(math.inf))


def lower_minus(value: Tensor, err: Tensor) -> Tensor:
    """A float below `value - err` (exact reals): the rounded difference, one step down (no
    step where `err` is 0: nothing was rounded)."""
    stepped = down(value - err)
    return torch.where(err == 0, torch.nan_to_num(value, nan=-math.inf), stepped)


def upper_plus(value: Tensor, err: Tensor) -> Tensor:
    """A float above `value + err` (exact reals): the rounded sum, one step up (no step where
    `err` is 0)."""
    stepped = up(value + err)
    return torch.where(err == 0, torch.nan_to_num(value, nan=math.inf), stepped)


def widen(iv: Interval, err: Tensor) -> Interval:
    """`[lower - err, upper + err]`, rounded outward: valid for the exact interval when the
    computed one errs by at most `err` at each end."""
    return Interval(lower_minus(iv.lower, err), upper_plus(iv.upper, err))


def outward(iv: Interval, dtype: torch.dtype) -> Interval:
    """`iv` in `dtype`, each end rounded outward (NaN ends become infinite)."""
    low = torch.nan_to_num(iv.lower, nan=-math.inf)
    high = torch.nan_to_num(iv.upper, nan=math.inf)
    return Interval(rounded_down(low, dtype), rounded_up(high, dtype))


def in_float64(iv: Interval) -> Interval:
    """`iv` in float64 (exact: every float32 is a float64)."""
    return Interval(iv.lower.double(), iv.upper.double())


def intervals_in_float64(intervals: dict[str, Interval] | None) -> dict[str, Interval]:
    """Each interval of `intervals` (None: none) in float64."""
    return {k: in_float64(iv) for k, iv in (intervals or {}).items()}


def intervals_outward(intervals: dict[str, Interval], dtype: torch.dtype) -> dict[str, Interval]:
    """Each interval of `intervals` in `dtype`, rounded outward."""
    return {k: outward(iv, dtype) for k, iv in intervals.items()}


def bounds_in_float64(
    method: Callable[..., tuple[Tensor, Tensor, dict[str, Interval]]], graph: Graph,
    box: Interval, C: Tensor, given: dict[str, Interval] | None, *args: Any,
) -> tuple[Tensor, Tensor, dict[str, Interval]]:  # fmt: skip
    """`method(graph, box, C, given, *args) -> (lower, upper, intervals)` evaluated on the
    float64 copy of `graph` (`Graph.float64`), its results rounded outward to `box`'s dtype:
    how a float32 network's bounds are computed."""
    dtype = box.lower.dtype
    low, up, found = method(
        graph.float64, in_float64(box), C.double(), intervals_in_float64(given), *args
    )
    return rounded_down(low, dtype), rounded_up(up, dtype), intervals_outward(found, dtype)


def widen_ulps(iv: Interval, ulps: int) -> Interval:
    """Each end moved outward by `ulps` units of its own magnitude (plus the underflow term),
    then rounded outward: for results of library functions accurate to `ulps` ulp."""
    u = unit_roundoff(iv.lower.dtype) * 2 * ulps
    tiny = 2 * eta(iv.lower.dtype)
    low = torch.nan_to_num(iv.lower, nan=-math.inf)
    high = torch.nan_to_num(iv.upper, nan=math.inf)
    return Interval(lower_minus(low, low.abs() * u + tiny), upper_plus(high, high.abs() * u + tiny))
