"""The splitting mode chosen by measurement: input splitting and ReLU splitting run as a
portfolio on one region, interleaved in turns on one clock (`Portfolio`), each turn given to
the search that is predicted to finish first.

- The search the input count favours (`prior`: input splitting for few inputs, ReLU
  splitting for many) runs alone for the first `probe` of the time, and after it as long as
  it is predicted to finish in time: a search that has closed the fraction `f` of its tree in
  `s` seconds is predicted to need `s (1 - f) / f` more (the closed fraction is one minus the
  open domains' mass, `sum 2^-depth`, over the root's). What it finishes so costs nothing more
  than it alone.
- Once it is predicted not to finish, the other one starts (its root within a probe's time,
  and only if the time left is at least the first root's seconds plus a probe's time),
  and the two alternate step by step, the next step going to the search whose seconds so far,
  divided by its share, are the smallest. The shares are the priors until each has run
  `probe` of the time; then proportional to the predicted speed of finishing,
  `f / (s (1 - f))`, never below `floor` (a search that has closed nothing gets the floor;
  neither: the priors).
- The first search that answers "sat" or "unsat" answers; one that gives up ("unknown": too
  many domains, unsplittable domains) leaves the other alone.

Each search keeps its own domains, batch sizes and attacks; both run on the region's deadline
(each step sized by its search to the time left). Input splitting alone for networks that are
not ReLU only (`verify.bab.solve_region`).
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
        self.seconds, self.root_mass, self.root_seconds = 0.0, 0.0, 0.0
        self.ended: RegionOutcome | None = None

    def closed(self) -> float:
        """The fraction of its tree closed so far (0 before its root)."""
        if self.open_ is None or self.root_mass <= 0:
            return 0.0
        return max(0.0, 1.0 - open_mass(self.open_) / self.root_mass)

    def eta(self) -> float:
        """Seconds it is predicted to need still: `s (1 - f) / f` after `s` seconds with the
        fraction `f` of its tree closed (inf while nothing is closed)."""
        f = self.closed()
        return self.seconds * (1.0 - f) / f if f > 0 else float("inf")

    def turn(self, deadline: float, root_until: float | None = None) -> RegionOutcome | None:
        """One turn on the region's `deadline` (`time.monotonic()`): the search's root if not
        yet run (before `root_until` when given: a later search's root gets a probe's time),
        else one step, sized by the search to the time left. Returns its outcome once it ends
        ("sat", "unsat", "unknown"; "timeout" when a step or the root is predicted past the
        deadline), None otherwise."""
        search, tick = self.search, time.monotonic()
        try:
            if self.open_ is None:
                search.deadline = deadline if root_until is None else min(deadline, root_until)
                try:
                    self.open_, found = search.begin()
                except DeadlineReachedError:
                    return self._end(RegionOutcome("timeout", None, search.stats))
                finally:
                    search.deadline = deadline
                self.root_mass = max(open_mass(self.open_), 1.0)
                self.root_seconds = time.monotonic() - tick
            elif search.too_many(self.open_):
                return self._end(RegionOutcome("unknown", None, search.stats))
            else:
                try:
                    self.open_, found = search.step(self.open_)
                except DeadlineReachedError:
                    return self._end(RegionOutcome("timeout", None, search.stats))
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
        for lane in self.lanes:
            lane.search.deadline = deadline
        while time.monotonic() < deadline:
            live = [lane for lane in self.lanes if lane.ended is None]
            if not live:
                break
            lane = self._next(live, total, deadline)
            if lane is None:
                break
            later_root = lane.open_ is None and lane is not self.lanes[0]
            root_until = time.monotonic() + self.config.probe * total if later_root else None
            outcome = lane.turn(deadline, root_until)
            if outcome is not None and outcome.status in ("sat", "unsat"):
                return RegionOutcome(outcome.status, outcome.counterexample,
                                     self._stats(lane.search.stats))  # fmt: skip
        ended = [lane.ended for lane in self.lanes]
        gave_up = all(o is not None and o.status == "unknown" for o in ended)
        status = "unknown" if gave_up else "timeout"
        return RegionOutcome(status, None, self._stats(self.lanes[0].search.stats))

    def _next(self, live: list[Lane], total: float, deadline: float) -> Lane | None:
        """The search of the next turn: the favoured one alone during the probe and as long
        as it is predicted to finish before the deadline; once it is not (or it has ended),
        the one whose seconds over share are smallest. A search not yet started starts only if
        its root fits: the time left is at least the favoured root's seconds (both roots
        bound the region's box by CROWN first, and a first chunk of neurons has no
        prediction to stop it) plus a probe's time. None: nothing can run."""
        first = self.lanes[0]
        fits = self.root_fits(total, deadline)
        startable = [lane for lane in live if lane.open_ is not None or lane is first or fits]
        if first in live and self.second_waits(first, total, deadline):
            return first
        if len(startable) <= 1:
            return startable[0] if startable else None
        shares = self.shares(total)
        return min(startable, key=lambda lane: lane.seconds / shares[lane.name])

    def root_fits(self, total: float, deadline: float) -> bool:
        """Whether a later search's root fits: the time left is at least the favoured root's
        seconds plus a probe's time (see `_next`)."""
        left = deadline - time.monotonic()
        return left >= self.lanes[0].root_seconds + self.config.probe * total

    def second_waits(self, first: Lane, total: float, deadline: float) -> bool:
        """Whether the second search is still not started: during the probe, after it while
        the favoured search's `eta` ends before the deadline, and when its root would not fit
        (`root_fits`)."""
        if any(lane.open_ is not None or lane.ended for lane in self.lanes[1:]):
            return False
        if first.seconds < self.config.probe * total or not self.root_fits(total, deadline):
            return True
        return first.eta() < deadline - time.monotonic()

    def shares(self, total: float) -> dict[str, float]:
        """Each search's share of the time: the priors until each has run `probe` of the time
        and one has closed part of its tree; then proportional to its predicted speed of
        finishing (`1 / eta`), at least `floor`."""
        c = self.config
        prior = {lane.name: lane.prior for lane in self.lanes}
        probed = all(lane.seconds >= c.probe * total for lane in self.lanes)
        speed = {lane.name: 1.0 / max(lane.eta(), 1e-9) for lane in self.lanes}
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
