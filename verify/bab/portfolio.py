"""The splitting mode chosen by measurement: input splitting and ReLU splitting run as a
portfolio on one region, interleaved in turns on one clock (`Portfolio`), each turn given to
the search that is predicted to finish first.

- The search the input count favours (`prior_share`: input splitting for few inputs, ReLU
  splitting for many) runs alone for the first `probe` of the time: what it finishes there
  costs nothing more than before.
- Then the other one starts, and the two alternate in turns of `turn` of the time (at least
  `min_turn_seconds`), the next turn going to the search whose seconds so far, divided by its
  share, are the smallest.
- Once each has run `probe` of the time, the shares follow the measurements: a search that has
  closed the fraction `f` of its tree in `s` seconds is predicted to need `s (1 - f) / f` more
  (the closed fraction is one minus the open domains' mass, `sum 2^-depth`, over the root's),
  and its share is proportional to the inverse of that, never below `floor`. A search that has
  closed nothing keeps its prior.
- The first search that answers "sat" or "unsat" answers; one that gives up ("unknown": too
  many domains, unsplittable domains) leaves the other alone.

Each search keeps its own domains, batch sizes and attacks; the region's deadline holds across
both (every turn's slice ends before it). Input splitting alone for networks that are not ReLU
only (`verify.bab.solve_region`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from verify.bab.common import DeadlineReachedError, DomainBatch, RegionOutcome
from verify.bab.config import PortfolioConfig
from verify.bab.search import Search


def open_mass(open_: DomainBatch) -> float:
    """The open domains' mass `sum 2^-depth` (each split halves a domain's share of its
    tree)."""
    depth = open_.depth  # type: ignore[attr-defined]
    return float(torch.exp2(-depth.to(torch.float64)).sum()) if len(open_) else 0.0


class Lane:
    """One search of the portfolio: `name`, the `search`, its open domains (None before its
    root), the seconds it has run, its root's mass and what ended it (None while running)."""

    def __init__(self, name: str, search: Search, prior: float) -> None:
        self.name, self.search, self.prior = name, search, prior
        self.open_: DomainBatch | None = None
        self.seconds, self.root_mass = 0.0, 0.0
        self.ended: RegionOutcome | None = None

    def closed(self) -> float:
        """The fraction of its tree closed so far (0 before its root)."""
        if self.open_ is None or self.root_mass <= 0:
            return 0.0
        return max(0.0, 1.0 - open_mass(self.open_) / self.root_mass)

    def turn(self, until: float) -> RegionOutcome | None:
        """Run the search until `until` (`time.monotonic()`; its root first, if not yet run):
        steps (each sized to 30% of the time left) until a quarter of the turn is left or the
        next is predicted not to fit. Returns its outcome once it ends ("sat", "unsat",
        "unknown"; "timeout" when its root did not fit), None otherwise."""
        search, tick = self.search, time.monotonic()
        search.deadline = until
        rest = 0.25 * (until - tick)
        try:
            if self.open_ is None:
                try:
                    self.open_, found = search.begin()
                except DeadlineReachedError:
                    return self._end(RegionOutcome("timeout", None, search.stats))
                self.root_mass = max(open_mass(self.open_), 1.0)
                if found is not None:
                    return self._end(RegionOutcome("sat", found, search.stats))
            while len(self.open_) and search.clock.left() > rest:
                if search.too_many(self.open_):
                    return self._end(RegionOutcome("unknown", None, search.stats))
                try:
                    self.open_, found = search.step(self.open_)
                except DeadlineReachedError:  # the next step would end past `until`
                    break
                if found is not None:
                    return self._end(RegionOutcome("sat", found, search.stats))
            if not len(self.open_):
                status = "unknown" if search.unproven() else "unsat"
                return self._end(RegionOutcome(status, None, search.stats))
            return None
        finally:
            self.seconds += time.monotonic() - tick

    def _end(self, outcome: RegionOutcome) -> RegionOutcome:
        self.ended = outcome
        return outcome


class Portfolio:
    """Input and ReLU splitting on one region, interleaved (module docstring): `lanes` in the
    order the prior favours them (the first runs alone during the probe)."""

    def __init__(self, lanes: list[Lane], config: PortfolioConfig, region_unsafe: bool) -> None:
        self.lanes, self.config, self.unsafe = lanes, config, region_unsafe

    def run(self, deadline: float) -> RegionOutcome:
        """Turns until a search answers, both have given up ("unknown") or the deadline
        passes ("timeout"); the answer's stats are its search's, with `portfolio` (per search:
        seconds, closed fraction, how it ended)."""
        start = time.monotonic()
        total = max(deadline - start, 1e-9)
        if not self.unsafe:
            return RegionOutcome("unsat", None, self._stats(self.lanes[0].search.stats))
        c = self.config
        slice_ = max(c.turn * total, c.min_turn_seconds)
        while time.monotonic() < deadline:
            live = [lane for lane in self.lanes if lane.ended is None]
            if not live:
                break
            lane = self._next(live, total)
            first = lane.open_ is None and lane is not self.lanes[0]
            # the second search's root gets a probe's time: its intermediate bounds are kept
            length = max(slice_, c.probe * total) if first else slice_
            if lane is self.lanes[0] and lane.seconds < c.probe * total:
                length = c.probe * total - lane.seconds
            outcome = lane.turn(min(deadline, time.monotonic() + length))
            if outcome is not None and outcome.status in ("sat", "unsat"):
                return RegionOutcome(outcome.status, outcome.counterexample,
                                     self._stats(lane.search.stats))  # fmt: skip
        ended = [lane.ended for lane in self.lanes]
        gave_up = all(o is not None and o.status == "unknown" for o in ended)
        status = "unknown" if gave_up else "timeout"
        return RegionOutcome(status, None, self._stats(self.lanes[0].search.stats))

    def _next(self, live: list[Lane], total: float) -> Lane:
        """The search of the next turn: the favoured one alone during the probe, then the one
        whose seconds over share are smallest."""
        first = self.lanes[0]
        if first in live and first.seconds < self.config.probe * total:
            return first
        if len(live) == 1:
            return live[0]
        shares = self.shares(total)
        return min(live, key=lambda lane: lane.seconds / shares[lane.name])

    def shares(self, total: float) -> dict[str, float]:
        """Each search's share of the time: the priors until each has run `probe` of the time
        and one has closed part of its tree; then proportional to its predicted speed of
        finishing (closed fraction per second over the fraction left), at least `floor`."""
        c = self.config
        prior = {lane.name: lane.prior for lane in self.lanes}
        probed = all(lane.seconds >= c.probe * total for lane in self.lanes)
        speed = {}
        for lane in self.lanes:
            f = lane.closed()
            speed[lane.name] = f / max(lane.seconds, 1e-9) / max(1.0 - f, 1e-9)
        if not probed or not any(speed.values()):
            return prior
        norm = sum(speed.values())
        shares = {name: max(c.floor, s / norm) for name, s in speed.items()}
        norm = sum(shares.values())
        return {name: s / norm for name, s in shares.items()}

    def _stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        out = dict(stats)
        out["portfolio"] = {
            lane.name: {
                "seconds": round(lane.seconds, 3),
                "closed": round(lane.closed(), 4),
                "ended": None if lane.ended is None else lane.ended.status,
            }
            for lane in self.lanes
        }
        return out
