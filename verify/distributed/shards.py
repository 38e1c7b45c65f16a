"""One hard instance sharded over Ray actors: `verify.verify(..., workers=N)` and
`python -m verify run ... --workers N` decide each region with `ShardedSolver`.

Per region the coordinator (this process) runs the serial search's root (input splitting: the
region's box bounded and confirmed; ReLU splitting: the root's intermediate bounds and root
domains) and keeps stepping it while the workers start, and until there is an open domain per
worker (at most `SHARD_STEPS` steps more). It then deals the open domains into N shards (by
margin order) and puts them on the board (`board.py`); each
worker takes a shard, steps the same search on it (`searches.py`), and gives half of its
domains to the board whenever a worker runs dry (work stealing; ReLU-split domains travel with
their slopes and multipliers, the warm start of their children).

The answer is the serial one's:
- "sat" as soon as a worker validates a counterexample; the coordinator validates it again
  (float64, in the region's box), stops the board, waits `GRACE_SECONDS` for the other workers
  to return and kills those that have not;
- "unsat" only when the board finished (no domain anywhere), every worker reported "done" and
  no domain was dropped unproven (ReLU splitting's unsplittable domains);
- "timeout" at the deadline: every worker stops itself at it (within one bounding chunk), and
  workers still running `HARD_STOP_SECONDS` after it are killed;
- "unknown" past the domain limit or after a worker error.
A worker that dies (its process killed, `ray.kill`, a crash) loses its domains: the region is
re-run once, on fresh workers, with the time left; a second loss answers "unknown".

The workers (a `ShardPool`: N actors of `threads` CPUs and one board) are kept for the next call
with the same shape in this process and released by `cluster.shutdown`.
"""

from __future__ import annotations

import copy
import time
import uuid
from types import ModuleType
from typing import Any

import torch
from torch import nn

from verify.attack import validate
from verify.bab import BabConfig
from verify.bab.common import DeadlineReachedError, RegionOutcome
from verify.distributed import cluster, progress
from verify.distributed.board import Board
from verify.distributed.searches import make_search, portable, shards_of
from verify.distributed.workers import ShardReport, ShardWorker
from verify.property import Region

GRACE_SECONDS = 1.0  # after a stop: how long workers get to return before they are killed
HARD_STOP_SECONDS = 0.5  # after the deadline: the same
WAIT_SECONDS = 0.25  # the coordinator's polling period (progress, deadline)
RERUNS = 1  # re-runs of a region after a worker died
SHARD_STEPS = 8  # coordinator steps, once the workers are up, towards one shard per worker

SUMMED = ("domains", "batches", "attacks", "rechecked", "recheck_failed", "recheck_seconds",
          "strong_domains", "closed", "unsplittable", "gifts", "prox_domains", "prox_pruned")  # fmt: skip
LARGEST = ("max_open", "max_depth")

_pools: dict[tuple, ShardPool] = {}


def lost_errors(ray: ModuleType) -> tuple[type, ...]:
    """The Ray errors that mean a worker (or an object it owned) is gone."""
    ex = ray.exceptions
    return (ex.RayActorError, ex.WorkerCrashedError, ex.ObjectLostError, ex.NodeDiedError)


class ShardPool:
    """`workers` `ShardWorker` actors (`threads` CPUs, `gpus` GPU share each) and a `Board`."""

    def __init__(self, ray: ModuleType, workers: int, threads: int, gpus: float) -> None:
        self.ray, self.threads, self.gpus = ray, threads, gpus
        self.worker_class = ray.remote(ShardWorker)
        self.board = ray.remote(Board).options(num_cpus=0).remote()
        self.actors: list[Any] = [None] * workers
        self.booting: dict[Any, int] = {}
        self.pids: dict[int, int] = {}
        self.token: str | None = None  # of the search on the board (for observers)
        self.key: tuple = ()  # in the cache of pools
        for rank in range(workers):
            self._spawn(rank)

    def _spawn(self, rank: int) -> None:
        options = dict(num_cpus=self.threads, num_gpus=self.gpus, max_restarts=0)
        actor = self.worker_class.options(**options).remote(self.threads)
        self.actors[rank] = actor
        self.pids.pop(rank, None)
        self.booting[actor.ready.remote()] = rank

    def ready(self) -> bool:
        """Whether every actor has started (non-blocking); an actor that died while starting is
        replaced."""
        if self.booting:
            done, _ = self.ray.wait(list(self.booting), num_returns=len(self.booting), timeout=0)
            for ref in done:
                rank = self.booting.pop(ref)
                try:
                    self.pids[rank] = self.ray.get(ref)
                except lost_errors(self.ray):
                    self._spawn(rank)
        return not self.booting

    def replace(self, rank: int) -> None:
        """Kill the actor of `rank` (if still alive) and start a fresh one."""
        self.ray.kill(self.actors[rank], no_restart=True)
        self._spawn(rank)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.ray.kill(self.board, no_restart=True)
        self.actors, self.booting = [], {}


