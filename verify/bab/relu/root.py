"""The root of ReLU splitting: its intermediate bounds and its domains (`root_domains`).

The root's intermediate bounds are CROWN's (float64 when rechecking, rounded outwards to the
network's dtype for the search), tightened by alpha-CROWN within `intermediate_share` of the
time left (`tighten_alpha`), then by a dual solver (`tighten_dual`: the bound method
`root_intermediate`, when it is registered with the `root_intermediate` capability, by its
intermediate-bounds capability) within `root_share` of it; every domain of the search inherits
them, clamped by its splits. The root bound of every polytope row is optimised (alpha-CROWN,
`root_iterations` Adam steps) before and after each tightening, and its primal points are tried
as counterexamples."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.graph.cone import spec_cone
from bounds.methods import beta_crown
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.beta_crown import SplitResult
from bounds.methods.crown import crown_intervals
from bounds.registry import get_method
from bounds.types import Budget, Interval
from verify.bab.common import Found
from verify.bab.config import ReluSplitConfig
from verify.bab.relu.domains import ReluDomains, Target, flat_intervals


class RootSide(Protocol):
    """What the root needs of the ReLU bounder (`verify.bab.relu.bounder.ReluBounder`)."""

    t: Target
    settings: ReluSplitConfig
    base64: Interval

    def set_base(self, flat: Interval) -> None: ...

    def intervals(self, splits: Tensor, base: Interval | None = None) -> dict[str, Interval]: ...

    def optimise(
        self, splits: Tensor, alpha: Tensor, beta: Tensor, C: Tensor, target: Tensor | None,
        iterations: int,
    ) -> SplitResult: ...  # fmt: skip

    def confirmed(self, d: ReluDomains, alpha: Tensor, beta: Tensor) -> ReluDomains: ...


def root_domains(b: RootSide, try_points: Callable[[Tensor], Found]) -> tuple[ReluDomains, Found]:
    """The root domains (one per polytope; those the root bound excludes closed, confirmed
    in float64) and the first counterexample `try_points` finds among the root's primal
    points `[m, *input_shape]` (before the intermediate bounds are tightened, and after)."""
    t = b.t
    tick = time.perf_counter()
    cone = spec_cone(t.check.graph, t.check.spec.C)  # the neurons the rows depend on
    intervals = crown_intervals(t.check.graph, t.box64, deadline=t.deadline, cone=cone)
    crown_seconds = time.perf_counter() - tick
    b.set_base(flat_intervals(intervals, t.layout))
    tick = time.perf_counter()
    lower, alpha, points, best = root_bound(b)
    settings, m = b.settings, t.spec.C.shape[0]
    per_pass = (time.perf_counter() - tick) / (m * (settings.root_iterations + 1))
    t.sizer.seed(per_pass * (settings.iterations + 1))  # a child: one row, fewer steps
    found = try_points(points)
    if (
        found is None
        and not excluded(t, lower).all()
        and tighten_alpha(b, intervals, crown_seconds)
    ):
        lower, alpha, points, best = root_bound(b, alpha)
        found = try_points(points)
    if found is None and not excluded(t, lower).all() and tighten_dual(b):
        lower, alpha, points, best = root_bound(b, alpha)
        found = try_points(points)
    rows = t.rows_of  # [P, r]: one root domain per polytope
    n = len(rows)
    splits = torch.zeros(n, t.layout.total, dtype=torch.int8, device=t.device)
    values = lower[0, rows] - t.spec.b[rows]
    margin = (values - t.tol[rows]).amax(1)
    poly = torch.arange(n, device=t.device)
    depth = torch.zeros(n, dtype=torch.long, device=t.device)
    zeros = torch.zeros_like(alpha[0, rows])
    stall = torch.zeros_like(depth)
    roots = ReluDomains(splits, alpha[0, rows], zeros, poly, values, margin, depth, stall)
    return b.confirmed(roots, best[0, rows], zeros), found


def root_bound(b: RootSide, alpha: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Root bounds of every row `[1, m]`, the last slopes `[1, m, n]`, the primal points and
    the slopes of each row's best bound `[1, m, n]`."""
    t = b.t
    m = t.spec.C.shape[0]
    splits = torch.zeros(1, t.layout.total, dtype=torch.int8, device=t.device)
    if alpha is None:
        views = beta_crown.default_alpha(t.graph, b.intervals(splits), m)
        alpha = t.layout.flatten(views, t.layout.acts)
    result = b.optimise(
        splits, alpha, torch.zeros_like(alpha), t.spec.C.unsqueeze(0), None,
        b.settings.root_iterations,
    )  # fmt: skip
    t.stats["domains"] += 1
    points = beta_crown.minimiser(result.last.input_coeff, t.box)[0]
    last = t.layout.flatten(result.alpha, t.layout.acts)
    best = last
    if result.best_alpha is not None:
        best = t.layout.flatten(result.best_alpha, t.layout.acts)
    return result.lower, last, points, best


