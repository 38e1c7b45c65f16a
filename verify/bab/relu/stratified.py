"""The stratified bounder of ReLU splitting (`StratifiedBounder`, the search's `Bounder`):
alpha-beta-CROWN (`ReluBounder`) on every domain, then optionally a tighter, costlier bounder
(`HardBounder`: `verify.bab.relu.hard_bounder.HARD_BOUNDERS`, the proximal Planet solver or the
Anderson active set) on the open children predicted hard. Off by default, as measured (see the
issue-4 and issue-13 notes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.registry import get_method
from bounds.types import Interval
from verify.bab.common import Found, in_chunks
from verify.bab.relu.bounder import ReluBounder
from verify.bab.relu.domains import ReluDomains, Target
from verify.bab.relu.hard_bounder import HARD_BOUNDERS
from verify.bab.relu.warm import WarmStarts


class HardBounder:
    """The stratified stage (De Palma et al. 2021, "Scaling the convex barrier with active
    sets", Sec. 5; the OVAL framework): the children that alpha-beta-CROWN leaves open and
    that look hard (`hard`: depth >= `prox_min_depth` and, with `hard_stall` > 0, a bound that
    improved little over that many splits in a row) are re-bounded by the dual bounder
    `HARD_BOUNDERS[settings.hard_bounder]` on their split-clamped relaxation, from the domain's
    slopes, with `prox_iterations` iterations. With `hard_warm_start` and a bounder of
    `WARM_STARTS` (registered with the `warm_start` capability: the active set), a domain it bounded keeps its duals and cuts (`starts`,
    `verify.bab.relu.warm`) and its descendants start from them where that is better (stats
    `hard_warm_given`: domains with a stored start, `hard_warm_used`: domains where some row
    started from it). With the recheck, a domain closes only on its float64-evaluated bound.
    `HardBounder.of` gives None when the stage is off or the bounder cannot take the graph
    (then the stage is skipped)."""

    def __init__(self, bounder: ReluBounder, layers: Any, layers64: Any) -> None:
        self.bounder, self.t, self.settings = bounder, bounder.t, bounder.settings
        self.layers, self.layers64 = layers, layers64
        settings = self.settings
        warm = settings.hard_warm_start and get_method(settings.hard_bounder).warm_start
        self.starts = WarmStarts(settings.hard_warm_memory_gb * 1e9) if warm else None

    @staticmethod
    def of(bounder: ReluBounder) -> HardBounder | None:
        """The stage for `bounder`'s search, or None (class docstring)."""
        settings, t = bounder.settings, bounder.t
        if not settings.prox_iterations:
            return None
        prepare = HARD_BOUNDERS[settings.hard_bounder].prepare
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
        split-clamped relaxation (`verify.bab.relu.hard_bounder`), (when rechecking, else None)
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
        bound = HARD_BOUNDERS[self.settings.hard_bounder].bound
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

    def __init__(self, easy: ReluBounder, hard: HardBounder | None) -> None:
        self.easy, self.hard = easy, hard

    def root(
        self, try_points: Callable[[Tensor], Found], validate: Callable[[Tensor], Found]
    ) -> tuple[ReluDomains, Found]:
        """The root (intermediate bounds, root bounds, their float64 confirmation and primal
        points, `ReluBounder.root`): the open root domains and a validated counterexample, if
        one was found. A polytope without rows makes every point of the box unsafe: its centre
        is validated, and nothing is left to split."""
        tick = time.perf_counter()
        t = self.easy.t
        if t.rows_of is None:
            found = validate(t.box.center)
            t.stats["unsplittable"] += int(found is None)  # nothing to split: "unknown"
            return no_domains(t), found
        roots, found = self.easy.root(try_points)
        t.stats["root_seconds"] = round(time.perf_counter() - tick, 3)
        return roots.open(), found

    def bound(
        self, domains: ReluDomains, iterations: int | None = None
    ) -> tuple[ReluDomains, Tensor]:
        """`ReluBounder.bound`, then the hard stage on the open domains predicted hard."""
        bounded, points = self.easy.bound(domains, iterations)
        if self.hard is None:
            return bounded, points
        index = ((bounded.margin <= 0) & self.hard.hard(bounded)).nonzero().flatten()
        if not len(index):
            return bounded, points
        return bounded.put(index, self.hard.bound(bounded.take(index))), points

    def retain(self, open_: ReluDomains) -> None:
        """The hard bounder's stored warm starts that no open domain refers to are dropped
        (`verify.bab.relu.warm.WarmStarts.keep`)."""
        if self.hard is not None and self.hard.starts is not None:
            self.hard.starts.keep(open_.warm)


def no_domains(t: Target) -> ReluDomains:
    """An empty batch of domains."""
    empty = torch.zeros(0, dtype=torch.long, device=t.device)
    flat = torch.zeros(0, t.layout.total, device=t.device)
    return ReluDomains(flat.to(torch.int8), flat[:, None], flat[:, None], empty,
                       flat[:, :1], empty.to(flat), empty, empty)  # fmt: skip