def pool_for(ray: ModuleType, workers: int, threads: int, gpus: float) -> ShardPool:
    """The cached pool of this shape on the connected cluster (a new one after a reconnect)."""
    key = (ray.get_runtime_context().get_node_id(), workers, threads, gpus)
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = ShardPool(ray, workers, threads, gpus)
        pool.key = key
        cluster.on_shutdown(lambda: _release(key))
    return pool


def _release(key: tuple) -> None:
    pool = _pools.pop(key, None)
    if pool is not None:
        pool.close()


def merged_stats(coordinator: dict, reports: list[ShardReport]) -> dict[str, Any]:
    """The coordinator's search counters with every worker's added (sums; maxima for the
    `LARGEST` ones)."""
    stats = dict(coordinator)
    stats["coordinator_domains"] = coordinator.get("domains", 0)
    for report in reports:
        for key in SUMMED:
            if key in report.stats:
                stats[key] = stats.get(key, 0) + report.stats[key]
        for key in LARGEST:
            if key in report.stats:
                stats[key] = max(stats.get(key, 0), report.stats[key])
    if "recheck_seconds" in stats:
        stats["recheck_seconds"] = round(stats["recheck_seconds"], 4)
    return stats


class ShardedSolver:
    """`solve_region`'s signature, sharded over `workers` Ray actors (see the module
    docstring). Connecting (or starting a local cluster) happens here; `RayUnavailableError`
    without Ray, `ClusterError` for a cluster that cannot be reached or is too small."""

    def __init__(self, workers: int, address: str | None = None, threads: int | None = None):
        self.threads = threads or torch.get_num_threads()
        what = f"workers={workers}" if address is None else f"ray address {address}"
        self.ray = cluster.connect(workers, address, self.threads, what)
        self.workers = workers

    def __call__(self, net: nn.Module, region: Region, deadline: float,
                 config: BabConfig | None = None, seed: int = 0) -> RegionOutcome:  # fmt: skip
        config = config or BabConfig()
        device = next(net.parameters()).device.type
        gpus = cluster.gpu_share(self.ray, device, self.workers)
        restarts = 0
        while True:
            pool = pool_for(self.ray, self.workers, self.threads, gpus)
            try:
                outcome = Run(self.ray, pool, net, region, config, seed, deadline).solve()
            except lost_errors(self.ray) as error:  # the board itself died: a new pool
                _release(pool.key)
                outcome = RegionOutcome("lost", None, {"error": repr(error)})
            if outcome.status != "lost":
                break
            if restarts == RERUNS or time.monotonic() >= deadline:
                outcome.status = "unknown"
                break
            restarts += 1
        outcome.stats["restarts"] = restarts
        return outcome


