"""A shard worker: a Ray actor that runs one region's steppable search (`searches.py`) on the
domains it takes from the board (`board.py`), gives half of them away when another worker runs
dry, and reports how its part ended.

A worker's report (`ShardReport.status`):
- "done": the board said every domain of the search is closed (see `board.py`);
- "sat": it validated a counterexample (float64, in the region's box) and stopped the board;
- "timeout": its deadline passed (it stopped the board);
- "unknown": it held more open domains than its limit (it stopped the board);
- "stopped": the board was stopped by someone else (a counterexample, the deadline, ...).
Only "done" from every worker, and no domain dropped unproven (`unproven`), makes the region's
answer "unsat" (`shards.py`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from verify.bab import BabConfig
from verify.bab.common import DeadlineReachedError, DomainBatch
from verify.distributed.cluster import require_ray
from verify.distributed.searches import (
    Context,
    InputShard,
    ReluShard,
    donation,
    portable,
    search_for,
    warm_up,
)
from verify.property import Region

POLL_SECONDS = 0.05  # between a busy worker's board polls (one round trip each)
WAIT_SECONDS = 0.5  # longest wait for work before the worker re-checks its deadline


@dataclass
class ShardReport:
    """How one worker's part of a search ended (see the module docstring); `counterexample`
    `(x, y)` float64 on the CPU when "sat"; `stats` the search's counters plus `gifts`."""

    status: str
    rank: int
    pid: int
    counterexample: tuple[torch.Tensor, torch.Tensor] | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class WorkLoop:
    """The loop of one worker on one search (`run`); `ray` is the imported module."""

    def __init__(self, ray: ModuleType, board: Any, token: str, rank: int,
                 search: InputShard | ReluShard, deadline: float) -> None:  # fmt: skip
        self.ray, self.board, self.token, self.rank = ray, board, token, rank
        self.search, self.deadline = search, deadline
        self.search.deadline = deadline
        self.last_poll = 0.0
        self.gifts = 0
        self.seconds = {"step": 0.0, "wait": 0.0, "board": 0.0}  # where the time went

    def counters(self, open_: DomainBatch | None) -> dict[str, int]:
        return {"domains": int(self.search.stats["domains"]), "open": len(open_ or ())}

    def _stop(self, reason: str) -> None:
        self.ray.get(self.board.stop.remote(self.token, reason))

    def run(self) -> tuple[str, Any]:
        """The worker's status and its counterexample (or None)."""
        open_ = None
        try:
            while True:
                if open_ is None or not len(open_):
                    got = self._take(open_)
                    if isinstance(got, str):
                        return got, None
                    open_ = got
                    continue
                if time.monotonic() >= self.deadline:
                    self._stop("timeout")
                    return "timeout", None
                if self.search.too_many(open_):
                    self._stop("unknown")
                    return "unknown", None
                tick = time.perf_counter()
                open_, found = self.search.step(open_)
                self.seconds["step"] += time.perf_counter() - tick
                if found is not None:
                    self._stop("sat")
                    return "sat", found
                status, open_ = self._poll(open_)
                if status is not None:
                    return status, None
        except DeadlineReachedError:
            self._stop("timeout")
            return "timeout", None

    def _take(self, open_) -> Any:
        """The next batch of domains from the board, or the status to end with."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._stop("timeout")
            return "timeout"
        counters = self.counters(open_)
        tick = time.perf_counter()
        kind, payload = self.ray.get(
            self.board.take.remote(self.token, self.rank, counters, min(left, WAIT_SECONDS))
        )
        if kind == "work":
            payload = self.ray.get(payload[0])
        self.seconds["wait"] += time.perf_counter() - tick
        if kind == "done":
            return "done"
        if kind == "stop":
            return "stopped"
        if kind == "wait":
            return open_
        return self.search.receive(payload)

    def _poll(self, open_) -> tuple[str | None, Any]:
        """Every POLL_SECONDS: stop if the board says so; give domains to hungry workers."""
        now = time.monotonic()
        if now - self.last_poll < POLL_SECONDS:
            return None, open_
        self.last_poll = now
        tick = time.perf_counter()
        try:
            reason, wanted = self.ray.get(
                self.board.poll.remote(self.token, self.rank, self.counters(open_))
            )
            if reason is not None:
                return "stopped", open_
            if wanted > 0 and len(open_) >= 2:
                keep, gifts = donation(open_, wanted)
                refs = [self.ray.put(portable(g)) for g in gifts]
                if self.ray.get(self.board.give.remote(self.token, self.rank, refs)):
                    self.gifts += len(gifts)
                    return None, keep
            return None, open_
        finally:
            self.seconds["board"] += time.perf_counter() - tick


class ShardWorker:
    """The actor (wrapped by `ray.remote` in `shards.py`): `threads` torch threads."""

    def __init__(self, threads: int) -> None:
        torch.set_num_threads(threads)
        warm_up()  # before `ready`: a search's first steps pay no first-call costs
        self.pid = os.getpid()

    def ready(self) -> int:
        return self.pid

    def run(self, token: str, board: Any, rank: int, net: nn.Module, device: str, region: Region,
            mode: str, config: BabConfig,
            seed: int, context: Context, seconds: float) -> ShardReport:  # fmt: skip
        """Work on the board's search of `region` for at most `seconds` (from the call), with
        `net` (this process's copy) moved to `device`."""
        deadline = time.monotonic() + seconds
        cpu, own = time.process_time(), time.thread_time()
        ray = require_ray("a shard worker")
        search = search_for(mode, net.to(device), region, config, seed + rank)
        search.adopt(context)
        loop = WorkLoop(ray, board, token, rank, search, deadline)
        status, found = loop.run()
        stats = dict(search.stats) | {"gifts": loop.gifts}
        stats |= {f"{k}_seconds": round(v, 3) for k, v in loop.seconds.items()}
        stats["cpu_seconds"] = round(time.process_time() - cpu, 3)  # Ray's threads too
        stats["thread_seconds"] = round(time.thread_time() - own, 3)  # the search's thread
        if found is not None:
            found = tuple(t.detach().cpu() for t in found)
        return ShardReport(status, rank, self.pid, found, stats)
