"""The bounder of input splitting (`InputBounder`): every box by `BabConfig.method` (by
`strong_method` from depth `strong_depth` on), called through the bound-method registry on the
search's graph (`verify.bab.input.methods.bounds`), in chunks of the batch size.

Float32 networks are bounded in float32, but a domain is pruned only once the bound that closes
it, evaluated again in float64 (the same method on the same box; alpha-CROWN at the slopes that
gave the float32 bound), still excludes its polytopes (`common.Float64Check`); a domain that
fails stays open and is split further.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.registry import get_method
from bounds.rounding import lower_minus
from bounds.types import Budget, Interval, rounded_down, rounded_up
from verify.attack import UnsafeSpec, min_max
from verify.bab.common import (
    BatchSizer,
    DeadlineReachedError,
    Float64Check,
    Found,
    in_chunks,
    outward_box,
    prune_tolerance,
)
from verify.bab.config import BabConfig
from verify.bab.input.clip import clip_boxes
from verify.bab.input.domains import Domains, box_points, critical_rows
from verify.bab.input.methods import bounds, method_config, recheck_of
from verify.bab.search import Clock
from verify.property import Region


def root_box(region: Region, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The region's box `[1, n_in]` in `dtype` on `device`, rounded outwards."""
    lower, upper = outward_box(region, dtype)
    return lower.to(device), upper.to(device)