class Run:
    """One attempt at one region (`solve`); status "lost" when a worker died."""

    def __init__(self, ray: ModuleType, pool: ShardPool, net: nn.Module, region: Region,
                 config: BabConfig, seed: int, deadline: float) -> None:  # fmt: skip
        self.ray, self.pool, self.net, self.region = ray, pool, net, region
        self.config, self.seed, self.deadline = config, seed, deadline
        self.search, self.mode = make_search(net, region, config, seed)
        self.search.deadline = deadline
        self.bar = progress.current()

    def solve(self) -> RegionOutcome:
        search, stats = self.search, self.search.stats
        stats["mode"], stats["workers"] = self.mode, len(self.pool.actors)
        if not self.region.unsafe:
            return RegionOutcome("unsat", None, stats)
        try:
            open_, found = search.begin()
            extra = 0  # steps after the workers are up, to have a shard for each
            while found is None and len(open_):
                if self.pool.ready():
                    if len(open_) >= len(self.pool.actors) or extra == SHARD_STEPS:
                        break
                    extra += 1
                if time.monotonic() >= self.deadline:
                    return RegionOutcome("timeout", None, stats)
                if search.too_many(open_):
                    return RegionOutcome("unknown", None, stats)
                open_, found = search.step(open_)
                self._show(int(stats["domains"]), len(open_))
        except DeadlineReachedError:
            return RegionOutcome("timeout", None, stats)
        if found is not None:
            return RegionOutcome("sat", found, stats)
        if not len(open_):
            return RegionOutcome("unknown" if search.unproven() else "unsat", None, stats)
        if time.monotonic() >= self.deadline:
            return RegionOutcome("timeout", None, stats)
        return self._distribute(open_)

    def _show(self, domains: int, open_domains: int | None) -> None:
        if self.bar is not None:
            self.bar.searching(domains, open_domains)

    def _distribute(self, open_) -> RegionOutcome:
        ray, pool = self.ray, self.pool
        token = uuid.uuid4().hex
        refs = [ray.put(portable(s)) for s in shards_of(open_, len(pool.actors))]
        ray.get(pool.board.reset.remote(token, refs))
        pool.token = token
        device = next(self.net.parameters()).device.type
        net_ref = ray.put(self.net if device == "cpu" else copy.deepcopy(self.net).cpu())
        context = self.search.context()
        seconds = self.deadline - time.monotonic()
        futures = {
            actor.run.remote(token, pool.board, rank, net_ref, device, self.region, self.mode,
                             self.config, self.seed, context, seconds): rank
            for rank, actor in enumerate(pool.actors)
        }  # fmt: skip
        reports: dict[int, ShardReport] = {}
        problems: dict[int, str] = {}
        try:
            found = self._collect(token, futures, reports, problems)
        finally:
            pool.token = None
            for rank in futures.values():  # still running after the grace: kill them
                pool.replace(rank)
                problems.setdefault(rank, "killed")
        return self._outcome(token, found, reports, problems)

    def _collect(self, token, futures: dict, reports: dict, problems: dict):
        """Wait for the workers (removing each from `futures` as it returns); the validated
        counterexample, if one was found."""
        ray, board, found, stopped = self.ray, self.pool.board, None, None
        while futures:
            ready, _ = ray.wait(list(futures), num_returns=1, timeout=WAIT_SECONDS)
            for ref in ready:
                rank = futures.pop(ref)
                try:
                    report = ray.get(ref)
                except lost_errors(ray) as error:
                    problems[rank] = f"lost: {type(error).__name__}"
                    self.pool.replace(rank)  # a fresh worker for the re-run
                    ray.get(board.stop.remote(token, "lost"))
                    continue
                except ray.exceptions.RayTaskError as error:
                    lost = isinstance(error.cause, lost_errors(ray))  # e.g. a donor's objects
                    problems[rank] = f"{'lost' if lost else 'error'}: {error.cause!r}"
                    ray.get(board.stop.remote(token, "lost" if lost else "error"))
                    continue
                reports[rank] = report
                if report.status == "sat" and found is None:
                    found = self._validated(report)
                    if found is None:
                        problems[rank] = "invalid counterexample"
            now = time.monotonic()
            if stopped is None and (found is not None or problems):
                stopped = now
                ray.get(board.stop.remote(token, "sat" if found is not None else "problem"))
            if stopped is not None and now - stopped >= GRACE_SECONDS:
                break
            if now >= self.deadline + HARD_STOP_SECONDS:
                ray.get(board.stop.remote(token, "timeout"))
                break
            state = ray.get(board.progress.remote(token))
            self._show(int(self.search.stats["domains"]) + state["domains"], state["open"])
        return found

    def _validated(self, report: ShardReport):
        """The worker's counterexample checked again here (float64, in the region's box)."""
        x = report.counterexample[0]
        return validate(self.net, self.region, x.reshape(1, *self.search.shape))

    def _outcome(self, token, found, reports: dict, problems: dict) -> RegionOutcome:
        state = self.ray.get(self.pool.board.progress.remote(token))
        ordered = [reports[r] for r in sorted(reports)]
        stats = merged_stats(self.search.stats, ordered)
        statuses = {r: reports[r].status for r in reports} | problems
        stats["worker_status"] = [statuses.get(r, "missing") for r in range(len(self.pool.actors))]
        stats["worker_pids"] = sorted({r.pid for r in ordered} | set(self.pool.pids.values()))
        for key in (
            "domains",
            "step_seconds",
            "wait_seconds",
            "board_seconds",
            "cpu_seconds",
            "thread_seconds",
        ):
            stats[f"worker_{key}"] = [r.stats.get(key) for r in ordered]
        stats["gifts"] = state["gifts"]
        unproven = self.search.unproven() + sum(r.stats.get("unsplittable", 0) for r in ordered)
        if self.bar is not None:
            self.bar.region_done()
        if found is not None:
            return RegionOutcome("sat", found, stats)
        if any(p.startswith("lost") for p in problems.values()):
            return RegionOutcome("lost", None, stats)
        every = len(reports) == len(self.pool.actors) and not problems
        if every and state["finished"] and all(r.status == "done" for r in ordered):
            return RegionOutcome("unknown" if unproven else "unsat", None, stats)
        serious = [p for p in problems.values() if p != "killed"]  # killed: past a stop
        if serious or any(r.status == "unknown" for r in ordered):
            return RegionOutcome("unknown", None, stats)
        return RegionOutcome("timeout", None, stats)
