"""The work board of one sharded search: a Ray actor (async) holding the pool of shipped
domain batches, which workers are busy, which are hungry, the stop signal and the progress
counters.

Protocol (every call carries the search's `token`; a call with another token is told to stop):
- `reset(token, refs)`: a new search; the pool holds the coordinator's first shards.
- `take(token, rank, counters, seconds)`: a worker with no domains left asks for work. It is no
  longer busy; it waits until the pool has a batch (it gets one and is busy again), the search
  is stopped, `seconds` pass, or no worker is busy and the pool is empty: then the search is
  finished and every worker is told "done".
- `give(token, rank, refs)`: a busy worker hands batches to the pool (it keeps some domains, so
  it stays busy while it gives; it waits for the reply).
- `poll(token, rank, counters)`: the stop reason (or None) and how many hungry workers the pool
  cannot serve yet.
- `stop(token, reason)`: the first reason wins ("sat", "timeout", "unknown", "lost", ...).

Why "done" is sound: an open domain is always in the pool, held by a busy worker, or inside a
`give` call (its sender is busy). A worker leaves the busy set only by calling `take` with no
domains, so "pool empty and no worker busy" means every domain was closed by a worker's
search, i.e. pruned by the serial procedure. Batches are `ray.put` object references kept in
lists, so the board passes them on without copying the domains.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any


class Board:
    """See the module docstring. Counters per rank: `{"domains": bounded, "open": held}`."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.pool: list[Any] = []
        self.busy: set[int] = set()
        self.hungry: set[int] = set()
        self.reason: str | None = None
        self.finished = False
        self.counters: dict[int, dict[str, int]] = {}
        self.gifts = 0
        self.changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self.changed is None:  # created inside the actor's event loop
            self.changed = asyncio.Condition()
        return self.changed

    async def reset(self, token: str, refs: list[Any]) -> None:
        async with self._condition():
            self.token, self.pool = token, list(refs)
            self.busy, self.hungry, self.counters = set(), set(), {}
            self.reason, self.finished, self.gifts = None, False, 0
            self._condition().notify_all()

    async def take(self, token: str, rank: int, counters: dict, seconds: float) -> tuple[str, Any]:
        """("work", [ref]), ("done", None), ("stop", reason) or ("wait", None) after
        `seconds` without any of those."""
        cond = self._condition()
        end = time.monotonic() + max(0.0, seconds)
        async with cond:
            if token != self.token:
                return "stop", "stale"
            self.counters[rank] = dict(counters)
            self.busy.discard(rank)
            self.hungry.add(rank)
            cond.notify_all()  # the busy set changed: waiters may now see "finished"
            while True:
                if self.reason is not None or token != self.token:
                    return "stop", self.reason or "stale"
                if self.pool:
                    self.hungry.discard(rank)
                    self.busy.add(rank)
                    return "work", [self.pool.pop()]
                if not self.busy:
                    self.finished = True
                    return "done", None
                left = end - time.monotonic()
                if left <= 0:
                    return "wait", None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cond.wait(), timeout=left)

    async def give(self, token: str, rank: int, refs: list[Any]) -> bool:
        """Add the batches to the pool; False (nothing added) for a stale token."""
        async with self._condition():
            if token != self.token or rank not in self.busy:
                return False
            self.pool.extend(refs)
            self.gifts += len(refs)
            self._condition().notify_all()
            return True

    async def poll(self, token: str, rank: int, counters: dict) -> tuple[str | None, int]:
        if token != self.token:
            return "stale", 0
        self.counters[rank] = dict(counters)
        return self.reason, max(0, len(self.hungry) - len(self.pool))

    async def stop(self, token: str, reason: str) -> None:
        async with self._condition():
            if token == self.token and self.reason is None:
                self.reason = reason
            self._condition().notify_all()

    async def progress(self, token: str) -> dict[str, Any]:
        """Summed counters, the pool size, donations, finished and the stop reason."""
        same = token == self.token
        counters = self.counters.values() if same else ()
        return {
            "domains": sum(c.get("domains", 0) for c in counters),
            "open": sum(c.get("open", 0) for c in counters),
            "per_rank": {r: dict(c) for r, c in self.counters.items()} if same else {},
            "pool": len(self.pool) if same else 0,
            "gifts": self.gifts if same else 0,
            "finished": self.finished and same,
            "reason": self.reason if same else "stale",
        }