class InputBounder:
    """The input-splitting `Bounder`: each box by `BabConfig.method` (one registry call per
    chunk of the batch size, halved on out-of-memory), by `strong_method` from depth
    `strong_depth` on; a closing bound is confirmed in float64 (`confirm`) by the same method
    on the same box (alpha-CROWN at the slopes that gave it). Candidate points: the centres.
    The methods, their configs and rechecks are chosen once, here."""

    def __init__(
        self, graph: Graph, spec: UnsafeSpec, config: BabConfig, check: Float64Check,
        sizer: BatchSizer, stats: dict[str, Any], clock: Clock, root: tuple[Tensor, Tensor],
    ) -> None:  # fmt: skip
        self.graph, self.spec, self.config, self.check = graph, spec, config, check
        self.sizer, self.stats, self.clock, self.root_box = sizer, stats, clock, root
        self.shape = graph.input.shape
        self.tol = prune_tolerance(config, spec.b)
        self.methods = {False: (get_method(config.method), {})}
        if config.strong_method is not None:
            self.methods[True] = (get_method(config.strong_method), dict(config.strong_options))
        self.configs = {k: method_config(m, o) for k, (m, o) in self.methods.items()}
        self.rechecks = {k: recheck_of(m, self.configs[k], check.spec, check.tol)
                         for k, (m, _) in self.methods.items()}  # fmt: skip
        self.keep_coeff = config.branching == "smart"

    def root(
        self, try_points: Callable[[Tensor], Found], validate: Callable[[Tensor], Found]
    ) -> tuple[Domains, Found]:
        """The region's box bounded, confirmed and tried: its open domains (none or the root)
        and a validated counterexample, if one was found."""
        lower, upper = self.root_box
        depth = torch.zeros(1, dtype=torch.long, device=lower.device)
        unknown = lower.new_full((1, self.spec.C.shape[0]), -torch.inf)
        domain = Domains(lower, upper, unknown, unknown[:, 0], depth)
        self.choose(domain)
        tick = time.perf_counter()
        if self.check.active and self.config.root_float64:
            root = self.root64(domain)
        else:
            root = self.confirm(*self.measure(domain))
        self.sizer.seed(time.perf_counter() - tick)
        open_ = root.open()
        return open_, try_points(box_points(open_, self.config.corner_domains))

    def choose(self, d: Domains) -> None:
        """Bound every box by `fast_method` instead of `method` when, timed on the region's box
        `d` (as the search bounds its boxes; the fast one twice, the first call warming its
        code paths), it is at least `fast_ratio` times
        faster: the method is given that many times the fast one's seconds and loses when it
        has not finished by then (input splitting on at most `fast_max_inputs` inputs; the
        choice and both times in `stats`)."""
        fast, config = self.config.fast_method, self.config
        if fast is None or fast == config.method or d.lower.shape[1] > config.fast_max_inputs:
            return
        candidate = get_method(fast)
        options = method_config(candidate, {})
        seconds: list[float] = []
        plain = (self.methods[False][0], self.configs[False])
        for method, cfg in ((candidate, options), (candidate, options), plain):  # warm, then timed
            left = self.clock.left()
            budget = left if method is candidate else min(left, config.fast_ratio * min(seconds))
            tick = time.perf_counter()
            bounds(self.graph, lower=d.lower.reshape(-1, *self.shape),
                   upper=d.upper.reshape(-1, *self.shape), C=self.spec.C, method=method,
                   exact=False, budget=Budget(seconds=max(1e-3, budget)), config=cfg)  # fmt: skip
            seconds.append(time.perf_counter() - tick)
        seconds = [min(seconds[:2]), seconds[2]]
        self.stats["method_seconds"] = {fast: seconds[0], config.method: seconds[1]}
        if seconds[1] >= config.fast_ratio * seconds[0]:
            self.methods[False] = (candidate, {})
            self.configs[False] = options
            self.rechecks[False] = recheck_of(candidate, options, self.check.spec, self.check.tol)
            self.stats["method"] = fast

    def root64(self, d: Domains) -> Domains:
        """The region's box `d` bounded once, in float64 by the plain method with its rounding
        accounted for (`exact`: a proof as it stands, so no float32 bound and recheck): float32
        rounding can hide a margin of 1e-6 on outputs of size 1 (VNN-COMP's ml4acopf), which
        splitting never recovers, and a large network's root costs about as much in float64
        as in float32 on the CPU, and the recheck would double it. Closed when that bound
        excludes every polytope; else open with its rows rounded down to the search's dtype."""
        tick = time.perf_counter()
        box = [t.to(torch.float64).reshape(-1, *self.shape) for t in (d.lower, d.upper)]
        spec = self.check.spec
        result = bounds(self.check.graph, lower=box[0], upper=box[1], C=spec.C,
                        method=self.methods[False][0], config=self.configs[False],
                        budget=Budget(seconds=max(1e-3, self.clock.left())))  # fmt: skip
        rows64 = result.lower - spec.b
        margin64 = min_max(rows64 - self.check.tol, spec.owner, spec.n_polytopes)
        closed = bool(margin64[0] > 0)
        coeff = None
        if not closed:
            d, closed = self._clip(d, result.stats)
            coeff = self._critical_coeff(rows64, result.stats.get("input_functional"))
        self.stats["domains"] += 1
        self.check.record(1, 0, time.perf_counter() - tick)  # no float32 claim to fail
        self.stats["closed"] = self.stats.get("closed", 0) + int(closed)
        if closed:
            return Domains(d.lower, d.upper, d.rows, d.margin.new_ones(1), d.depth)
        rows = rounded_down(rows64, d.rows.dtype).to(d.rows.device)
        margin = min_max(rows - self.tol, self.spec.owner, self.spec.n_polytopes).clamp(max=0)
        return Domains(d.lower, d.upper, rows, margin, d.depth, coeff)

    def _critical_coeff(self, rows: Tensor, A: Tensor | None) -> Tensor | None:
        """`[N, n_in]` the critical rows' input functionals (`Domains.coeff`) from the rows'
        `A [N, m, n_in]`, or None (not kept, or the method gave none)."""
        if not self.keep_coeff or A is None:
            return None
        pick = critical_rows(rows, self.spec.owner, self.spec.n_polytopes)
        return A[torch.arange(len(A), device=A.device), pick].to(self.root_box[0].dtype)

    def _clip(self, d: Domains, stats: dict[str, Any]) -> tuple[Domains, bool]:
        """`d` (one box) clipped to where a counterexample can lie (`verify.bab.input.clip`) by
        the float64 linear bounds in `stats` (an exact pass of the check's spec), and whether
        no polytope can hold one (closed); unchanged when off or the method gave none."""
        A, found = stats.get("input_functional"), stats.get("linear_lower")
        if not self.config.clip or A is None or found is None:
            return d, False
        spec = self.check.spec
        r = lower_minus(found, spec.b)  # a float below each row's `lower - b`
        box = (d.lower.to(torch.float64), d.upper.to(torch.float64))
        low, high, empty = clip_boxes(*box, A, r, spec.owner, spec.n_polytopes)
        lower = rounded_down(low, d.lower.dtype).to(d.lower.device)
        upper = rounded_up(high, d.upper.dtype).to(d.upper.device)
        wide = (d.upper - d.lower) > 0  # fixed inputs (lower = upper) have no volume to lose
        shrunk = ((upper - lower)[wide] / (d.upper - d.lower)[wide]).clamp(min=1e-300, max=1)
        self.stats["clip_volume_log2"] = float(shrunk.log2().sum())
        return Domains(lower, upper, d.rows, d.margin, d.depth, d.coeff), bool(empty.all())

    def retain(self, open_: Domains) -> None:
        """Nothing is kept per domain."""

    def bound(self, domains: Domains) -> tuple[Domains, Tensor]:
        bounded = self.confirm(*self.measure(domains))
        return bounded, ((bounded.lower + bounded.upper) / 2).unsqueeze(1)

    def _strong(self, depth: Tensor) -> Tensor:
        """`[N]` bool: the domains of this depth bounded by the strong method."""
        if self.config.strong_method is None:
            return torch.zeros_like(depth, dtype=torch.bool)
        return depth >= self.config.strong_depth

    def measure(self, d: Domains) -> tuple[Domains, Tensor, dict[str, Tensor]]:
        """Bound the boxes (not confirmed): the strong method at depth >= strong_depth. Returns
        the domains, and per domain its row of `slopes` (alpha-CROWN's best output slopes
        `{activation: [K, 2m, *shape]}`, the certificate of its bound for `confirm`) or -1."""
        lower, upper, depth = d.lower, d.upper, d.depth
        rows = lower.new_empty(lower.shape[0], self.spec.C.shape[0])
        coeff = torch.zeros_like(lower) if self.keep_coeff else None
        strong = self._strong(depth)
        slope_rows = torch.full_like(depth, -1)
        parts: list[dict[str, Tensor]] = []
        count = 0
        for use_strong in (False, True):
            index = (strong == use_strong).nonzero().flatten()
            if len(index):
                found: list[dict[str, Tensor]] = []
                functionals: list[Tensor | None] = []
                rows[index] = self.bound_rows(
                    lower[index], upper[index], use_strong, found, functionals
                )
                if coeff is not None and functionals and all(f is not None for f in functionals):
                    coeff[index] = self._critical_coeff(rows[index], torch.cat(functionals))
                if found and found[0]:  # alpha-CROWN: one row of slopes per domain, in order
                    slope_rows[index] = count + torch.arange(len(index), device=lower.device)
                    parts, count = parts + found, count + len(index)
        slopes = {a: torch.cat([p[a] for p in parts]) for a in parts[0]} if parts else {}
        margin = min_max(rows - self.tol, self.spec.owner, self.spec.n_polytopes)
        self.stats["domains"] += lower.shape[0]
        return Domains(lower, upper, rows, margin, depth, coeff), slope_rows, slopes

    def bound_rows(
        self, lower: Tensor, upper: Tensor, strong: bool, slopes: list | None = None,
        functionals: list | None = None,
    ) -> Tensor:  # fmt: skip
        """Lower bounds of `C y - b` `[N, m]`, in chunks of the batch size (halved on OOM);
        appends each chunk's alpha-CROWN best output slopes to `slopes` and its rows' input
        functionals `[n, m, n_in]` (None: the method gave none) to `functionals` (when
        given)."""

        def chunk(part: slice) -> Tensor:
            return self._call_bounds(lower[part], upper[part], strong, slopes, functionals)

        deadline = self.clock.deadline
        return torch.cat(in_chunks(len(lower), self.sizer, deadline, chunk, whole=True))

    def _call_bounds(
        self, lower: Tensor, upper: Tensor, strong: bool, slopes: list | None = None,
        functionals: list | None = None,
    ) -> Tensor:  # fmt: skip
        method, _ = self.methods[strong]
        # The time left (a share of it for the iterative strong method): every method honours
        # a seconds budget (CROWN's layers keep IBP's intervals past it; IBP has nothing to cut).
        left = max(1e-3, self.clock.left())
        result = bounds(
            self.graph,
            lower=lower.reshape(-1, *self.shape),
            upper=upper.reshape(-1, *self.shape),
            C=self.spec.C,
            method=method,
            exact=False,  # a search bound: every closing one is rechecked exactly (`confirm`)
            budget=Budget(seconds=0.3 * left if strong else left),
            config=self.configs[strong],
        )
        self.stats["batches"] += 1
        self.stats["strong_domains"] += lower.shape[0] if strong else 0
        if slopes is not None and "best_slopes" in result.stats:
            slopes.append(result.stats["best_slopes"])
        if functionals is not None:
            functionals.append(result.stats.get("input_functional"))
        return result.lower - self.spec.b

    # ----- the float64 recheck of closing bounds -----

    def confirm(self, d: Domains, slope_rows: Tensor, slopes: dict[str, Tensor]) -> Domains:
        """`d` with its closed domains (margin > 0) confirmed in float64 (`_bounds64`); those
        that fail stay open with their float64 rows (rounded down) and a margin <= 0."""
        closed = (d.margin > 0).nonzero().flatten()
        if not self.check.active or not len(closed):
            self.stats["closed"] = self.stats.get("closed", 0) + len(closed)
            return d
        if not self.check.fits(len(closed), self.clock.deadline):  # unconfirmed: no count
            raise DeadlineReachedError
        tick = time.perf_counter()
        spec = self.check.spec
        rows64 = self._bounds64(d.lower[closed], d.upper[closed], d.depth[closed],
                                slope_rows[closed], slopes)  # fmt: skip
        margin64 = min_max(rows64 - self.check.tol, spec.owner, spec.n_polytopes)
        failed = closed[margin64 <= 0]
        rows, margin = d.rows.clone(), d.margin.clone()
        rows[failed] = rounded_down(rows64[margin64 <= 0], rows.dtype)
        margin[failed] = margin64[margin64 <= 0].to(margin.dtype).clamp(max=0)
        self.check.record(len(closed), len(failed), time.perf_counter() - tick)
        self.stats["closed"] = self.stats.get("closed", 0) + len(closed) - len(failed)
        return Domains(d.lower, d.upper, rows, margin, d.depth, d.coeff)

    def _bounds64(self, lower, upper, depth, slope_rows, slopes) -> Tensor:
        """Float64 lower bounds of `C y - b` `[K, m]` (C, b as in the VNN-LIB file) on the boxes
        `lower`, `upper [K, n_in]` (exact in float64), by each domain's own method: alpha-CROWN
        at its certificate slopes (`slope_rows` into `slopes`), otherwise the method itself
        (`verify.bab.input.methods.Recheck`)."""
        out = torch.empty(len(lower), self.check.spec.C.shape[0], dtype=torch.float64,
                          device=lower.device)  # fmt: skip
        for part, use_strong, given in self._recheck_parts(depth, slope_rows, slopes):
            out[part] = self._call_bounds64(lower[part], upper[part], use_strong, given)
        return out

    def _recheck_parts(
        self, depth: Tensor, slope_rows: Tensor, slopes: dict[str, Tensor]
    ) -> Iterator[tuple[Tensor, bool, dict[str, Tensor]]]:
        """The domains to recheck in chunks of the batch size, plain ones first: `(indices,
        strong, slopes)`, the slopes of a chunk whose every domain has them (else `{}`)."""
        strong = self._strong(depth)
        for use_strong in (False, True):
            index = (strong == use_strong).nonzero().flatten()
            for start in range(0, len(index), self.sizer.size):
                part = index[start : start + self.sizer.size]
                given = {}
                if bool((slope_rows[part] >= 0).all()):
                    given = {a: t[slope_rows[part]] for a, t in slopes.items()}
                yield part, use_strong, given

    def _call_bounds64(self, lower, upper, strong: bool, slopes: dict[str, Tensor]) -> Tensor:
        box = Interval(*(t.to(torch.float64).reshape(-1, *self.shape) for t in (lower, upper)))
        spec = self.check.spec
        C = spec.C.expand(len(lower), *spec.C.shape)
        return self.rechecks[strong].lower64(self.check.graph, box, C, slopes) - spec.b
