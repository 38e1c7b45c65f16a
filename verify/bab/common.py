"""Pieces shared by the input-splitting and the ReLU-splitting branch and bound: the domain
batches, the outcome of one region, the deadline exception, the adaptive batch size, the
outward-rounded root box and the float64 side of the searches (`Float64Check`). The one search
loop is `verify.bab.search.Search`.

Soundness under rounding: a search computes its bounds without tracking their rounding (in
float32 for a float32 network), which can put a bound above the true minimum. A domain is
therefore pruned only after the bound that closes it has been evaluated again in float64 with
its rounding tracked (`bounds.rounding`), with the same relaxation (the same box, method,
slopes, split multipliers and duals; intermediate bounds computed in float64 and rounded
outwards to float32 for the search) and still exceeds the threshold; float64 networks too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.rounding import outward
from bounds.types import Interval
from verify.attack import UnsafeSpec
from verify.property import Region


class BatchLimits(Protocol):
    """The batch-size fields of `BabConfig`."""

    batch_size: int
    min_batch: int
    max_batch: int


class Float64Settings(Protocol):
    """The recheck fields of `BabConfig`."""

    float64_recheck: bool
    prune_tol: float
    recheck_tol: float


def prune_tolerance(config: Float64Settings, b: Tensor) -> Tensor:
    """The margin per row `[m]` a bound must exceed to prune a domain (rows `C y <= b`): with
    closing bounds rechecked in float64, `recheck_tol * (1 + |b|)` (default 0: that recheck
    carries its own rounding, so any positive margin is a proof, and a float32 margin it does
    not confirm only costs the recheck; certificates keep a margin for their checker), else
    `prune_tol * (1 + |b|)`, a cushion for the float32 search's rounding."""
    if config.float64_recheck:
        return config.recheck_tol * (1 + b.abs())
    return config.prune_tol * (1 + b.abs())


class DeadlineReachedError(Exception):
    """Raised between bound computations once the deadline has passed."""


D = TypeVar("D", bound="DomainBatch")
T = TypeVar("T")
Found = tuple[Tensor, Tensor] | None  # a validated counterexample (x, y), or None


class DomainBatch:
    """Base of the domain dataclasses: every field a tensor with one row per domain, one of
    them `margin [N]` (> 0: the domain is excluded); an optional field may be None in every
    batch of a search (then it stays None)."""

    margin: Tensor

    def __len__(self) -> int:
        return self.margin.shape[0]

    def _fields(self) -> tuple[Tensor | None, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]

    def take(self: D, index: Tensor) -> D:
        """The domains at `index` (in order)."""
        return type(self)(*(None if t is None else t[index] for t in self._fields()))

    def put(self: D, index: Tensor, other: D) -> D:
        """A copy with the domains at `index` replaced by `other`'s (in order)."""
        out = []
        for mine, theirs in zip(self._fields(), other._fields()):
            if mine is not None:
                mine = mine.clone()
                mine[index] = theirs
            out.append(mine)
        return type(self)(*out)

    def pop(self: D, n: int) -> tuple[D, D]:
        """The `n` domains of smallest margin, and the rest."""
        order = self.margin.argsort()
        return self.take(order[:n]), self.take(order[n:])

    def open(self: D) -> D:
        """The domains not excluded (margin <= 0)."""
        return self.take((self.margin <= 0).nonzero().flatten())

    @classmethod
    def cat(cls: type[D], parts: list[D]) -> D:
        """The domains of `parts`, concatenated."""
        columns = zip(*(p._fields() for p in parts))
        return cls(*(None if ts[0] is None else torch.cat(ts) for ts in columns))


