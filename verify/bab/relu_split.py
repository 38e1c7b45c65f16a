"""Branch and bound with ReLU splitting over batches of domains (one VNN-LIB region).

A domain is the region's input box, one unsafe polytope to exclude, and an assignment of some
ReLUs to active (`xh >= 0`) or inactive (`xh <= 0`). The search (`ReluBab`, a `Search` run by
the one loop of `verify.bab.loop`) is three parts:
- `ReluBounder` bounds domains by alpha-beta-CROWN (`bounds/methods/beta_crown.py`: the split
  constraints enter both the intervals, `l = 0` for active and `u = 0` for inactive neurons, and
  the bound through their Lagrange multipliers `beta`) with the intermediate bounds of the root
  (alpha-CROWN-tightened, clamped by the domain's splits), so one bound costs one backward pass
  per Adam step. Children continue their parent's optimisation: its last slopes `alpha` and
  multipliers `beta`, the new split's `beta` chosen so that the child's functional equals the
  parent's where that is possible (see `relu_branching.with_split`), and a child's bound is
  never reported below its parent's (valid on the child, which is a subset).
- `HardBounder` (optional) re-bounds the open children predicted hard by a tighter, costlier
  bounder (`bounds.dual.split_domains.HARD_BOUNDERS`: the proximal Planet solver or the
  Anderson active set). Off by default, as measured (see the issue-4 and issue-13 notes).
- `ReluBrancher` picks one ambiguous neuron per domain (BaBSR, or FSB: the best of the top
  candidates of BaBSR and of the intercept score, judged by both children's one-pass bounds)
  and makes the two children.
Each step pops the open domains of smallest margin (best-first), branches and bounds them, prunes
those whose bound excludes their polytope, tries the open children's primal points (the box
minimisers of their bounds) as counterexamples, runs PGD from the worst ones now and then, and
keeps the rest (Bunel et al. 2020, JMLR; Wang et al. 2021, beta-CROWN; De Palma et al. 2021,
FSB). The region holds when no domain is left; a domain with no neuron left to split that its
bound cannot exclude makes the answer "unknown", never "unsat".

Float32 networks are searched in float32 on float64 foundations: the root's intermediate bounds
are computed in float64 and rounded outwards to float32, and a domain is pruned only once its
closing bound, evaluated again in float64 at the same slopes and multipliers (`SplitResult.
best_alpha`, `best_beta`) on the same intervals, still excludes its polytope
(`ReluBounder.confirmed`; a domain that fails stays open). See `common.Float64Check`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from bounds.dual.intermediate import intermediate_intervals
from bounds.dual.split_domains import HARD_BOUNDERS, WARM_STARTS
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph, build_graph
from bounds.methods import beta_crown
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.beta_crown import SplitResult
from bounds.methods.crown import crown_intervals
from bounds.methods.pacing import passed
from bounds.types import Budget, Interval, rounded_down
from verify.attack import UnsafeSpec, pgd, validate
from verify.bab.common import (
    BatchSizer,
    DeadlineReachedError,
    DomainBatch,
    Float64Check,
    Found,
    RegionSearch,
    in_chunks,
    outward,
    outward_box,
)
from verify.bab.config import DUAL_ROOT_INTERMEDIATE, ReluSplitConfig
from verify.bab.protocols import Children
from verify.bab.relu_branching import (
    Layout,
    babsr_scores,
    branchable,
    candidates,
    flat_intervals,
    fsb_pick,
    polytope_rows,
    pre_biases,
    side_slopes,
    with_split,
)
from verify.bab.warm import WarmStarts
from verify.property import Region

__all__ = ["HardBounder", "ReluBab", "ReluBounder", "ReluBrancher", "ReluDomains", "relu_only"]


def relu_only(net: nn.Module, n_inputs: int) -> bool:
    """Whether every activation of `net` is a ReLU (so ReLU splitting applies)."""
    shape = tuple(getattr(net, "input_shape", None) or (n_inputs,))
    try:
        build_graph(net, shape).split_pairs()
    except (NotImplementedError, UnsupportedOperationError):
        return False
    return True


@dataclass
class ReluDomains(DomainBatch):
    """Open domains, flat over the ReLU neurons (`Layout`): `splits [N, n]` int8 (+1 active,
    -1 inactive, 0 free); `alpha`, `beta [N, r, n]`; `poly [N]` the unsafe polytope to exclude;
    `rows [N, r]` lower bounds of its rows' `C y - b` (padded by repeating a row); `margin [N]`
    the best row minus its tolerance (> 0: excluded); `depth [N]` the number of splits; `stall
    [N]` how many of the last splits in a row improved the margin by less than
    `ReluSplitConfig.stall_gain` (the hard-subtree predictor); `warm [N]` int64 the id of the
    hard bounder's stored duals its hard bound starts from (`verify.bab.warm`; -1, the default:
    none)."""

    splits: Tensor
    alpha: Tensor
    beta: Tensor
    poly: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor
    stall: Tensor
    warm: Tensor | None = None

    def __post_init__(self) -> None:
        if self.warm is None:
            self.warm = torch.full_like(self.depth, -1, dtype=torch.long)


@dataclass
class Target:
    """What every part of one ReLU-splitting search shares: the graph in the network's dtype
    and device, its ReLU `layout`, the region's outward-rounded `box [1, *input_shape]` (and
    `box64`, float64 when rechecking), the unsafe polytopes (`spec`, `rows_of [P, r]`, pruning
    tolerance `tol [m]`), the float64 `check`, the batch `sizer`, `stats` and the `deadline`
    (`time.monotonic()`)."""

    graph: Graph
    layout: Layout
    box: Interval
    box64: Interval
    spec: UnsafeSpec
    rows_of: Tensor | None
    tol: Tensor
    check: Float64Check
    sizer: BatchSizer
    stats: dict[str, Any]
    deadline: float = float("inf")

    @property
    def device(self) -> torch.device:
        return self.box.lower.device


class ReluBounder:
    """Bounder of ReLU-split domains by alpha-beta-CROWN against the root's intermediate bounds
    (`base`, flat `[1, n]`; `base64` its float64 twin), set by `root`."""

    def __init__(self, target: Target, settings: ReluSplitConfig):
        self.t, self.settings = target, settings
        self.base = Interval(target.box.lower, target.box.upper)
        self.base64 = self.base

    # ----- the root -----

    def root(self, try_points: Callable[[Tensor], Found]) -> tuple[ReluDomains, Found]:
        """The root domains (one per polytope; those the root bound excludes closed, confirmed
        in float64) and the first counterexample `try_points` finds among the root's primal
        points `[m, *input_shape]` (before the intermediate bounds are tightened, and after)."""
        t = self.t
        tick = time.perf_counter()
        intervals = crown_intervals(t.check.graph, t.box64, deadline=t.deadline)
        crown_seconds = time.perf_counter() - tick
        self.set_base(flat_intervals(intervals, t.layout))
        tick = time.perf_counter()
        lower, alpha, points, best = self._root_bound()
        settings, m = self.settings, t.spec.C.shape[0]
        per_pass = (time.perf_counter() - tick) / (m * (settings.root_iterations + 1))
        t.sizer.seed(per_pass * (settings.iterations + 1))  # a child: one row, fewer steps
        found = try_points(points)
        if (
            found is None
            and not self._excluded(lower).all()
            and self._tighten(intervals, crown_seconds)
        ):
            lower, alpha, points, best = self._root_bound(alpha)
            found = try_points(points)
        if found is None and not self._excluded(lower).all() and self._dual_tighten():
            lower, alpha, points, best = self._root_bound(alpha)
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
        return self.confirmed(roots, best[0, rows], zeros), found

    def set_base(self, flat: Interval) -> None:
        """The root's flat intervals `[1, n]` (float64 when rechecking): `base` for the search,
        rounded outwards to the network's dtype, and `base64`, the same values in float64."""
        if not self.t.check.active:
            self.base = self.base64 = flat
            return
        self.base = outward(flat, self.t.box.lower.dtype)
        self.base64 = Interval(self.base.lower.double(), self.base.upper.double())

    def _root_bound(self, alpha: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Root bounds of every row `[1, m]`, the last slopes `[1, m, n]`, the primal points and
        the slopes of each row's best bound `[1, m, n]`."""
        t = self.t
        m = t.spec.C.shape[0]
        splits = torch.zeros(1, t.layout.total, dtype=torch.int8, device=t.device)
        if alpha is None:
            views = beta_crown.default_alpha(t.graph, self.intervals(splits), m)
            alpha = t.layout.flatten(views, t.layout.acts)
        result = self._optimise(
            splits, alpha, torch.zeros_like(alpha), t.spec.C.unsqueeze(0), None,
            self.settings.root_iterations,
        )  # fmt: skip
        t.stats["domains"] += 1
        points = beta_crown.minimiser(result.last.input_coeff, t.box)[0]
        last = t.layout.flatten(result.alpha, t.layout.acts)
        best = last if result.best_alpha is None else self._flat(result.best_alpha)
        return result.lower, last, points, best

    def _excluded(self, lower: Tensor) -> Tensor:
        """`[P]` bool: some row of each polytope has its root bound `lower [1, m]` above
        `b + tol`."""
        above = lower[0] - self.t.spec.b > self.t.tol
        return above[self.t.rows_of].any(dim=1)

    def _intersect_base(self, tightened: dict[str, Interval]) -> None:
        """The root's intervals intersected with `tightened` (per node, float64 when
        rechecking; both valid)."""
        new = flat_intervals(tightened, self.t.layout)
        lower = torch.maximum(self.base64.lower, new.lower)
        self.set_base(Interval(lower, torch.minimum(self.base64.upper, new.upper)))

    def _tighten(self, intervals: dict[str, Interval], crown_seconds: float) -> bool:
        """Tighten the root's intermediate bounds (float64 `intervals`, when rechecking) by
        alpha-CROWN in the same dtype, within its share of the time left; False when off, or
        when that share is under one iteration's predicted time (a forward pass over every
        layer's neurons, as long as the root's CROWN intervals took (`crown_seconds`), and a
        backward pass of about twice that): an iteration cut short tightens nothing, and its
        slopes and moments alone take a second to allocate on a net of eight 1024-neuron
        layers."""
        t = self.t
        iterations, share = self.settings.intermediate_iterations, self.settings.intermediate_share
        left = t.deadline - time.monotonic()
        if iterations == 0 or share == 0 or share * left < 3 * crown_seconds:
            return False
        config = AlphaCrownConfig(iterations=iterations, optimize_intermediate=True)
        C = t.check.spec.C.unsqueeze(0)
        budget = Budget(seconds=max(1e-3, share * left))
        tightened = alpha_crown(t.check.graph, t.box64, C, config, budget,
                                intervals=intervals, deadline=t.deadline)[2]  # fmt: skip
        self._intersect_base(tightened)
        return True

    def _dual_tighten(self) -> bool:
        """Tighten the root's intermediate bounds further by the dual solver
        `settings.root_intermediate` (`bounds.dual.intermediate`: the Anderson relaxation's
        `active-set` or `sp-fw`, or `prox`), layer by layer from the current ones, with
        `root_intermediate_iterations` per layer, in float64 when rechecking, within
        `root_share` of the time left (the layers left keep their bounds). Every domain of the
        search inherits them. False when off (`alpha-crown`) or when the solver cannot take
        the graph."""
        t, settings = self.t, self.settings
        kind = settings.root_intermediate
        if kind not in DUAL_ROOT_INTERMEDIATE or settings.root_intermediate_iterations == 0:
            return False
        left = t.deadline - time.monotonic()
        deadline = None if left == float("inf") else time.monotonic() + settings.root_share * left
        zero = torch.zeros(1, t.layout.total, dtype=torch.int8, device=t.device)
        given = self.intervals(zero, self.base64)
        tick = time.perf_counter()
        try:
            tightened = intermediate_intervals(
                t.check.graph, t.box64, t.check.spec.C.unsqueeze(0), kind,
                settings.root_intermediate_iterations, given, deadline, start="crown",
            )  # fmt: skip
        except UnsupportedOperationError:
            return False
        self._intersect_base(tightened)
        t.stats["root_dual_seconds"] = time.perf_counter() - tick
        return True

    # ----- bounding -----

    def _flat(self, per_layer: dict[str, Tensor]) -> Tensor:
        return self.t.layout.flatten(per_layer, self.t.layout.acts)

    def intervals(self, splits: Tensor, base: Interval | None = None) -> dict[str, Interval]:
        """Per pre-activation node the root intervals (`base`, default `self.base`) clamped by
        `splits [N, n]`."""
        layout = self.t.layout
        flat = beta_crown.clamp_by_splits(self.base if base is None else base, splits)
        lower = layout.views(flat.lower, layout.pres)
        upper = layout.views(flat.upper, layout.pres)
        return {p: Interval(lower[p], upper[p]) for p in layout.pres}

    def flat_intervals(self, splits: Tensor) -> Interval:
        """The flat root intervals `[N, n]` clamped by `splits [N, n]`."""
        return beta_crown.clamp_by_splits(self.base, splits)

    def _optimise(self, splits, alpha, beta, C, target, iterations: int) -> SplitResult:
        """alpha-beta-CROWN on the domains `splits [N, n]` from `alpha`, `beta [N, S, n]`."""
        t, layout = self.t, self.t.layout
        return beta_crown.optimise(
            t.graph, t.box, C, self.intervals(splits), layout.views(splits, layout.pres),
            layout.views(alpha, layout.acts), layout.views(beta, layout.acts),
            self.settings.bound_config(iterations), target=target, deadline=t.deadline,
            keep_best=t.check.active,
        )  # fmt: skip

    def bound(self, domains: ReluDomains, iterations: int | None = None):
        """`domains` with fresh bounds (never below their `rows`, which must be valid on them,
        e.g. the parent's), slopes and multipliers, and their primal points
        `[N, r, *input_shape]`; `iterations` Adam steps (default: the children's); in chunks of
        the batch size (halved on out-of-memory), checking the deadline between chunks. A
        margin > 0 (closed) is confirmed in float64."""
        t = self.t
        iterations = self.settings.iterations if iterations is None else iterations

        def chunk(part: slice) -> tuple[ReluDomains, Tensor]:
            return self.bound_chunk(domains.take(torch.arange(len(domains))[part]), iterations)

        parts = in_chunks(len(domains), t.sizer, t.deadline, chunk)
        t.stats["domains"] += len(domains)
        return ReluDomains.cat([d for d, _ in parts]), torch.cat([x for _, x in parts])

    def bound_chunk(self, d: ReluDomains, iterations: int) -> tuple[ReluDomains, Tensor]:
        t = self.t
        rows = t.rows_of[d.poly]  # [N, r]
        b, tol = t.spec.b[rows], t.tol[rows]
        C = t.spec.C[rows]  # [N, r, n_out]
        result = self._optimise(d.splits, d.alpha, d.beta, C, b + tol, iterations)
        values = torch.maximum(result.lower - b, d.rows)  # the parent's bounds hold here too
        alpha, beta = self._flat(result.alpha), self._flat(result.beta)
        margin = (values - tol).amax(1)
        stall = self._stall(d, margin)
        t.stats["batches"] += 1
        bounded = ReluDomains(d.splits, alpha, beta, d.poly, values, margin, d.depth, stall,
                              d.warm)  # fmt: skip
        if result.best_alpha is not None:
            best = (self._flat(result.best_alpha), self._flat(result.best_beta))
            bounded = self.confirmed(bounded, *best)
        return bounded, beta_crown.minimiser(result.last.input_coeff, t.box)

    def _stall(self, d: ReluDomains, margin: Tensor) -> Tensor:
        """`[N]` the stall counts after re-bounding `d` (whose `margin` is the parent's) to
        `margin`: one more where it improved by less than `stall_gain * |parent margin|`."""
        gain = self.settings.stall_gain * d.margin.abs()
        return torch.where(margin - d.margin < gain, d.stall + 1, torch.zeros_like(d.stall))

    def confirmed(self, d: ReluDomains, alpha: Tensor, beta: Tensor) -> ReluDomains:
        """`d` with each closed domain (margin > 0) confirmed: one float64 backward pass at the
        slopes `alpha` and multipliers `beta [N, r, n]` that gave its bound, on the same box and
        intervals (`base64`, clamped by its splits), for the rows of `C y - b` as written in the
        VNN-LIB file; a domain whose float64 bound does not exceed `b + tol` stays open, with
        its float64 rows (rounded down) and a margin <= 0."""
        t = self.t
        closed = (d.margin > 0).nonzero().flatten()
        if not t.check.active or not len(closed):
            return d
        if not t.check.fits(len(closed), t.deadline):  # unconfirmed: they must not count
            raise DeadlineReachedError
        tick = time.perf_counter()
        rows = t.rows_of[d.poly[closed]]
        spec, layout, f64 = t.check.spec, t.layout, torch.float64
        splits = d.splits[closed]
        result = beta_crown.backward(
            t.check.graph, t.box64, spec.C[rows], self.intervals(splits, self.base64),
            layout.views(splits, layout.pres), layout.views(alpha[closed].to(f64), layout.acts),
            layout.views(beta[closed].to(f64), layout.acts), tracked=True,
        )  # fmt: skip
        values64 = result.lower - spec.b[rows]
        bad = (values64 - t.check.tol[rows]).amax(1) <= 0
        failed = closed[bad]
        values, margin = d.rows.clone(), d.margin.clone()
        values[failed] = rounded_down(values64[bad], values.dtype)
        margin[failed] = (values[failed] - t.tol[t.rows_of[d.poly[failed]]]).amax(1)
        margin[failed] = margin[failed].clamp(max=0)
        t.check.record(len(closed), len(failed), time.perf_counter() - tick)
        return ReluDomains(d.splits, d.alpha, d.beta, d.poly, values, margin, d.depth, d.stall,
                           d.warm)  # fmt: skip

    def one_pass(self, splits, alpha, beta, C) -> beta_crown.SplitBackward:
        """One alpha-beta-CROWN backward pass (no optimisation) on the domains `splits`."""
        t, layout = self.t, self.t.layout
        return beta_crown.backward(
            t.graph, t.box, C, self.intervals(splits), layout.views(splits, layout.pres),
            layout.views(alpha, layout.acts), layout.views(beta, layout.acts),
        )  # fmt: skip

    def coefficients(self, parents: ReluDomains) -> Tensor:
        """`[N, r, n]` the coefficients at the ReLU outputs of each parent's rows."""
        rows = self.t.rows_of[parents.poly]
        result = self.one_pass(parents.splits, parents.alpha, parents.beta, self.t.spec.C[rows])
        return self.t.layout.flatten(result.act_coeffs, self.t.layout.acts)


class HardBounder:
    """The stratified stage (De Palma et al. 2021, "Scaling the convex barrier with active
    sets", Sec. 5; the OVAL framework): the children that alpha-beta-CROWN leaves open and
    that look hard (`hard`: depth >= `prox_min_depth` and, with `hard_stall` > 0, a bound that
    improved little over that many splits in a row) are re-bounded by the dual bounder
    `HARD_BOUNDERS[settings.hard_bounder]` on their split-clamped relaxation, from the domain's
    slopes, with `prox_iterations` iterations. With `hard_warm_start` and a bounder of
    `WARM_STARTS` (the active set), a domain it bounded keeps its duals and cuts (`starts`,
    `verify.bab.warm`) and its descendants start from them where that is better (stats
    `hard_warm_given`: domains with a stored start, `hard_warm_used`: domains where some row
    started from it). With the recheck, a domain closes only on its float64-evaluated bound.
    `HardBounder.of` gives None when the stage is off or the bounder cannot take the graph
    (then the stage is skipped)."""

    def __init__(self, bounder: ReluBounder, layers, layers64):
        self.bounder, self.t, self.settings = bounder, bounder.t, bounder.settings
        self.layers, self.layers64 = layers, layers64
        settings = self.settings
        warm = settings.hard_warm_start and settings.hard_bounder in WARM_STARTS
        self.starts = WarmStarts(settings.hard_warm_memory_gb * 1e9) if warm else None

    @staticmethod
    def of(bounder: ReluBounder) -> HardBounder | None:
        settings, t = bounder.settings, bounder.t
        if not settings.prox_iterations:
            return None
        prepare, _ = HARD_BOUNDERS[settings.hard_bounder]
        try:
            layers = prepare(t.graph)
            layers64 = prepare(t.check.graph) if t.check.active else None
        except UnsupportedOperationError:
            return None
        return HardBounder(bounder, layers, layers64)

    def hard(self, d: ReluDomains) -> Tensor:
        """`[N]` bool: the domains predicted hard."""
        deep = d.depth >= self.settings.prox_min_depth
        return deep & (d.stall >= self.settings.hard_stall)

    def bound(self, d: ReluDomains) -> ReluDomains:
        """`d` (open domains) re-bounded, in chunks of the batch size (halved on out-of-memory)
        within the deadline; `warm` set to the ids of their stored duals."""
        t = self.t
        tick = time.perf_counter()

        def chunk(part: slice) -> tuple[Tensor, Tensor | None, Tensor]:
            return self.bound_rows(d.take(torch.arange(len(d), device=t.device)[part]))

        parts = in_chunks(len(d), t.sizer, t.deadline, chunk)
        rows = torch.maximum(d.rows, torch.cat([p[0] for p in parts]))
        margin = (rows - t.tol[t.rows_of[d.poly]]).amax(1)
        if t.check.active:
            values64 = torch.cat([p[1] for p in parts])
            closed64 = (values64 - t.check.tol[t.rows_of[d.poly]]).amax(1) > 0
            claims = int((margin > 0).sum())
            t.check.record(claims, int(((margin > 0) & ~closed64).sum()), 0.0)
            margin = torch.where(closed64, margin.abs() + 1, margin.clamp(max=0))
        stats = t.stats
        stats["prox_domains"] = stats.get("prox_domains", 0) + len(d)
        stats["prox_pruned"] = stats.get("prox_pruned", 0) + int((margin > 0).sum())
        stats["prox_seconds"] = stats.get("prox_seconds", 0.0) + time.perf_counter() - tick
        if self.starts is not None:
            stats["hard_warm_bytes"] = max(stats.get("hard_warm_bytes", 0), self.starts.peak)
        warm = torch.cat([p[2] for p in parts])
        return ReluDomains(d.splits, d.alpha, d.beta, d.poly, rows, margin, d.depth, d.stall,
                           warm)  # fmt: skip

    def bound_rows(self, d: ReluDomains) -> tuple[Tensor, Tensor | None, Tensor]:
        """`[N, r]` lower bounds of the rows' `C y - b` by the hard bounder on each domain's
        split-clamped relaxation (`bounds.dual.split_domains`), (when rechecking, else None)
        the same duals' float64 bound for the rows as written in the file, and `[N]` the ids
        of the duals stored for the domains' children (`d.warm` when none are kept)."""
        t, bounder = self.t, self.bounder
        n, rows = len(d), t.rows_of[d.poly]
        shape_in = t.box.lower.shape[1:]
        box = Interval(*(x.expand(n, *shape_in) for x in (t.box.lower, t.box.upper)))
        shape = (n, rows.shape[1], *t.graph.output.shape)
        views = t.layout.views(d.alpha, t.layout.acts)
        exact = None
        if self.layers64 is not None:
            intervals64 = bounder.intervals(d.splits, bounder.base64)
            exact = (self.layers64, intervals64, t.check.spec.C[rows].reshape(shape))
        deadline = None if t.deadline == float("inf") else t.deadline
        _, bound = HARD_BOUNDERS[self.settings.hard_bounder]
        warm = None if self.starts is None else self.starts.get(d.warm)
        result = bound(
            self.layers, box, bounder.intervals(d.splits), t.spec.C[rows].reshape(shape),
            tuple(views[a] for a in t.layout.acts), self.settings.prox_iterations, deadline,
            exact, warm,
        )  # fmt: skip
        values64 = None if result.lower64 is None else result.lower64 - t.check.spec.b[rows]
        ids = d.warm
        if self.starts is not None and result.start is not None:
            ids = self.starts.add(result.start)
        if warm is not None:
            stats = t.stats
            stats["hard_warm_given"] = stats.get("hard_warm_given", 0) + int(warm.given.sum())
            used = int(result.warm.any(1).sum())
            stats["hard_warm_used"] = stats.get("hard_warm_used", 0) + used
        return result.lower - t.spec.b[rows], values64, ids


class StratifiedBounder:
    """The ReLU-splitting `Bounder`: `easy` (alpha-beta-CROWN) on every domain, then `hard`
    (None: off) on the domains it leaves open that `hard.hard` predicts hard."""

    def __init__(self, easy: ReluBounder, hard: HardBounder | None):
        self.easy, self.hard = easy, hard

    def bound(self, domains: ReluDomains, iterations: int | None = None):
        bounded, points = self.easy.bound(domains, iterations)
        if self.hard is None:
            return bounded, points
        index = ((bounded.margin <= 0) & self.hard.hard(bounded)).nonzero().flatten()
        if not len(index):
            return bounded, points
        return bounded.put(index, self.hard.bound(bounded.take(index))), points


class ReluBrancher:
    """Brancher of ReLU-split domains: per parent the neuron to split (`settings.branching`:
    BaBSR, or FSB's best candidate by its children's one-pass bounds) and the two children,
    warm-started from the parent (see `relu_branching`)."""

    def __init__(self, target: Target, settings: ReluSplitConfig):
        self.t, self.settings = target, settings
        self.bias = pre_biases(target.graph, target.layout, target.box.lower)
        self.slopes = side_slopes(target.graph, target.layout, target.box.lower)

    def choose(self, parents: ReluDomains, bounder: ReluBounder) -> tuple[Tensor, Tensor]:
        """`[N]` the flat neuron to split per parent (-1: none left), and the parents'
        coefficients at the ReLU outputs `[N, r, n]`."""
        flat = bounder.flat_intervals(parents.splits)
        mask = branchable(flat.lower, flat.upper, parents.splits)
        lam = bounder.coefficients(parents)
        best = lam[torch.arange(len(parents), device=self.t.device), parents.rows.argmax(dim=1)]
        score, gain = babsr_scores(best, flat.lower, flat.upper, self.bias, mask, self.slopes)
        if self.settings.branching == "babsr":
            choice = score.argmax(dim=1)
        else:
            cands = candidates((score, gain), self.settings.fsb_candidates)
            choice = self._fsb(parents, cands, bounder)
        return torch.where(mask.any(dim=1), choice, torch.full_like(choice, -1)), lam

    def _fsb(self, parents: ReluDomains, cands: Tensor, bounder: ReluBounder) -> Tensor:
        """Per parent the candidate of `cands [N, K]` chosen by `relu_branching.fsb_pick` from
        the one-pass bounds of its children, in groups of the batch size (deadline between)."""
        t = self.t
        k = cands.shape[1]
        group = max(1, t.sizer.size // (2 * k))
        picks = []
        for start in range(0, len(parents), group):
            if passed(t.deadline):
                raise DeadlineReachedError
            index = torch.arange(start, min(start + group, len(parents)), device=t.device)
            part = parents.take(index)

            def margins(splits, rep, part=part):
                rows = t.rows_of[part.poly[rep]]
                C = t.spec.C[rows]
                lower = bounder.one_pass(splits, part.alpha[rep], part.beta[rep], C).lower
                return (lower - t.spec.b[rows] - t.tol[rows]).amax(1)

            picks.append(fsb_pick(part.splits, cands[index], margins))
        return torch.cat(picks)

    def children(self, parents: ReluDomains, bounder: StratifiedBounder) -> Children:
        """Split each parent on its chosen neuron and bound the children; parents with nothing
        left to split get a long optimisation instead (`final_iterations`: their relaxation is
        exact for the optimal multipliers), and those still open are counted as unsplittable
        (dropped, never proven)."""
        t, popped = self.t, 2 * len(parents)
        tick = time.perf_counter()
        choice, lam = self.choose(parents, bounder.easy)
        t.stats["branch_seconds"] += time.perf_counter() - tick
        stuck = choice < 0
        tried = []
        if stuck.any():
            done, points = bounder.bound(parents.take(stuck.nonzero().flatten()),
                                         self.settings.final_iterations)  # fmt: skip
            is_open = (done.margin <= 0).nonzero().flatten()
            t.stats["unsplittable"] += len(is_open)
            tried.append(points[is_open].flatten(0, 1))
            keep = (~stuck).nonzero().flatten()
            parents, choice, lam = parents.take(keep), choice[keep], lam[keep]
        if not len(parents):
            none = tried[0][:0]
            return Children(parents, tried[0], none, popped)
        children, points = bounder.bound(self.split(parents, choice, lam))
        t.stats["max_depth"] = max(t.stats["max_depth"], int(children.depth.max()))
        is_open = (children.margin <= 0).nonzero().flatten()
        children, points = children.take(is_open), points[is_open]
        tried.append(points.flatten(0, 1))
        return Children(children, torch.cat(tried), points[:, 0], popped)

    def split(self, parents: ReluDomains, choice: Tensor, lam: Tensor) -> ReluDomains:
        """Two children per parent (active ones first), warm-started from the parent
        (`lam [N, r, n]`: the parent's coefficients at the ReLU outputs, see
        `relu_branching.with_split`); each keeps its parent's rows, margin and stall count until
        it is bounded, and its parent's warm start for the hard bounder (`verify.bab.warm`)."""
        two = lambda x: torch.cat([x, x])  # noqa: E731
        n = len(parents)
        sign = torch.ones(2 * n, dtype=torch.int8, device=self.t.device)
        sign[n:] = -1
        splits, beta = with_split(
            two(parents.splits), two(parents.alpha), two(parents.beta), two(lam), two(choice), sign
        )
        return ReluDomains(
            splits, two(parents.alpha), beta, two(parents.poly), two(parents.rows),
            two(parents.margin), two(parents.depth) + 1, two(parents.stall), two(parents.warm),
        )  # fmt: skip


class ReluBab(RegionSearch):
    """ReLU-splitting branch and bound on one region (a `Search`: `run(deadline)` returns a
    `RegionOutcome`). `config` is a `verify.bab.BabConfig` (its `relu` field holds the
    ReLU-splitting settings; batch sizes, attacks, `max_domains` and `prune_tol` are shared)."""

    def __init__(self, net: nn.Module, region: Region, config: Any, seed: int = 0):
        self.net, self.region, self.config, self.settings = net, region, config, config.relu
        self.shape = tuple(getattr(net, "input_shape", None) or (len(region.lower),))
        param = next(net.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.stats: dict[str, Any] = {"mode": "relu", "domains": 0, "batches": 0, "max_open": 0}
        self.stats |= {"max_depth": 0, "attacks": 0, "unsplittable": 0}
        self.stats |= {"root_seconds": 0.0, "branch_seconds": 0.0, "attack_seconds": 0.0}
        graph = build_graph(net, self.shape)
        graph = graph.to(self.dtype, self.device) if self.device.type != "cpu" else graph
        check = Float64Check(graph, region, config, self.stats, combine=False)
        box = Interval(*(x.to(self.device).reshape(1, *self.shape)
                         for x in outward_box(region, self.dtype)))  # fmt: skip
        dtype64 = check.spec.C.dtype  # float64, or the network's when no recheck
        box64 = Interval(box.lower.to(dtype64), box.upper.to(dtype64))
        self.spec = UnsafeSpec.of(region, self.dtype, self.device)
        tol = config.prune_tol * (1 + self.spec.b.abs())  # per row
        layout = Layout.of(graph, graph.split_pairs())
        self.target = Target(graph, layout, box, box64, self.spec, polytope_rows(self.spec), tol,
                             check, BatchSizer(config), self.stats)  # fmt: skip
        self.value_tol = self.value_tolerance(self.spec)
        easy = ReluBounder(self.target, self.settings)
        self.bounder = StratifiedBounder(easy, HardBounder.of(easy))
        self.brancher = ReluBrancher(self.target, self.settings)
        self.fanout = 2
        self.max_open = self._max_open()
        self.last_attack = self.started = time.monotonic()

    @property
    def deadline(self) -> float:
        return self.target.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.target.deadline = value

    @property
    def sizer(self) -> BatchSizer:
        return self.target.sizer

    def _max_open(self) -> int:
        """Open domains allowed: `max_domains`, and `max_memory_gb` of slopes and multipliers."""
        t = self.target
        rows = 1 if t.rows_of is None else t.rows_of.shape[1]
        size = t.box.lower.element_size()
        per_domain = t.layout.total * (2 * rows * size + 1) + rows * size + 40
        return int(min(self.config.max_domains, self.settings.max_memory_gb * 1e9 / per_domain))

    # ----- the Search protocol -----

    def begin(self) -> tuple[ReluDomains, Found]:
        """The root (intermediate bounds, root bounds, their float64 confirmation and primal
        points): the open root domains and a validated counterexample, if one was found."""
        tick = time.perf_counter()
        t = self.target
        if t.rows_of is None:  # a polytope without rows: every point of the box is unsafe
            found = validate(self.net, self.region, t.box.center)
            self.stats["unsplittable"] += int(found is None)  # nothing to split: "unknown"
            return self._none(), found
        roots, found = self.bounder.easy.root(self._try_points)
        self.stats["root_seconds"] = round(time.perf_counter() - tick, 3)
        self.last_attack = self.started = time.monotonic()
        return roots.open(), found

    def too_many(self, open_: ReluDomains) -> bool:
        return len(open_) > self.max_open

    def unproven(self) -> int:
        """Domains with nothing left to split that their bound did not exclude: dropped from
        the search, so the answer cannot be "unsat"."""
        return int(self.stats["unsplittable"])

    # ----- one step -----

    def step(self, open_: ReluDomains) -> tuple[ReluDomains, Found]:
        """`RegionSearch.step`, then the hard bounder's stored warm starts that no open domain
        refers to are dropped (`verify.bab.warm.WarmStarts.keep`)."""
        open_, found = super().step(open_)
        hard = self.bounder.hard
        if hard is not None and hard.starts is not None:
            hard.starts.keep(open_.warm)
        return open_, found

    def _none(self) -> ReluDomains:
        t = self.target
        empty = torch.zeros(0, dtype=torch.long, device=t.device)
        flat = torch.zeros(0, t.layout.total, device=t.device)
        return ReluDomains(flat.to(torch.int8), flat[:, None], flat[:, None], empty,
                           flat[:, :1], empty.to(flat), empty, empty)  # fmt: skip

    def _attack(self, children: Children) -> Found:
        """PGD over the box towards the polytope of the worst open child, from the primal
        points of the worst open children of that polytope."""
        d = children.domains
        worst = d.margin.argsort()[: self.config.attack_domains]
        if not len(worst):
            return None
        t = self.target
        points, poly = children.starts[worst], d.poly[worst]
        target = poly[0]
        starts = points[poly == target].reshape(-1, *self.shape)
        rows = t.rows_of[target]
        owner = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        spec = UnsafeSpec(self.spec.C[rows], self.spec.b[rows], owner, 1)
        steps = self.config.attack.steps
        found, values = pgd(self.net, t.box.lower, t.box.upper, spec, starts, steps,
                            deadline=self.deadline)  # fmt: skip
        return self._validate_best(found, values)
