"""The one branch-and-bound search (`Search`), composed of its parts: a `Bounder`, a `Brancher`
and an `Attacker` (`verify/bab/protocols.py`), the counterexample checks (`Counterexamples`) and
a `Clock` (the deadline) that the search and its parts share from their construction. Input
splitting (`verify.bab.input`) and ReLU splitting (`verify.bab.relu`) each assemble one.

`Search.run` is the one loop and `Search.step` the one step (driven step by step by the
distributed shards, `verify.distributed`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from verify.attack import UnsafeSpec, validate, violation
from verify.bab.common import BatchSizer, DeadlineReachedError, DomainBatch, Found, RegionOutcome
from verify.bab.protocols import Attacker, Bounder, Brancher, Children
from verify.property import Region


@dataclass
class Clock:
    """The deadline of one search (`time.monotonic()` seconds; inf: none). One object, given to
    the search and to each of its parts when they are built: setting `deadline` here (the
    search's `run`, a shard) is seen by all of them."""

    deadline: float = float("inf")

    def left(self) -> float:
        """Seconds left before the deadline (negative once it has passed)."""
        return self.deadline - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.deadline


class Counterexamples:
    """The counterexample checks of a search: the network `net` (inputs `[N, *shape]`), the
    region and its unsafe polytopes `spec`; points whose float32 `violation` is below
    `value_tol` are validated in float64 (`verify.attack.validate`)."""

    def __init__(
        self, net: nn.Module, region: Region, shape: tuple[int, ...], spec: UnsafeSpec
    ) -> None:
        self.net, self.region, self.shape, self.spec = net, region, shape, spec
        self.value_tol = spec.value_tolerance()

    def violations(self, points: Tensor) -> Tensor:
        """`violation` of the network's outputs at `points` (any leading shape, flattened)."""
        with torch.no_grad():
            return violation(self.net(points.reshape(-1, *self.shape)), self.spec)

    def validate_best(self, points: Tensor, values: Tensor) -> Found:
        """The first of the 3 points of smallest `values` that validates (float64) as a
        counterexample; None once a value is above `value_tol`."""
        for i in values.argsort()[:3].tolist():
            if values[i] > self.value_tol:
                return None
            found = validate(self.net, self.region, points[i : i + 1].reshape(1, *self.shape))
            if found is not None:
                return found
        return None

    def try_points(self, points: Tensor) -> Found:
        """Evaluate `points [M, *input_shape]` (inside the box); validate the best ones."""
        if not len(points):
            return None
        return self.validate_best(points, self.violations(points))

    def validate(self, point: Tensor) -> Found:
        """`point [1, *input_shape]` validated (float64) as a counterexample, or None."""
        return validate(self.net, self.region, point)


class Search:
    """Branch and bound on one region, composed of `bounder`, `brancher`, `attacker` and
    `clock` (module docstring), with the counterexample checks `checks`, the batch `sizer`,
    the counters `stats`, the domain limit `max_open` (beyond: "unknown") and an attack every
    `attack_every` seconds."""

    def __init__(
        self, bounder: Bounder[Any], brancher: Brancher[Any], attacker: Attacker, clock: Clock,
        *, checks: Counterexamples, sizer: BatchSizer, stats: dict[str, Any], max_open: int,
        attack_every: float,
    ) -> None:  # fmt: skip
        self.bounder, self.brancher, self.attacker, self.clock = bounder, brancher, attacker, clock
        self.checks, self.sizer, self.stats = checks, sizer, stats
        self.max_open, self.attack_every = max_open, attack_every
        self.last_attack = self.started = time.monotonic()

    @property
    def deadline(self) -> float:
        return self.clock.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.clock.deadline = value

    def run(self, deadline: float) -> RegionOutcome:
        """The one search loop of branch and bound: `begin`, then `step` until no domain is
        open, a counterexample is found, the deadline passes ("timeout") or `too_many` domains
        are open ("unknown"); no domain left makes the answer "unsat", unless some were
        dropped without a proof (`unproven`: "unknown")."""
        self.clock.deadline = deadline
        if self.clock.passed():
            return RegionOutcome("timeout", None, self.stats)
        if not self.checks.region.unsafe:  # no unsafe set: nothing to exclude
            return RegionOutcome("unsat", None, self.stats)
        try:
            open_, found = self.begin()
            while found is None and len(open_):
                if self.clock.passed():
                    return RegionOutcome("timeout", None, self.stats)
                if self.too_many(open_):
                    return RegionOutcome("unknown", None, self.stats)
                open_, found = self.step(open_)
        except DeadlineReachedError:
            return RegionOutcome("timeout", None, self.stats)
        if found is not None:
            return RegionOutcome("sat", found, self.stats)
        return RegionOutcome("unknown" if self.unproven() else "unsat", None, self.stats)

    def begin(self) -> tuple[DomainBatch, Found]:
        """The root (`Bounder.root`): its open domains and a validated counterexample (or
        None)."""
        open_, found = self.bounder.root(self._try_points, self.checks.validate)
        self.last_attack = self.started = time.monotonic()
        return open_, found

    def step(self, open_: DomainBatch) -> tuple[DomainBatch, Found]:
        """One step on the open domains (the deadline must not have passed): pop the parents of
        smallest margin (as many as `fanout` children each fit the batch), have `brancher` split
        and bound them with `bounder`, try the children's points, attack now and then, keep
        the open children; then the bounder drops what no domain it returns needs
        (`Bounder.retain`). Returns the open domains after it and a validated counterexample (or
        None)."""
        count = max(1, self.sizer.allowed(self.clock.left()) // self.brancher.fanout)
        parents, rest = open_.pop(count)
        tick = time.perf_counter()
        got = self.brancher.children(parents, self.bounder)
        found = got.found if got.found is not None else self._try_points(got.points)
        if found is None and self._attack_due():
            tick_attack = time.monotonic()
            found = self._attack(got)
            self.last_attack = time.monotonic()
            self.stats["attack_seconds"] += self.last_attack - tick_attack
            self.stats["attacks"] += 1
        if found is None:
            self.sizer.record(got.bounded, time.perf_counter() - tick)
            open_ = type(open_).cat([rest, got.domains])
            self.stats["max_open"] = max(self.stats["max_open"], len(open_))
        self.bounder.retain(open_)
        return open_, found

    def too_many(self, open_: DomainBatch) -> bool:
        """Past the domain limit (the answer is then "unknown")."""
        return len(open_) > self.max_open

    def unproven(self) -> int:
        """How many domains were dropped without a proof (`stats["unsplittable"]`)."""
        return int(self.stats.get("unsplittable", 0))

    def _attack_due(self) -> bool:
        """An attack every `attack_every` seconds, within 10% of the search time."""
        now = time.monotonic()
        due = now - self.last_attack >= self.attack_every
        return due and self.stats["attack_seconds"] <= 0.1 * (now - self.started)

    def _try_points(self, points: Tensor) -> Found:
        return self.checks.try_points(points)

    def _attack(self, children: Children) -> Found:
        return self.attacker.attack(children)