@dataclass
class RegionOutcome:
    """status: "unsat" (every domain pruned), "sat" (validated counterexample `(x, y)`),
    "timeout" (deadline reached) or "unknown" (domain limit reached, or domains that could not
    be split further and were not proven)."""

    status: str
    counterexample: tuple[Tensor, Tensor] | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class BatchSizer:
    """Domains per step: hill-climbs over powers of two on the measured seconds per domain of a
    whole step (bounds and attacks); halves on out-of-memory; never more than the time left
    allows."""

    def __init__(self, config: BatchLimits) -> None:
        self.size, self.low, self.high = config.batch_size, config.min_batch, config.max_batch
        self.cost: dict[int, float] = {}
        self.first: float | None = None  # the seed, until a step is measured

    def record(self, size: int, seconds: float) -> None:
        """A step of `size` domains took `seconds`: update the cost of the current size and
        move. A step under half of it (the last few open domains) says nothing about it,
        except before any measurement (the seed's time cap can make early steps small)."""
        if 2 * size < self.size and self.cost:
            return
        per, key = seconds / size, self.size
        old = self.cost.get(key)
        self.cost[key] = per if old is None else 0.7 * old + 0.3 * per
        best = min(self.cost, key=self.cost.get)
        up = min(best * 2, self.high)
        self.size = up if up not in self.cost else best

    def seed(self, seconds_per_domain: float) -> None:
        """A pessimistic first cost (one unbatched domain) so the first steps fit the deadline."""
        self.first = seconds_per_domain

    def shrink(self) -> None:
        """Halve the batch size (out of memory), forgetting the costs of larger sizes."""
        self.size = self.high = max(1, self.size // 2)
        self.low = min(self.low, self.size)
        self.cost = {k: v for k, v in self.cost.items() if k <= self.size}

    def per_domain(self) -> float | None:
        """Seconds per domain at the current size (or, while it has none, at the largest smaller
        size measured; the seed before any measurement); None before anything is known."""
        if self.cost:
            below = [k for k in self.cost if k <= self.size]
            return self.cost[max(below)] if below else max(self.cost.values())
        return self.first

    def allowed(self, seconds_left: float) -> int:
        """How many domains fit in 30% of the time left (at least 1), at `per_domain`'s cost
        (the deadline is also checked between chunks)."""
        per = self.per_domain()
        if per is None:
            return self.size
        return int(max(1, min(self.size, 0.3 * seconds_left / per)))

    def fits(self, count: int, seconds_left: float) -> bool:
        """Whether `count` domains, at `per_domain`'s cost, end before the time left (True
        while nothing is measured)."""
        per = self.per_domain()
        return per is None or count * per <= seconds_left


def in_chunks(
    count: int, sizer: BatchSizer, deadline: float, bound: Callable[[slice], T],
    whole: bool = False,
) -> list[T]:  # fmt: skip
    """`bound` over consecutive slices of `count` domains, each of the batch size (at most what
    the time left allows, `BatchSizer.allowed`); on out-of-memory the sizer halves and the
    slice is tried again (the error is raised once the size is 1). The deadline is checked
    between slices (`DeadlineReachedError`); with `whole`, also before a slice predicted to end
    past it (for bounders that cannot stop inside a slice)."""
    out, start = [], 0
    while start < count:
        left = deadline - time.monotonic()
        size = min(sizer.size, sizer.allowed(left))
        if left <= 0 or (whole and not sizer.fits(min(size, count - start), left)):
            raise DeadlineReachedError
        try:
            out.append(bound(slice(start, min(start + size, count))))
        except RuntimeError as error:
            if not is_out_of_memory(error) or sizer.size == 1:
                raise
            sizer.shrink()
            continue
        start += size
    return out


def is_out_of_memory(error: RuntimeError) -> bool:
    """Whether `error` is torch's out-of-memory error."""
    return "out of memory" in str(error).lower()


def outward_box(region: Region, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The region's box `[1, n_in]` in `dtype`, rounded outwards so that it contains the exact
    (float64) box."""
    exact = [
        torch.tensor(np.asarray(a), dtype=torch.float64)[None] for a in (region.lower, region.upper)
    ]
    box = outward(Interval(*exact), dtype)
    return box.lower, box.upper


class Float64Check:
    """The float64 side of a search: the graph in float64, the unsafe polytopes' rows as in the
    VNN-LIB file (`spec`, with the search's row combinations when `combine`), the pruning
    tolerance `tol [m]` and the counters `rechecked`, `recheck_failed` and `recheck_seconds` in
    `stats`. `active`: False when `config.float64_recheck` is off (then `graph` and `spec` are
    the network's own)."""

    def __init__(
        self, graph: Graph, region: Region, config: Float64Settings, stats: dict[str, Any],
        combine: bool,
    ) -> None:  # fmt: skip
        consts = [t for n in graph.nodes[1:] for t in n.op.constants()]
        like = consts[0] if consts else torch.zeros(())
        self.active = bool(config.float64_recheck)
        dtype = torch.float64 if self.active else like.dtype
        self.graph = graph.to(torch.float64, like.device) if self.active else graph
        spec = UnsafeSpec.of(region, dtype, like.device)
        self.spec = spec.with_combinations() if combine else spec
        self.tol = prune_tolerance(config, self.spec.b)
        self.stats = stats
        stats |= {"rechecked": 0, "recheck_failed": 0, "recheck_seconds": 0.0}

    def fits(self, count: int, deadline: float) -> bool:
        """Whether rechecking `count` domains, at the seconds per domain measured so far, ends
        before `deadline` (`time.monotonic()`; False once it has passed)."""
        left = deadline - time.monotonic()
        done = self.stats["rechecked"]
        per = self.stats["recheck_seconds"] / done if done else 0.0
        return left > 0 and count * per <= left

    def record(self, checked: int, failed: int, seconds: float) -> None:
        """Count `checked` rechecked domains, `failed` of them kept open, in `seconds`."""
        self.stats["rechecked"] += checked
        self.stats["recheck_failed"] += failed
        self.stats["recheck_seconds"] = round(self.stats["recheck_seconds"] + seconds, 4)
