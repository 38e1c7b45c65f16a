"""Branch and bound with ReLU splitting over batches of domains (one VNN-LIB region).

A domain is the region's input box, one unsafe polytope to exclude, and an assignment of some
ReLUs to active (`xh >= 0`) or inactive (`xh <= 0`). It is bounded by alpha-beta-CROWN
(`bounds/methods/beta_crown.py`: the split constraints enter both the intervals, `l = 0` for
active and `u = 0` for inactive neurons, and the bound through their Lagrange multipliers
`beta`) with the intermediate bounds of the root (alpha-CROWN-tightened, clamped by the
domain's splits), so one bound costs one backward pass per Adam step. Children continue their
parent's optimisation: its last slopes `alpha` and multipliers `beta`, the new split's `beta`
chosen so that the child's functional equals the parent's where that is possible (see
`verify.branching.with_split`), and a child's bound is never reported below its parent's (valid
on the child, which is a subset).

Each step pops the open domains of smallest margin (best-first), picks one ambiguous neuron per
domain (BaBSR, or FSB: the best of the top candidates of BaBSR and of the intercept score,
judged by both children's one-pass bounds), bounds both children, prunes those whose bound
excludes their polytope, tries the open children's primal points (the box minimisers of their
bounds) as counterexamples, runs PGD from the worst ones now and then, and keeps the rest (Bunel
et al. 2020, JMLR; Wang et al. 2021, beta-CROWN; De Palma et al. 2021, FSB). The region holds
when no domain is left; a domain with no neuron left to split that its bound cannot exclude
makes the answer "unknown", never "unsat".

Float32 networks are searched in float32 on float64 foundations: the root's intermediate bounds
are computed in float64 and rounded outwards to float32, and a domain is pruned only once its
closing bound, evaluated again in float64 at the same slopes and multipliers (`SplitResult.
best_alpha`, `best_beta`) on the same intervals, still excludes its polytope (`_confirmed`; a
domain that fails stays open). See `bab_common.Float64Check`.

Optionally (`ReluSplitConfig.prox_iterations > 0`, CLI `--prox-sweeps`), the children that
alpha-beta-CROWN leaves open are re-bounded by the proximal Lagrangian-decomposition solver on
their split-clamped Planet relaxation (`ReluBab._prox`). Off by default: with the root's
intermediate bounds both solve the same LP, and on mnist_fc the extra sweeps pruned 15 of 3,563
domains while doubling the time (see the issue-4 note).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from bounds.dual.split_domains import HARD_BOUNDERS
from bounds.errors import UnsupportedOperationError
from bounds.methods import beta_crown
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.beta_crown import SplitResult, relu_nodes
from bounds.methods.crown import crown_intervals
from bounds.methods.pacing import passed
from bounds.types import Budget, Interval
from verify.api import network_graph
from verify.attack import UnsafeSpec, pgd, validate
from verify.bab_common import (
    BatchSizer,
    DeadlineReachedError,
    DomainBatch,
    Float64Check,
    RegionOutcome,
    RegionSearch,
    is_out_of_memory,
    outward,
    outward_box,
    rounded_down,
)
from verify.branching import (  # ReluSplitConfig: re-exported, defined there with its settings
    Layout,
    ReluSplitConfig,
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
from verify.property import Region

__all__ = ["ReluBab", "ReluDomains", "ReluSplitConfig", "relu_only"]


def relu_only(net: nn.Module, n_inputs: int) -> bool:
    """Whether every activation of `net` is a ReLU (so ReLU splitting applies)."""
    shape = tuple(getattr(net, "input_shape", None) or (n_inputs,))
    try:
        relu_nodes(network_graph(net, shape))
    except (NotImplementedError, UnsupportedOperationError):
        return False
    return True


@dataclass
class ReluDomains(DomainBatch):
    """Open domains, flat over the ReLU neurons (`Layout`): `splits [N, n]` int8 (+1 active,
    -1 inactive, 0 free); `alpha`, `beta [N, r, n]`; `poly [N]` the unsafe polytope to exclude;
    `rows [N, r]` lower bounds of its rows' `C y - b` (padded by repeating a row); `margin [N]`
    the best row minus its tolerance (> 0: excluded); `depth [N]` the number of splits."""

    splits: Tensor
    alpha: Tensor
    beta: Tensor
    poly: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor


class ReluBab(RegionSearch):
    """ReLU-splitting branch and bound on one region; `run(deadline)` returns a
    `RegionOutcome`. `config` is a `verify.bab.BabConfig` (its `relu` field holds the
    ReLU-splitting settings; batch sizes, attacks, `max_domains` and `prune_tol` are shared)."""

    def __init__(self, net: nn.Module, region: Region, config: Any):
        self.net, self.region, self.config, self.settings = net, region, config, config.relu
        self.shape = tuple(getattr(net, "input_shape", None) or (len(region.lower),))
        param = next(net.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.stats: dict[str, Any] = {"mode": "relu", "domains": 0, "batches": 0, "max_open": 0}
        self.stats |= {"max_depth": 0, "attacks": 0, "unsplittable": 0}
        self.stats |= {"root_seconds": 0.0, "branch_seconds": 0.0, "attack_seconds": 0.0}
        graph = network_graph(net, self.shape)
        self.graph = graph.to(self.dtype, self.device) if self.device.type != "cpu" else graph
        self.check = Float64Check(self.graph, region, config, self.stats, combine=False)
        self.layout = Layout.of(self.graph, relu_nodes(self.graph))
        self.net_layers = self._layers(self.graph) if self.settings.prox_iterations else None
        self.layers64 = self._layers(self.check.graph) if self.net_layers else None
        box = (t.to(self.device).reshape(1, *self.shape) for t in outward_box(region, self.dtype))
        self.box = Interval(*box)
        dtype64 = self.check.spec.C.dtype  # float64, or the network's when no recheck
        self.box64 = Interval(self.box.lower.to(dtype64), self.box.upper.to(dtype64))
        self.spec = UnsafeSpec.of(region, self.dtype, self.device)
        self.tol = config.prune_tol * (1 + self.spec.b.abs())  # per row
        self.rows_of = polytope_rows(self.spec)  # [P, r] row indices, padded by repetition
        self.value_tol = self.value_tolerance(self.spec)
        self.bias = pre_biases(self.graph, self.layout, self.box.lower)
        self.slopes = side_slopes(self.graph, self.layout, self.box.lower)
        self.base = Interval(self.box.lower, self.box.upper)  # flat root intervals, set by _root
        self.base64 = self.base  # the same in float64 (for the recheck), set by _root
        self.sizer = BatchSizer(config)
        self.max_open = self._max_open()
        self.deadline = float("inf")
        self.worst: tuple[Tensor, Tensor] | None = None  # primal points, polytopes of the worst

    def _layers(self, graph):
        """The network in the hard-domain bounder's form (`HARD_BOUNDERS`; None when it cannot
        take the graph: the stage is skipped)."""
        prepare, _ = HARD_BOUNDERS[self.settings.hard_bounder]
        try:
            return prepare(graph)
        except UnsupportedOperationError:
            return None

    def _max_open(self) -> int:
        """Open domains allowed: `max_domains`, and `max_memory_gb` of slopes and multipliers."""
        rows = 1 if self.rows_of is None else self.rows_of.shape[1]
        size = self.box.lower.element_size()
        per_domain = self.layout.total * (2 * rows * size + 1) + rows * size + 32
        return int(min(self.config.max_domains, self.settings.max_memory_gb * 1e9 / per_domain))

    def _search(self) -> RegionOutcome:
        if not self.region.unsafe:
            return RegionOutcome("unsat", None, self.stats)
        if self.rows_of is None:  # a polytope without rows: every point of the box is unsafe
            found = validate(self.net, self.region, self.box.center)
            return RegionOutcome("sat" if found else "unknown", found, self.stats)
        tick = time.perf_counter()
        open_, found = self._root()
        self.stats["root_seconds"] = round(time.perf_counter() - tick, 3)
        if found is not None:
            return RegionOutcome("sat", found, self.stats)
        last_attack = start = time.monotonic()
        while len(open_):
            left = self.deadline - time.monotonic()
            if left <= 0:
                return RegionOutcome("timeout", None, self.stats)
            if len(open_) > self.max_open:
                return RegionOutcome("unknown", None, self.stats)
            parents, rest = open_.pop(max(1, self.sizer.allowed(left) // 2))
            tick = time.perf_counter()
            children, found = self._step(parents)
            if found is None and self._attack_due(last_attack, start):
                tick_attack = time.monotonic()
                found, last_attack = self._pgd(), time.monotonic()
                self.stats["attack_seconds"] += last_attack - tick_attack
            if found is not None:
                return RegionOutcome("sat", found, self.stats)
            self.sizer.record(2 * len(parents), time.perf_counter() - tick)
            open_ = ReluDomains.cat([rest, children])
            self.stats["max_open"] = max(self.stats["max_open"], len(open_))
        status = "unknown" if self.stats["unsplittable"] else "unsat"
        return RegionOutcome(status, None, self.stats)

    # ----- the root -----

    def _root(self) -> tuple[ReluDomains, tuple[Tensor, Tensor] | None]:
        """The open root domains (one per polytope the root bound does not exclude) and a
        validated counterexample among the root's primal points, if any."""
        tick = time.perf_counter()
        intervals = crown_intervals(self.check.graph, self.box64, deadline=self.deadline)
        crown_seconds = time.perf_counter() - tick
        self._set_base(flat_intervals(intervals, self.layout))
        tick = time.perf_counter()
        lower, alpha, points, best = self._root_bound()
        settings, m = self.settings, self.spec.C.shape[0]
        per_pass = (time.perf_counter() - tick) / (m * (settings.root_iterations + 1))
        self.sizer.seed(per_pass * (settings.iterations + 1))  # a child: one row, fewer steps
        found = self._try_points(points)
        if (
            found is None
            and not self._excluded(lower).all()
            and self._tighten(intervals, crown_seconds)
        ):
            lower, alpha, points, best = self._root_bound(alpha)
            found = self._try_points(points)
        rows = self.rows_of  # [P, r]: one root domain per polytope
        n = len(rows)
        splits = torch.zeros(n, self.layout.total, dtype=torch.int8, device=self.device)
        values = lower[0, rows] - self.spec.b[rows]
        margin = (values - self.tol[rows]).amax(1)
        poly = torch.arange(n, device=self.device)
        depth = torch.zeros(n, dtype=torch.long, device=self.device)
        zeros = torch.zeros_like(alpha[0, rows])
        roots = ReluDomains(splits, alpha[0, rows], zeros, poly, values, margin, depth)
        return self._confirmed(roots, best[0, rows], zeros).open(), found

    def _set_base(self, flat: Interval) -> None:
        """The root's flat intervals `[1, n]` (float64 when rechecking): `base` for the search,
        rounded outwards to the network's dtype, and `base64`, the same values in float64."""
        if not self.check.active:
            self.base = self.base64 = flat
            return
        self.base = outward(flat, self.dtype)
        self.base64 = Interval(self.base.lower.double(), self.base.upper.double())

    def _root_bound(self, alpha: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Root bounds of every row `[1, m]`, the last slopes `[1, m, n]`, the primal points and
        the slopes of each row's best bound `[1, m, n]`."""
        m = self.spec.C.shape[0]
        splits = torch.zeros(1, self.layout.total, dtype=torch.int8, device=self.device)
        if alpha is None:
            views = beta_crown.default_alpha(self.graph, self._intervals(splits), m)
            alpha = self.layout.flatten(views, self.layout.acts)
        result = self._optimise(
            splits, alpha, torch.zeros_like(alpha), self.spec.C.unsqueeze(0), None,
            self.settings.root_iterations,
        )  # fmt: skip
        self.stats["domains"] += 1
        points = beta_crown.minimiser(result.last.input_coeff, self.box)[0]
        last = self.layout.flatten(result.alpha, self.layout.acts)
        best = last if result.best_alpha is None else self._flat(result.best_alpha)
        return result.lower, last, points, best

    def _excluded(self, lower: Tensor) -> Tensor:
        """`[P]` bool: some row of each polytope has its root bound `lower [1, m]` above
        `b + tol`."""
        above = lower[0] - self.spec.b > self.tol
        return above[self.rows_of].any(dim=1)

    def _tighten(self, intervals: dict[str, Interval], crown_seconds: float) -> bool:
        """Tighten the root's intermediate bounds (float64 `intervals`, when rechecking) by
        alpha-CROWN in the same dtype, within its share of the time left; False when off, or
        when that share is under one iteration's predicted time (a forward pass over every
        layer's neurons, as long as the root's CROWN intervals took (`crown_seconds`), and a
        backward pass of about twice that): an iteration cut short tightens nothing, and its
        slopes and moments alone take a second to allocate on a net of eight 1024-neuron
        layers."""
        iterations, share = self.settings.intermediate_iterations, self.settings.intermediate_share
        left = self.deadline - time.monotonic()
        if iterations == 0 or share == 0 or share * left < 3 * crown_seconds:
            return False
        config = AlphaCrownConfig(iterations=iterations, optimize_intermediate=True)
        C = self.check.spec.C.unsqueeze(0)
        budget = Budget(seconds=max(1e-3, share * left))
        tightened = alpha_crown(self.check.graph, self.box64, C, config, budget,
                                intervals=intervals, deadline=self.deadline)[2]  # fmt: skip
        new = flat_intervals(tightened, self.layout)
        lower = torch.maximum(self.base64.lower, new.lower)
        self._set_base(Interval(lower, torch.minimum(self.base64.upper, new.upper)))
        return True

    # ----- bounding -----

    def _flat(self, per_layer: dict[str, Tensor]) -> Tensor:
        return self.layout.flatten(per_layer, self.layout.acts)

    def _intervals(self, splits: Tensor, base: Interval | None = None) -> dict[str, Interval]:
        """Per pre-activation node the root intervals (`base`, default `self.base`) clamped by
        `splits [N, n]`."""
        flat = beta_crown.clamp_by_splits(self.base if base is None else base, splits)
        lower = self.layout.views(flat.lower, self.layout.pres)
        upper = self.layout.views(flat.upper, self.layout.pres)
        return {p: Interval(lower[p], upper[p]) for p in self.layout.pres}

    def _flat_intervals(self, splits: Tensor) -> Interval:
        """The flat root intervals `[N, n]` clamped by `splits [N, n]`."""
        return beta_crown.clamp_by_splits(self.base, splits)

    def _optimise(self, splits, alpha, beta, C, target, iterations: int) -> SplitResult:
        """alpha-beta-CROWN on the domains `splits [N, n]` from `alpha`, `beta [N, S, n]`."""
        layout = self.layout
        return beta_crown.optimise(
            self.graph, self.box, C, self._intervals(splits), layout.views(splits, layout.pres),
            layout.views(alpha, layout.acts), layout.views(beta, layout.acts),
            self.settings.bound_config(iterations), target=target, deadline=self.deadline,
            keep_best=self.check.active,
        )  # fmt: skip

    def _bound(self, domains: ReluDomains, iterations: int) -> tuple[ReluDomains, Tensor]:
        """`domains` with fresh bounds (never below their `rows`, which must be valid on them,
        e.g. the parent's), slopes and multipliers, and their primal points
        `[N, r, *input_shape]`; in chunks of the batch size (halved on out-of-memory), checking
        the deadline between chunks. A margin > 0 (closed) is confirmed in float64."""
        parts, points, start = [], [], 0
        while start < len(domains):
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise DeadlineReachedError
            size = min(self.sizer.size, self.sizer.allowed(left))
            chunk = domains.take(torch.arange(start, min(start + size, len(domains))))
            try:
                bounded, found = self._bound_chunk(chunk, iterations)
            except RuntimeError as error:
                if not is_out_of_memory(error) or self.sizer.size == 1:
                    raise
                self.sizer.shrink()
                continue
            parts.append(bounded)
            points.append(found)
            start += len(chunk)
        self.stats["domains"] += len(domains)
        return ReluDomains.cat(parts), torch.cat(points)

    def _bound_chunk(self, d: ReluDomains, iterations: int) -> tuple[ReluDomains, Tensor]:
        rows = self.rows_of[d.poly]  # [N, r]
        b, tol = self.spec.b[rows], self.tol[rows]
        C = self.spec.C[rows]  # [N, r, n_out]
        result = self._optimise(d.splits, d.alpha, d.beta, C, b + tol, iterations)
        values = torch.maximum(result.lower - b, d.rows)  # the parent's bounds hold here too
        alpha, beta = self._flat(result.alpha), self._flat(result.beta)
        margin = (values - tol).amax(1)
        self.stats["batches"] += 1
        bounded = ReluDomains(d.splits, alpha, beta, d.poly, values, margin, d.depth)
        if result.best_alpha is not None:
            best = (self._flat(result.best_alpha), self._flat(result.best_beta))
            bounded = self._confirmed(bounded, *best)
        return bounded, beta_crown.minimiser(result.last.input_coeff, self.box)

    def _confirmed(self, d: ReluDomains, alpha: Tensor, beta: Tensor) -> ReluDomains:
        """`d` with each closed domain (margin > 0) confirmed: one float64 backward pass at the
        slopes `alpha` and multipliers `beta [N, r, n]` that gave its bound, on the same box and
        intervals (`base64`, clamped by its splits), for the rows of `C y - b` as written in the
        VNN-LIB file; a domain whose float64 bound does not exceed `b + tol` stays open, with
        its float64 rows (rounded down) and a margin <= 0."""
        closed = (d.margin > 0).nonzero().flatten()
        if not self.check.active or not len(closed):
            return d
        if not self.check.fits(len(closed), self.deadline):  # unconfirmed: they must not count
            raise DeadlineReachedError
        tick = time.perf_counter()
        rows = self.rows_of[d.poly[closed]]
        spec, layout, f64 = self.check.spec, self.layout, torch.float64
        splits = d.splits[closed]
        result = beta_crown.backward(
            self.check.graph, self.box64, spec.C[rows], self._intervals(splits, self.base64),
            layout.views(splits, layout.pres), layout.views(alpha[closed].to(f64), layout.acts),
            layout.views(beta[closed].to(f64), layout.acts),
        )  # fmt: skip
        values64 = result.lower - spec.b[rows]
        bad = (values64 - self.check.tol[rows]).amax(1) <= 0
        failed = closed[bad]
        values, margin = d.rows.clone(), d.margin.clone()
        values[failed] = rounded_down(values64[bad], values.dtype)
        margin[failed] = (values[failed] - self.tol[self.rows_of[d.poly[failed]]]).amax(1)
        margin[failed] = margin[failed].clamp(max=0)
        self.check.record(len(closed), len(failed), time.perf_counter() - tick)
        return ReluDomains(d.splits, d.alpha, d.beta, d.poly, values, margin, d.depth)

    def _prox_open(self, d: ReluDomains, points: Tensor) -> tuple[ReluDomains, Tensor]:
        """The open domains `d` of depth >= prox_min_depth re-bounded by `_prox` (in chunks of
        the batch size, within the deadline); returns those still open and their points. With
        the recheck, a domain closes only on its float64-evaluated bound."""
        deep = d.depth >= self.settings.prox_min_depth
        if not bool(deep.any()):
            return d, points
        tick = time.perf_counter()
        index = deep.nonzero().flatten()
        rows = d.rows.clone()
        closed64 = torch.zeros(len(d), dtype=torch.bool, device=self.device)
        for start in range(0, len(index), self.sizer.size):
            if time.monotonic() >= self.deadline:
                raise DeadlineReachedError
            part = index[start : start + self.sizer.size]
            values, values64 = self._prox(d.take(part))
            rows[part] = torch.maximum(rows[part], values)
            if values64 is not None:
                tol64 = self.check.tol[self.rows_of[d.poly[part]]]
                closed64[part] = (values64 - tol64).amax(1) > 0
        margin = (rows - self.tol[self.rows_of[d.poly]]).amax(1)
        if self.check.active:
            claims = int((margin > 0).sum())
            self.check.record(claims, int(((margin > 0) & ~closed64).sum()), 0.0)
            margin = torch.where(closed64, margin.abs() + 1, margin.clamp(max=0))
        d = ReluDomains(d.splits, d.alpha, d.beta, d.poly, rows, margin, d.depth)
        keep = (d.margin <= 0).nonzero().flatten()
        self.stats["prox_domains"] = self.stats.get("prox_domains", 0) + len(index)
        self.stats["prox_pruned"] = self.stats.get("prox_pruned", 0) + len(d) - len(keep)
        seconds = self.stats.get("prox_seconds", 0.0) + time.perf_counter() - tick
        self.stats["prox_seconds"] = seconds
        return d.take(keep), points[keep]

    def _prox(self, d: ReluDomains) -> tuple[Tensor, Tensor | None]:
        """`[N, r]` lower bounds of the rows' `C y - b` by the proximal solver on each domain's
        split-clamped Planet relaxation (`bounds.dual.split_domains`), and (when rechecking,
        else None) the same duals' float64 bound for the rows as written in the file."""
        n, rows = len(d), self.rows_of[d.poly]
        box = Interval(*(t.expand(n, *self.shape) for t in (self.box.lower, self.box.upper)))
        shape = (n, rows.shape[1], *self.graph.output.shape)
        views = self.layout.views(d.alpha, self.layout.acts)
        exact = None
        if self.check.active and self.layers64 is not None:
            intervals64 = self._intervals(d.splits, self.base64)
            exact = (self.layers64, intervals64, self.check.spec.C[rows].reshape(shape))
        deadline = None if self.deadline == float("inf") else self.deadline
        _, bound = HARD_BOUNDERS[self.settings.hard_bounder]
        lower, lower64 = bound(
            self.net_layers, box, self._intervals(d.splits), self.spec.C[rows].reshape(shape),
            tuple(views[a] for a in self.layout.acts), self.settings.prox_iterations, deadline,
            exact,
        )  # fmt: skip
        values64 = None if lower64 is None else lower64 - self.check.spec.b[rows]
        return lower - self.spec.b[rows], values64

    # ----- branching -----

    def _step(self, parents: ReluDomains) -> tuple[ReluDomains, tuple[Tensor, Tensor] | None]:
        """Split each parent on its chosen neuron, bound the children; returns the open
        children and a validated counterexample if one was found. Parents with nothing left to
        split get a long optimisation instead; those still open are counted as unsplittable."""
        tick = time.perf_counter()
        choice, lam = self._decide(parents)
        self.stats["branch_seconds"] += time.perf_counter() - tick
        stuck = choice < 0
        found = None
        if stuck.any():
            found = self._finish(parents.take(stuck.nonzero().flatten()))
            keep = (~stuck).nonzero().flatten()
            parents, choice, lam = parents.take(keep), choice[keep], lam[keep]
        if not len(parents) or found is not None:
            return parents.take(torch.arange(0)), found
        children, points = self._bound(self._split(parents, choice, lam), self.settings.iterations)
        self.stats["max_depth"] = max(self.stats["max_depth"], int(children.depth.max()))
        is_open = (children.margin <= 0).nonzero().flatten()
        children, points = children.take(is_open), points[is_open]
        if self.net_layers is not None and len(children):
            children, points = self._prox_open(children, points)
        worst = children.margin.argsort()[: self.config.attack_domains]
        self.worst = (points[worst, 0], children.poly[worst])
        return children, self._try_points(points.flatten(0, 1))

    def _finish(self, stuck: ReluDomains) -> tuple[Tensor, Tensor] | None:
        """Domains with no neuron left to split: a long optimisation (their relaxation is exact
        for the optimal multipliers); those left open are counted, never proven."""
        bounded, points = self._bound(stuck, self.settings.final_iterations)
        is_open = (bounded.margin <= 0).nonzero().flatten()
        self.stats["unsplittable"] += len(is_open)
        return self._try_points(points[is_open].flatten(0, 1)) if len(is_open) else None

    def _split(self, parents: ReluDomains, choice: Tensor, lam: Tensor) -> ReluDomains:
        """Two children per parent (active ones first), warm-started from the parent
        (`lam [N, r, n]`: the parent's coefficients at the ReLU outputs, see `branching.with_split`)."""
        two = lambda t: torch.cat([t, t])  # noqa: E731
        n = len(parents)
        sign = torch.ones(2 * n, dtype=torch.int8, device=self.device)
        sign[n:] = -1
        splits, beta = with_split(
            two(parents.splits), two(parents.alpha), two(parents.beta), two(lam), two(choice), sign
        )
        return ReluDomains(
            splits, two(parents.alpha), beta, two(parents.poly), two(parents.rows),
            two(parents.margin), two(parents.depth) + 1,
        )  # fmt: skip

    def _decide(self, parents: ReluDomains) -> tuple[Tensor, Tensor]:
        """`[N]` the flat neuron to split per parent (-1: none left), and the parents'
        coefficients at the ReLU outputs `[N, r, n]`."""
        flat = self._flat_intervals(parents.splits)
        mask = branchable(flat.lower, flat.upper, parents.splits)
        lam = self._coefficients(parents)
        best = lam[torch.arange(len(parents), device=self.device), parents.rows.argmax(dim=1)]
        score, gain = babsr_scores(best, flat.lower, flat.upper, self.bias, mask, self.slopes)
        if self.settings.branching == "babsr":
            choice = score.argmax(dim=1)
        else:
            cands = candidates((score, gain), self.settings.fsb_candidates)
            choice = self._fsb(parents, cands, lam)
        return torch.where(mask.any(dim=1), choice, torch.full_like(choice, -1)), lam

    def _coefficients(self, parents: ReluDomains) -> Tensor:
        """`[N, r, n]` the coefficients at the ReLU outputs of each parent's rows."""
        rows = self.rows_of[parents.poly]
        result = self._one_pass(parents.splits, parents.alpha, parents.beta, self.spec.C[rows])
        return self.layout.flatten(result.act_coeffs, self.layout.acts)

    def _one_pass(self, splits, alpha, beta, C) -> beta_crown.SplitBackward:
        layout = self.layout
        return beta_crown.backward(
            self.graph, self.box, C, self._intervals(splits), layout.views(splits, layout.pres),
            layout.views(alpha, layout.acts), layout.views(beta, layout.acts),
        )  # fmt: skip

    def _fsb(self, parents: ReluDomains, cands: Tensor, lam: Tensor) -> Tensor:
        """Per parent the candidate of `cands [N, K]` chosen by `branching.fsb_pick` from the
        one-pass bounds of its children, in groups of the batch size (deadline between)."""
        k = cands.shape[1]
        group = max(1, self.sizer.size // (2 * k))
        picks = []
        for start in range(0, len(parents), group):
            if passed(self.deadline):
                raise DeadlineReachedError
            index = torch.arange(start, min(start + group, len(parents)), device=self.device)
            part = parents.take(index)

            def margins(splits, rep, part=part):
                rows = self.rows_of[part.poly[rep]]
                C = self.spec.C[rows]
                lower = self._one_pass(splits, part.alpha[rep], part.beta[rep], C).lower
                return (lower - self.spec.b[rows] - self.tol[rows]).amax(1)

            picks.append(fsb_pick(part.splits, cands[index], margins))
        return torch.cat(picks)

    # ----- counterexamples -----

    def _try_points(self, points: Tensor) -> tuple[Tensor, Tensor] | None:
        """Evaluate `points [M, *input_shape]` (inside the box); validate the best ones."""
        if not len(points):
            return None
        return self._validate_best(points, self._violations(points))

    def _attack_due(self, last_attack: float, start: float) -> bool:
        """PGD every `attack_every` seconds, within 10% of the search time."""
        now = time.monotonic()
        spent = self.stats["attack_seconds"]
        return now - last_attack >= self.config.attack_every and spent <= 0.1 * (now - start)

    def _pgd(self) -> tuple[Tensor, Tensor] | None:
        """PGD over the box towards the polytope of the worst open domain, from the primal
        points of the worst open domains of that polytope."""
        if self.worst is None or not len(self.worst[0]):
            return None
        self.stats["attacks"] += 1
        points, poly = self.worst
        target = poly[0]
        starts = points[poly == target].reshape(-1, *self.shape)
        rows = self.rows_of[target]
        owner = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        spec = UnsafeSpec(self.spec.C[rows], self.spec.b[rows], owner, 1)
        lower, upper = self.box.lower, self.box.upper
        steps = self.config.attack.steps
        found, values = pgd(self.net, lower, upper, spec, starts, steps, deadline=self.deadline)
        return self._validate_best(found, values)
