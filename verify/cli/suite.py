"""`python -m verify run-all instances.csv --workers N` (or `--ray ADDRESS`): the instances as Ray
tasks, one per instance, each with its timeout and its CPU/GPU share.

- Order: longest expected first (the largest scaled timeout; ties in the file's order). At most
  one task per worker is in flight, so an instance starts when it is submitted and its clock
  (the scaled timeout, like the serial run's) starts then: queueing in Ray is charged to it.
  Before the first instance, `warm_up` loads the code in every worker (seconds of imports that
  the serial run also pays before its first instance).
- Answers: printed (`[k/n] network property: status seconds`) and written to `--out` as they
  arrive; when the run ends, `--out` is rewritten in the instances' order.
- Time limits: a task that has not answered `overdue(limit)` after its limit is cancelled
  (its worker process is killed) and written as "timeout".
- Dead workers: an instance whose worker died (`WorkerCrashedError`, a killed process) is
  re-run once with the time it has left; a second death writes "unknown".
- Bad rows and unreadable files are reported with their row number and skipped, as in the
  serial run; the first Ctrl-C cancels the running instances, writes them as "unknown", keeps
  the finished rows (exit status 130).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, TextIO

import torch

from bounds.errors import VerificationInputError
from verify.bab import ReluSplitConfig
from verify.cli.options import (
    bab_config,
    check_method,
    check_output_file,
    load_network,
    resolve,
)
from verify.cli.rows import Instance, read_instances, summary, write_rows
from verify.distributed import cluster
from verify.distributed.progress import Progress
from verify.distributed.searches import warm_up
from verify.io.vnnlib_load import load_vnnlib
from verify.verifier import verify

NET_CACHE_SIZE = 64  # networks kept per worker process


def overdue(limit: float) -> float:
    """Seconds past `limit` after which a running instance is cancelled: half the time-limit
    tolerance (5% or 1 s), so that its row is written within the tolerance."""
    return 0.5 * max(0.05 * limit, 1.0)


@dataclass(frozen=True)
class Settings:
    """What every instance of a suite shares (from the command line)."""

    method: str | None
    splitting: str
    prox_sweeps: int
    device: str
    threads: int
    hard_bounder: str = ReluSplitConfig.hard_bounder
    hard_stall: int = 0
    root_bounds: str = ReluSplitConfig.root_intermediate
    hard_warm_start: bool = ReluSplitConfig.hard_warm_start


@dataclass(frozen=True)
class Job:
    """One attempt at one instance: `index` in the instance list, the resolved paths, the
    seconds it may take from `submitted` (`time.time()`, comparable between processes on one
    machine), and the attempt number (0, then 1 for a re-run)."""

    index: int
    row: int
    network: str
    property: str
    budget: float
    submitted: float
    attempt: int = 0


@dataclass(frozen=True)
class Answer:
    """A task's result: the status (None when the instance was skipped, with `error`), the
    domains its search bounded, the worker's pid and the CPU seconds the task used."""

    index: int
    status: str | None
    domains: int = 0
    pid: int = 0
    error: str | None = None
    cpu_seconds: float = 0.0


_nets: OrderedDict[tuple, torch.nn.Module] = OrderedDict()


