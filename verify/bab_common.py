"""Pieces shared by the input-splitting and the ReLU-splitting branch and bound: the outcome of
one region, the deadline exception, the counterexample checks, the adaptive batch size, the
outward-rounded root box and the float64 side of the searches (`Float64Check`).

Soundness under rounding: a float32 search computes its bounds in float32, whose rounding can
put a bound above the true minimum. A domain is therefore pruned only after the bound that
closes it has been evaluated again in float64 with the same relaxation (the same box, method,
slopes and split multipliers; intermediate bounds computed in float64 and rounded outwards
to float32 for the search) and still exceeds the threshold. Float64 networks need no recheck.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from bounds.graph import Graph
from bounds.types import Interval, rounded_down, rounded_up
from verify.attack import UnsafeSpec, validate, violation
from verify.property import Region


class BatchLimits(Protocol):
    """The batch-size fields of `BabConfig`."""

    batch_size: int
    min_batch: int
    max_batch: int


class DeadlineReachedError(Exception):
    """Raised between bound computations once the deadline has passed."""


D = TypeVar("D", bound="DomainBatch")


class DomainBatch:
    """Base of the domain dataclasses: every field a tensor with one row per domain, one of
    them `margin [N]` (> 0: the domain is excluded)."""

    margin: Tensor

    def __len__(self) -> int:
        return self.margin.shape[0]

    def _fields(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]

    def take(self: D, index: Tensor) -> D:
        return type(self)(*(t[index] for t in self._fields()))

    def pop(self: D, n: int) -> tuple[D, D]:
        """The `n` domains of smallest margin, and the rest."""
        order = self.margin.argsort()
        return self.take(order[:n]), self.take(order[n:])

    def open(self: D) -> D:
        """The domains not excluded (margin <= 0)."""
        return self.take((self.margin <= 0).nonzero().flatten())

    @classmethod
    def cat(cls: type[D], parts: list[D]) -> D:
        return cls(*(torch.cat(ts) for ts in zip(*(p._fields() for p in parts))))


class RegionSearch:
    """Shared entry point of the branch-and-bound searches: `run(deadline)` sets the monotonic
    deadline and turns `DeadlineReachedError` into a "timeout" outcome; subclasses implement
    `_search()`, keep `stats` and set `net`, `region`, `shape`, `spec` and `value_tol`
    (`value_tolerance`) for the counterexample checks below."""

    deadline: float
    stats: dict
    net: nn.Module
    region: Region
    shape: tuple[int, ...]
    spec: UnsafeSpec
    value_tol: float

    @staticmethod
    def value_tolerance(spec: UnsafeSpec) -> float:
        """Points whose float32 `violation` is below this are re-checked in float64."""
        scale = float(spec.b.abs().max()) if spec.b.numel() else 0.0
        return 1e-4 * (1 + scale)

    def _violations(self, points: Tensor) -> Tensor:
        """`violation` of the network's outputs at `points` (any leading shape, flattened)."""
        with torch.no_grad():
            return violation(self.net(points.reshape(-1, *self.shape)), self.spec)

    def _validate_best(self, points: Tensor, values: Tensor) -> tuple[Tensor, Tensor] | None:
        """The first of the 3 points of smallest `values` that validates (float64) as a
        counterexample; None once a value is above `value_tol`."""
        for i in values.argsort()[:3].tolist():
            if values[i] > self.value_tol:
                return None
            found = validate(self.net, self.region, points[i : i + 1].reshape(1, *self.shape))
            if found is not None:
                return found
        return None

    def run(self, deadline: float) -> RegionOutcome:
        self.deadline = deadline
        if time.monotonic() >= deadline:
            return RegionOutcome("timeout", None, self.stats)
        try:
            return self._search()
        except DeadlineReachedError:
            return RegionOutcome("timeout", None, self.stats)

    def _search(self) -> RegionOutcome:
        raise NotImplementedError


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


def is_out_of_memory(error: RuntimeError) -> bool:
    return "out of memory" in str(error).lower()


def outward(interval: Interval, dtype: torch.dtype) -> Interval:
    """`interval` in `dtype`, rounded outwards (it contains the given one)."""
    return Interval(rounded_down(interval.lower, dtype), rounded_up(interval.upper, dtype))


def outward_box(region: Region, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The region's box `[1, n_in]` in `dtype`, rounded outwards so that it contains the exact
    (float64) box."""
    exact = [
        torch.tensor(np.asarray(a), dtype=torch.float64)[None] for a in (region.lower, region.upper)
    ]
    box = outward(Interval(*exact), dtype)
    return box.lower, box.upper


class Float64Check:
    """The float64 side of a search on a float32 network: the graph in float64, the unsafe
    polytopes' rows as in the VNN-LIB file (`spec`, with the search's row combinations when
    `combine`), the pruning tolerance `tol [m]` and the counters `rechecked`, `recheck_failed`
    and `recheck_seconds` in `stats`. `active`: False for float64 networks or when
    `config.float64_recheck` is off (then `graph` and `spec` are the network's own)."""

    def __init__(self, graph: Graph, region: Region, config, stats: dict, combine: bool):
        consts = [t for n in graph.nodes[1:] for t in n.op.constants()]
        like = consts[0] if consts else torch.zeros(())
        self.active = bool(config.float64_recheck) and like.dtype != torch.float64
        dtype = torch.float64 if self.active else like.dtype
        self.graph = graph.to(torch.float64, like.device) if self.active else graph
        spec = UnsafeSpec.of(region, dtype, like.device)
        self.spec = spec.with_combinations() if combine else spec
        self.tol = config.prune_tol * (1 + self.spec.b.abs())
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
        self.stats["rechecked"] += checked
        self.stats["recheck_failed"] += failed
        self.stats["recheck_seconds"] = round(self.stats["recheck_seconds"] + seconds, 4)