def excluded(t: Target, lower: Tensor) -> Tensor:
    """`[P]` bool: some row of each polytope has its root bound `lower [1, m]` above
    `b + tol`."""
    above = lower[0] - t.spec.b > t.tol
    return above[t.rows_of].any(dim=1)


def intersect_base(b: RootSide, tightened: dict[str, Interval]) -> None:
    """The root's intervals intersected with `tightened` (per node, float64 when
    rechecking; both valid)."""
    new = flat_intervals(tightened, b.t.layout)
    lower = torch.maximum(b.base64.lower, new.lower)
    b.set_base(Interval(lower, torch.minimum(b.base64.upper, new.upper)))


def tighten_alpha(b: RootSide, intervals: dict[str, Interval], crown_seconds: float) -> bool:
    """Tighten the root's intermediate bounds (float64 `intervals`, when rechecking) by
    alpha-CROWN in the same dtype, within its share of the time left; False when off, or
    when that share is under one iteration's predicted time (a forward pass over every
    layer's neurons, as long as the root's CROWN intervals took (`crown_seconds`), and a
    backward pass of about twice that): an iteration cut short tightens nothing, and its
    slopes and moments alone take a second to allocate on a net of eight 1024-neuron
    layers."""
    t = b.t
    iterations, share = b.settings.intermediate_iterations, b.settings.intermediate_share
    left = t.deadline - time.monotonic()
    if iterations == 0 or share == 0 or share * left < 3 * crown_seconds:
        return False
    config = AlphaCrownConfig(iterations=iterations, optimize_intermediate=True)
    C = t.check.spec.C.unsqueeze(0)
    budget = Budget(seconds=max(1e-3, share * left))
    tightened = alpha_crown(t.check.graph, t.box64, C, config, budget,
                            intervals=intervals, deadline=t.deadline)[2]  # fmt: skip
    intersect_base(b, tightened)
    return True


def tighten_dual(b: RootSide) -> bool:
    """Tighten the root's intermediate bounds further by the dual solver
    `settings.root_intermediate` (its intermediate-bounds capability, `bounds.registry`: the
    Anderson relaxation's `active-set` or `sp-fw`, or `prox`), layer by layer from the current
    ones, with `root_intermediate_iterations` per layer, in float64 when rechecking, within
    `root_share` of the time left (the layers left keep their bounds). Every domain of the
    search inherits them. False when off (a method without the `root_intermediate`
    capability, e.g. `alpha-crown`) or when the solver cannot take the graph."""
    t, settings = b.t, b.settings
    method = get_method(settings.root_intermediate)
    if not method.root_intermediate or settings.root_intermediate_iterations == 0:
        return False
    left = t.deadline - time.monotonic()
    deadline = None if left == float("inf") else time.monotonic() + settings.root_share * left
    zero = torch.zeros(1, t.layout.total, dtype=torch.int8, device=t.device)
    given = b.intervals(zero, b.base64)
    tick = time.perf_counter()
    try:
        tightened = method.intermediate(  # from the given intervals (start: None)
            t.check.graph, t.box64, t.check.spec.C.unsqueeze(0),
            settings.root_intermediate_iterations, given, deadline, None,
        )  # fmt: skip
    except UnsupportedOperationError:
        return False
    intersect_base(b, tightened)
    t.stats["root_dual_seconds"] = time.perf_counter() - tick
    return True