def cached_network(path: str, device: str) -> torch.nn.Module:
    """The network at `path` on `device`, kept per worker process; keyed on the path, its size
    and modification time, and the device (a changed file is read again)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, device)
    if key in _nets:
        _nets.move_to_end(key)
        return _nets[key]
    net = load_network(Path(path), device)
    _nets[key] = net
    while len(_nets) > NET_CACHE_SIZE:
        _nets.popitem(last=False)
    return net


def solve_job(job: Job, settings: Settings) -> Answer:
    """Run one instance in this (worker) process, as the serial `run-all` does."""
    start, cpu = time.monotonic(), time.process_time()
    torch.set_num_threads(settings.threads)
    queued = max(0.0, time.time() - job.submitted)
    options = SimpleNamespace(method=settings.method, splitting=settings.splitting,
                              prox_sweeps=settings.prox_sweeps,
                              hard_bounder=settings.hard_bounder,
                              hard_stall=settings.hard_stall,
                              root_bounds=settings.root_bounds,
                              hard_warm_start=settings.hard_warm_start)  # fmt: skip
    config = bab_config(options)
    try:
        net = cached_network(job.network, settings.device)
        prop = load_vnnlib(Path(job.property))
        check_method(options)
    except (VerificationInputError, OSError) as error:
        return Answer(job.index, None, error=str(error), pid=os.getpid())
    budget = job.budget - queued - (time.monotonic() - start)
    if budget <= 0:
        return Answer(job.index, "timeout", pid=os.getpid())
    result = verify(net, prop, timeout=budget, method=settings.method,
                    splitting=settings.splitting, config=config)  # fmt: skip
    domains = sum(int(r.get("domains", 0)) for r in result.stats.get("regions", []))
    return Answer(job.index, result.status, domains, os.getpid(),
                  cpu_seconds=time.process_time() - cpu)  # fmt: skip


def warm() -> int:
    """A task that loads this module (torch and the verifier with it) in its worker process and
    pays the first-call costs (`searches.warm_up`); its pid."""
    warm_up()
    return os.getpid()


def settings_of(args: argparse.Namespace) -> Settings:
    bounder = getattr(args, "hard_bounder", ReluSplitConfig.hard_bounder)
    stall = getattr(args, "hard_stall", 0)
    root = getattr(args, "root_bounds", ReluSplitConfig.root_intermediate)
    warm = getattr(args, "hard_warm_start", ReluSplitConfig.hard_warm_start)
    return Settings(
        args.method,
        args.splitting,
        args.prox_sweeps,
        args.device,
        args.threads,
        bounder,
        stall,
        root,
        warm,
    )


def run_suite(args: argparse.Namespace, out: TextIO | None = None, errors: TextIO | None = None,
              solve: Callable[[Job, Settings], Answer] = solve_job) -> list[dict]:  # fmt: skip
    """`run-all` over Ray (see the module docstring); returns the rows written to `args.out`.
    `solve` runs in the workers (tests replace it, e.g. by one that crashes once)."""
    out, errors = out or sys.stdout, errors or sys.stderr
    check_output_file(args.out, "--out")
    what = f"--workers {args.workers}" if args.ray is None else f"--ray {args.ray}"
    ray = cluster.connect(args.workers or 1, args.ray, args.threads, what)
    cluster.release()  # cached shard workers would hold the CPUs the tasks need
    workers = args.workers or cluster.cluster_workers(ray, args.threads)
    root = args.root or args.instances.parent
    instances = read_instances(args.instances, args.limit, errors)
    scheduler = Scheduler(ray, args, workers, settings_of(args), solve, out, errors)
    try:
        return scheduler.run(instances, root)
    finally:
        cluster.shutdown()


class Scheduler:
    """Submits the jobs (at most `workers` in flight) and collects the answers."""

    def __init__(self, ray: ModuleType, args: argparse.Namespace, workers: int, settings: Settings,
                 solve: Callable[[Job, Settings], Answer], out: TextIO, errors: TextIO) -> None:  # fmt: skip
        self.ray, self.args, self.workers, self.settings = ray, args, workers, settings
        self.out, self.errors = out, errors
        gpus = cluster.gpu_share(ray, settings.device, workers)
        self.options = dict(num_cpus=settings.threads, num_gpus=gpus, max_retries=0)
        self.task = ray.remote(solve).options(**self.options)
        self.inflight: dict[Any, Job] = {}
        self.first: dict[int, float] = {}  # index -> monotonic time of its first submission
        self.rows: dict[int, dict] = {}
        self.arrived: list[dict] = []
        self.cpu_seconds = 0.0  # of the answered tasks

    def warm_up(self, rounds: int = 3) -> set[int]:
        """Load the task's code in `workers` worker processes before any instance's clock
        starts (a fresh worker spends seconds importing torch); their pids."""
        probe = self.ray.remote(warm).options(**self.options)
        pids: set[int] = set()
        for _ in range(rounds):
            pids |= set(self.ray.get([probe.remote() for _ in range(self.workers)]))
            if len(pids) >= self.workers:
                break
        return pids

    def run(self, instances: list[Instance], root: Path) -> list[dict]:
        args = self.args
        args.interrupted = False
        self.instances = instances
        order = sorted(range(len(instances)), key=lambda i: -instances[i].timeout)
        pending = [self._job(i, root) for i in order]
        self.bar = Progress(self.workers, total=len(instances), stream=self.errors)
        try:
            self.warm_up()
            self.bar.start = time.monotonic()  # the rate counts from the first instance
            while pending or self.inflight:
                while pending and len(self.inflight) < self.workers:
                    self._submit(pending.pop(0))
                self._collect()
        except KeyboardInterrupt:
            args.interrupted = True
            for ref, job in list(self.inflight.items()):
                self.ray.cancel(ref, force=True)
                self._record(job.index, "unknown")
            self.inflight.clear()
        rows = [self.rows[i] for i in sorted(self.rows)]
        write_rows(args.out, rows)
        self.bar.close()
        if args.interrupted:
            print("interrupted: the finished rows are kept", file=self.errors, flush=True)
        print(summary(rows), file=self.out, flush=True)
        return rows

    def _job(self, index: int, root: Path) -> Job:
        instance = self.instances[index]
        paths = [str(resolve(root, name)) for name in (instance.network, instance.property)]
        budget = instance.timeout * self.args.timeout_scale
        return Job(index, instance.row, paths[0], paths[1], budget, 0.0)

    def _submit(self, job: Job) -> None:
        now = time.monotonic()
        self.first.setdefault(job.index, now)
        job = replace(job, submitted=time.time())
        self.inflight[self.task.remote(job, self.settings)] = job

    def _limit(self, index: int) -> float:
        return self.instances[index].timeout * self.args.timeout_scale

    def _collect(self) -> None:
        """Wait a little for answers; record them; re-run lost ones; cancel overdue ones."""
        ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=0.2)
        for ref in ready:
            self._receive(ref)
        now = time.monotonic()
        for ref, job in list(self.inflight.items()):
            limit = self._limit(job.index)
            if now - self.first[job.index] > limit + overdue(limit):
                self.ray.cancel(ref, force=True)
                del self.inflight[ref]
                self._record(job.index, "timeout")

    def _receive(self, ref) -> None:
        """Record the answer of a finished task (it stays in flight until its result is read:
        a Ctrl-C meanwhile writes it as "unknown")."""
        ray, job = self.ray, self.inflight[ref]
        lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.RayActorError,
                ray.exceptions.NodeDiedError)  # fmt: skip
        try:
            answer = ray.get(ref)
        except lost as error:
            del self.inflight[ref]
            self._lost(job, error)
            return
        except ray.exceptions.TaskCancelledError:
            del self.inflight[ref]
            return
        except ray.exceptions.RayTaskError as error:
            del self.inflight[ref]
            self._note(f"{self.args.instances}:{job.row}: error: {error.cause!r}")
            self._record(job.index, "unknown")
            return
        del self.inflight[ref]
        if answer.status is None:
            self._note(f"{self.args.instances}:{job.row}: skipped: {answer.error}")
            self.bar.answer("skipped")
            return
        self.cpu_seconds += answer.cpu_seconds
        self._record(job.index, answer.status, answer.domains)

    def _lost(self, job: Job, error: Exception) -> None:
        """The worker running `job` died: re-run once with the time left, else "unknown"."""
        left = self._limit(job.index) - (time.monotonic() - self.first[job.index])
        name = type(error).__name__
        if job.attempt == 0 and left > 0:
            self._note(f"{self.args.instances}:{job.row}: worker lost ({name}); re-run with "
                       f"{left:.1f} s left")  # fmt: skip
            self._submit(replace(job, budget=left, attempt=1))
            return
        self._note(f"{self.args.instances}:{job.row}: worker lost again ({name})")
        self._record(job.index, "unknown" if left > 0 else "timeout")

    def _note(self, text: str) -> None:
        self.bar.note(text, self.errors)

    def _record(self, index: int, status: str, domains: int = 0) -> None:
        instance = self.instances[index]
        seconds = time.monotonic() - self.first[index]
        row = dict(network=instance.network, property=instance.property, result=status,
                   seconds=round(seconds, 3))  # fmt: skip
        self.rows[index] = row
        self.arrived.append(row)
        total = len(self.instances)
        self.bar.note(f"[{len(self.arrived)}/{total}] {instance.network} {instance.property}: "
                      f"{status} {seconds:.2f} s", self.out)  # fmt: skip
        self.bar.answer(status, domains)
        write_rows(self.args.out, self.arrived)  # as answers arrive; ordered at the end
