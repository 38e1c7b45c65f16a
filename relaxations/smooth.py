"""Shared pieces of the smooth elementwise relaxations (sigmoid, tanh, exp, reciprocal, sin,
cos, integer powers): outward rounding margins, guarded chord slopes, lines fitted through end
points, bisection and input checks.

Validity of every line here rests on a convexity argument that needs the line's value only at
a few points (the box ends, a tangent point), never on a root being found exactly:
- on a region where `g` is convex, a tangent at any point of the region lies below `g`, and any
  line that is above `g` at both ends of the box is above `g` on the whole box (the gap is
  concave, so its minimum is at an end); mirrored for concave regions;
- the intercepts are therefore taken as the min (max) over those points of `g(p) - a p`, so a
  slope that was rounded, clamped or found by an inexact bisection still gives a valid line;
- then every intercept moves outwards by `MARGIN_ULPS` ulps of the line's magnitudes
  `|b| + |a| (|l| + |u| + |d|)` plus the smallest normal number, covering the rounding of `g`,
  `g'` and of the line's arithmetic in the tensors' own dtype (float32 included): at the point
  `p` that fixes the intercept `g(p) = a p + b`, so `|g(p)| <= |b| + |a p|` is covered too.
Everything is elementwise on plain tensors; shapes broadcast as the inputs do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from relaxations.base import LinearBounds

Fn = Callable[[Tensor], Tensor]

MARGIN_ULPS = 8.0
BISECTION_STEPS = 40


def outward_margin(reference: Tensor, *magnitudes: Tensor) -> Tensor:
    """`MARGIN_ULPS * eps * sum |m| + tiny` in `reference`'s dtype: the outward shift of a line
    whose coefficients and function values are accurate to a few ulps of these magnitudes (the
    smallest normal number `tiny` covers values that underflow, e.g. sigmoid(-800) = 0). Each
    term is scaled by `eps` before summing, so the sum overflows only if the terms do."""
    info = torch.finfo(reference.dtype)
    total = magnitudes[0].abs() * info.eps
    for m in magnitudes[1:]:
        total = total + m.abs() * info.eps
    return MARGIN_ULPS * total + info.tiny


def lowest_intercept(slope: Tensor, points: tuple[Tensor, ...], values: tuple[Tensor, ...]):
    """`min_k values[k] - slope * points[k]`: the highest line of this slope that is below
    every `(points[k], values[k])`."""
    best = values[0] - slope * points[0]
    for p, v in zip(points[1:], values[1:]):
        best = torch.minimum(best, v - slope * p)
    return best


def highest_intercept(slope: Tensor, points: tuple[Tensor, ...], values: tuple[Tensor, ...]):
    """`max_k values[k] - slope * points[k]`: the lowest line of this slope above every point."""
    return -lowest_intercept(-slope, points, tuple(-v for v in values))


def chord_slope(f: Fn, df: Fn, lower: Tensor, upper: Tensor, *hull: Tensor) -> Tensor:
    """`(f(u) - f(l)) / (u - l)`, clamped into `[min, max]` of the derivatives `hull` (by the
    mean value theorem the exact chord slope is a derivative inside the box; callers pass the
    derivatives that bound `f'` there: at both ends, and at the inflection point if inside).
    Where the width is 0 (or the quotient is not finite) the slope is `f'(lower)`. Shapes
    broadcast; the slope only decides tightness, callers fit intercepts for validity."""
    width = upper - lower
    wide = width > 0
    safe = torch.where(wide, width, torch.ones_like(width))
    quotient = (f(upper) - f(lower)) / safe
    fallback = df(lower)
    slope = torch.where(wide & torch.isfinite(quotient), quotient, fallback)
    low, high = hull[0], hull[0]
    for h in hull[1:]:
        low, high = torch.minimum(low, h), torch.maximum(high, h)
    return torch.maximum(torch.minimum(slope, high), low)


@torch.no_grad()
def bisect(pred: Callable[[Tensor], Tensor], lo: Tensor, hi: Tensor, steps: int = BISECTION_STEPS):
    """Bisection for a monotone predicate that is False at `lo` and True at `hi` (elementwise,
    not checked): returns `(lo, hi)` still bracketing the switch, `steps` halvings later. The
    callers only use the result to choose a line, never to prove one valid."""
    lo, hi = lo.detach().clone(), hi.detach().clone()
    for _ in range(steps):
        mid = lo + (hi - lo) * 0.5
        switch = pred(mid)
        lo = torch.where(switch, lo, mid)
        hi = torch.where(switch, mid, hi)
    return lo, hi


def fraction_point(start: Tensor, end: Tensor, t: Tensor) -> Tensor:
    """`start + t (end - start)` for `t` clamped to [0, 1], exact at both ends (`torch.lerp`
    works from the nearer end; `l + 1 * (u - l)` can round to 0 when `|u| << |l|`) and clamped
    into the range, so the point never leaves it."""
    point = torch.lerp(start, end, t.clamp(0.0, 1.0))
    return torch.maximum(torch.minimum(point, torch.maximum(start, end)), torch.minimum(start, end))


def full_lines(
    lower_slope: Tensor, lower_intercept: Tensor, upper_slope: Tensor, upper_intercept: Tensor
) -> LinearBounds:
    """`LinearBounds` with all four tensors broadcast to one shape."""
    parts = torch.broadcast_tensors(lower_slope, lower_intercept, upper_slope, upper_intercept)
    return LinearBounds(*parts)


def negated(lines: LinearBounds) -> LinearBounds:
    """Lines of `-g` from lines of `g`: lower and upper swap and change sign."""
    return LinearBounds(
        -lines.upper_slope, -lines.upper_intercept, -lines.lower_slope, -lines.lower_intercept
    )


def first_index(mask: Tensor) -> tuple[int, ...]:
    """Index of the first True element of `mask` (as a tuple, for error messages)."""
    flat = int(mask.flatten().nonzero()[0, 0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


def require_finite_box(name: str, lower: Tensor, upper: Tensor) -> None:
    """ValueError naming the first index where a bound is infinite or NaN."""
    bad = ~(torch.isfinite(lower) & torch.isfinite(upper))
    if bad.any():
        idx = first_index(bad)
        raise ValueError(
            f"{name} relaxation: the input bounds must be finite; at index {idx} the box is "
            f"[{float(lower[idx]):.6g}, {float(upper[idx]):.6g}]"
        )


def require_finite_lines(name: str, lines: LinearBounds, lower: Tensor, upper: Tensor) -> None:
    """ValueError naming the first index whose lines are not representable in the dtype (the
    function or its slope overflows there), so no sound finite line exists in that dtype."""
    ok = torch.ones((), dtype=torch.bool, device=lower.device)
    for t in (lines.lower_slope, lines.lower_intercept, lines.upper_slope, lines.upper_intercept):
        ok = ok & torch.isfinite(t)
    if not bool(ok.all()):
        bad = ~ok
        idx = first_index(bad)
        low = torch.broadcast_to(lower, bad.shape)[idx]
        up = torch.broadcast_to(upper, bad.shape)[idx]
        hint = "" if lower.dtype == torch.float64 else " or compute in float64"
        raise ValueError(
            f"{name} relaxation: at index {idx} the box [{float(low):.6g}, {float(up):.6g}] "
            f"overflows {lower.dtype} (the function, its slope or the intercept exceeds "
            f"{torch.finfo(lower.dtype).max:.3g} there), so no finite sound line exists; "
            f"tighten the input bounds{hint}"
        )
