"""Pieces shared by the input-splitting and the ReLU-splitting branch and bound: the one search
loop (`RegionSearch.run`), the outcome of one region, the deadline exception, the
counterexample checks, the adaptive batch size, the outward-rounded root box and the float64
side of the searches (`Float64Check`).

Soundness under rounding: a search computes its bounds without tracking their rounding (in
float32 for a float32 network), which can put a bound above the true minimum. A domain is
therefore pruned only after the bound that closes it has been evaluated again in float64 with
its rounding tracked (`bounds.rounding`), with the same relaxation (the same box, method,
slopes, split multipliers and duals; intermediate bounds computed in float64 and rounded
outwards to float32 for the search) and still exceeds the threshold; float64 networks too.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from bounds.graph.graph import Graph
from bounds.rounding import outward
from bounds.types import Interval
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
T = TypeVar("T")
Found = tuple[Tensor, Tensor] | None  # a validated counterexample (x, y), or None


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

    def put(self: D, index: Tensor, other: D) -> D:
        """A copy with the domains at `index` replaced by `other`'s (in order)."""
        out = []
        for mine, theirs in zip(self._fields(), other._fields()):
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
        return cls(*(torch.cat(ts) for ts in zip(*(p._fields() for p in parts))))


class RegionSearch(ABC):
    """Base of the branch-and-bound searches: `run(deadline)` is the one search loop (over
    `begin`, `step`, `too_many` and `unproven`, which subclasses implement); subclasses keep
    `stats` and set `net`, `region`, `shape`, `spec` and `value_tol` (`value_tolerance`) for
    the counterexample checks below."""

    deadline: float
    stats: dict
    config: Any
    sizer: BatchSizer
    bounder: Any  # protocols.Bounder
    brancher: Any  # protocols.Brancher
    fanout: int  # children per parent
    last_attack: float
    started: float
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
        """The one search loop of branch and bound, over the `Search` protocol: `begin`, then
        `step` until no domain is open, a counterexample is found, the deadline passes
        ("timeout") or `too_many` domains are open ("unknown"); no domain left makes the answer
        "unsat", unless some were dropped without a proof (`unproven`: "unknown")."""
        self.deadline = deadline
        if time.monotonic() >= deadline:
            return RegionOutcome("timeout", None, self.stats)
        if not self.region.unsafe:  # no unsafe set: nothing to exclude
            return RegionOutcome("unsat", None, self.stats)
        try:
            open_, found = self.begin()
            while found is None and len(open_):
                if time.monotonic() >= self.deadline:
                    return RegionOutcome("timeout", None, self.stats)
                if self.too_many(open_):
                    return RegionOutcome("unknown", None, self.stats)
                open_, found = self.step(open_)
        except DeadlineReachedError:
            return RegionOutcome("timeout", None, self.stats)
        if found is not None:
            return RegionOutcome("sat", found, self.stats)
        return RegionOutcome("unknown" if self.unproven() else "unsat", None, self.stats)

    # The `Search` protocol, implemented by the input- and ReLU-splitting searches (and driven
    # step by step by the distributed shards, `verify.distributed`).

    @abstractmethod
    def begin(self) -> tuple[DomainBatch, Found]:
        """The root: its open domains and a validated counterexample (or None)."""

    def step(self, open_: DomainBatch) -> tuple[DomainBatch, Found]:
        """One step on the open domains (the deadline must not have passed), over the
        `Bounder` and `Brancher` protocols (`verify/bab/protocols.py`): pop the parents of
        smallest margin (as many as `fanout` children each fit the batch), have `brancher` split
        and bound them with `bounder`, try the children's points, attack now and then
        (`_attack_due`, `_attack`), keep the open children. Returns the open domains after it
        and a validated counterexample (or None)."""
        left = self.deadline - time.monotonic()
        parents, rest = open_.pop(max(1, self.sizer.allowed(left) // self.fanout))
        tick = time.perf_counter()
        got = self.brancher.children(parents, self.bounder)
        found = got.found if got.found is not None else self._try_points(got.points)
        if found is None and self._attack_due():
            tick_attack = time.monotonic()
            found = self._attack(got)
            self.last_attack = time.monotonic()
            self.stats["attack_seconds"] += self.last_attack - tick_attack
            self.stats["attacks"] += 1
        if found is not None:
            return open_, found
        self.sizer.record(got.bounded, time.perf_counter() - tick)
        open_ = type(open_).cat([rest, got.domains])
        self.stats["max_open"] = max(self.stats["max_open"], len(open_))
        return open_, None

    def _attack_due(self) -> bool:
        """An attack every `attack_every` seconds, within 10% of the search time."""
        now = time.monotonic()
        due = now - self.last_attack >= self.config.attack_every
        return due and self.stats["attack_seconds"] <= 0.1 * (now - self.started)

    def _try_points(self, points: Tensor) -> Found:
        """Evaluate `points [M, *input_shape]` (inside the box); validate the best ones."""
        if not len(points):
            return None
        return self._validate_best(points, self._violations(points))

    @abstractmethod
    def _attack(self, children) -> Found:
        """An attack (PGD) from the open `children` (`protocols.Children`)."""

    @abstractmethod
    def too_many(self, open_: DomainBatch) -> bool:
        """Past the domain limit (the answer is then "unknown")."""

    @abstractmethod
    def unproven(self) -> int:
        """How many domains were dropped without a proof."""


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

    def __init__(self, graph: Graph, region: Region, config, stats: dict, combine: bool):
        consts = [t for n in graph.nodes[1:] for t in n.op.constants()]
        like = consts[0] if consts else torch.zeros(())
        self.active = bool(config.float64_recheck)
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
