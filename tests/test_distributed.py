"""Scale-out without a Ray cluster (the default suite): a missing Ray gives a clear error (its
absence simulated), one worker needs no Ray, bad worker counts are refused; the sharding logic
in one process (the board's protocol, shards and donations that partition the domains, worker
loops in threads on an in-process board: the serial answers); the suite scheduler's re-runs,
cancellations and row order against a scripted stand-in for Ray; the progress bar."""

from __future__ import annotations

import asyncio
import io
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import verify
import verify.verifier as verifier
from bounds.errors import InvalidLimitError
from tests.bad_inputs.conftest import no_side_effects, raises_where
from tests.test_bab import hard_instance, milp_minimum
from tests.test_relu_bab import milp_property
from verify.bab import BabConfig, Domains
from verify.cli.main import build_parser, main
from verify.cli.rows import Instance
from verify.cli.suite import Answer, Job, Scheduler, Settings, cached_network, solve_job
from verify.distributed import RayUnavailableError, progress
from verify.distributed.board import Board
from verify.distributed.searches import donation, make_search, search_for, shards_of
from verify.distributed.workers import WorkLoop
from verify.property import Polytope, Region, VnnlibProperty

ACAS = Path("vnncomp2022") / "acasxu"


def tiny() -> tuple[nn.Module, VnnlibProperty]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    region = Region(-np.ones(3), np.ones(3), (Polytope(np.array([[1.0, -1.0]]), [-50.0]),))
    return net, VnnlibProperty("<tiny>", 3, 2, (region,))


@pytest.fixture
def no_ray(monkeypatch):
    """Ray absent: `import ray` raises ImportError (whether or not it is installed)."""
    monkeypatch.setitem(sys.modules, "ray", None)


# ----- a missing Ray, one worker, bad counts -----


@pytest.mark.parametrize(
    "argv, option",
    [
        (["run-all", "instances.csv", "--out", "out.csv", "--workers", "2"], "--workers 2"),
        (["run", "net.onnx", "prop.vnnlib", "--timeout", "5", "--workers", "2"], "--workers 2"),
        (["run-all", "instances.csv", "--out", "out.csv", "--ray", "auto"], "--ray auto"),
        (["run", "net.onnx", "prop.vnnlib", "--timeout", "5", "--ray", "auto"], "--ray auto"),
    ],
    ids=["run-all-workers", "run-workers", "run-all-ray", "run-ray"],
)
def test_missing_ray_gives_a_clear_error(no_ray, tmp_path, monkeypatch, capsys, argv, option):
    monkeypatch.chdir(tmp_path)
    with no_side_effects(tmp_path):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in (option, "needs Ray", "pip install 'ldverify[distributed]'"):
        assert fragment in err, err


def test_missing_ray_is_reported_by_the_api_before_any_work(no_ray, monkeypatch):
    calls = []
    monkeypatch.setattr(verifier, "_attack_all", lambda *a: calls.append(a))
    net, prop = tiny()
    with raises_where(RayUnavailableError, "workers=2", "needs Ray", "ldverify[distributed]"):
        verify.verify(net, prop, timeout=5, workers=2)
    assert not calls


def test_one_worker_needs_no_ray(no_ray):
    net, prop = tiny()
    assert verify.verify(net, prop, timeout=5, workers=1).status == "unsat"


@pytest.mark.data
def test_the_command_line_with_one_worker_needs_no_ray(no_ray, shared_data, tmp_path, capsys):
    folder = shared_data / ACAS
    rows = "onnx/ACASXU_run2a_1_1_batch_2000.onnx,vnnlib/prop_1.vnnlib,30\n"
    (tmp_path / "instances.csv").write_text(rows)
    out = tmp_path / "out.csv"
    argv = ["run-all", str(tmp_path / "instances.csv"), "--root", str(folder), "--out", str(out)]
    assert main([*argv, "--workers", "1"]) == 0
    assert "unsat" in out.read_text()


@pytest.mark.parametrize(
    "workers",
    [0, -1, 1.5, True, "2", None],
    ids=["zero", "negative", "float", "bool", "str", "none"],
)
def test_bad_worker_counts_are_refused_up_front(workers, monkeypatch):
    calls = []
    monkeypatch.setattr(verifier, "_attack_all", lambda *a: calls.append(a))
    net, prop = tiny()
    with raises_where(InvalidLimitError, "workers", repr(workers)):
        verify.verify(net, prop, timeout=5, workers=workers)
    assert not calls


@pytest.mark.parametrize("value", ["0", "-2", "two"], ids=["zero", "negative", "word"])
def test_the_command_line_refuses_bad_worker_counts(value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["run", "n", "p", "--timeout", "1", "--workers", value])
    assert info.value.code == 2
    assert "--workers" in capsys.readouterr().err


# ----- shards and donations partition the domains -----


def domains(n: int, seed: int = 0) -> Domains:
    gen = torch.Generator().manual_seed(seed)
    lower = torch.rand(n, 3, generator=gen)
    rows = torch.randn(n, 2, generator=gen)
    depth = torch.arange(n)
    return Domains(lower, lower + 1, rows, -torch.rand(n, generator=gen), depth)


@pytest.mark.parametrize("n, pieces", [(1, 3), (2, 1), (7, 3), (64, 8)])
def test_shards_and_donations_partition_the_domains(n, pieces):
    d = domains(n)
    parts = shards_of(d, pieces)
    assert len(parts) == min(n, pieces) and all(len(p) for p in parts)
    ids = torch.cat([p.depth for p in parts])
    assert sorted(ids.tolist()) == list(range(n))  # each domain exactly once
    for p in parts:  # travelling intact: the box, bounds and margin of each domain
        assert torch.equal(p.lower, d.lower[p.depth]) and torch.equal(p.rows, d.rows[p.depth])
    if n >= 2:
        keep, gifts = donation(d, pieces)
        given = torch.cat([keep.depth, *[g.depth for g in gifts]])
        assert sorted(given.tolist()) == list(range(n)) and len(keep) >= 1
        assert float(keep.margin.min()) == float(d.margin.min())  # the donor keeps the worst


# ----- the board's protocol -----


def run_async(coro):
    return asyncio.run(coro)


def test_the_board_finishes_only_when_the_pool_is_empty_and_nobody_is_busy():
    async def scenario():
        board = Board()
        await board.reset("t", ["a", "b"])
        assert await board.take("t", 0, {}, 0) == ("work", ["b"])
        assert await board.take("t", 1, {}, 0) == ("work", ["a"])
        assert await board.poll("t", 0, {"domains": 5, "open": 2}) == (None, 0)
        # rank 1 runs dry while rank 0 is busy: it waits, and is counted as hungry
        assert await board.take("t", 1, {}, 0.01) == ("wait", None)
        assert await board.poll("t", 0, {}) == (None, 1)
        assert await board.give("t", 0, ["c"]) is True
        assert await board.give("t", 1, ["x"]) is False  # not busy: nothing added
        assert await board.take("t", 1, {}, 0) == ("work", ["c"])
        assert await board.take("t", 0, {}, 0.01) == ("wait", None)  # rank 1 still busy
        assert not (await board.progress("t"))["finished"]
        assert await board.take("t", 1, {}, 0) == ("done", None)
        assert await board.take("t", 0, {}, 0) == ("done", None)
        assert (await board.progress("t"))["finished"]

    run_async(scenario())


def test_a_waiting_worker_wakes_on_a_gift_on_done_and_on_stop():
    async def scenario():
        board = Board()
        await board.reset("t", ["a"])
        await board.take("t", 0, {}, 0)
        waiting = asyncio.ensure_future(board.take("t", 1, {}, 5))
        await asyncio.sleep(0.01)
        await board.give("t", 0, ["b"])
        assert await asyncio.wait_for(waiting, 1) == ("work", ["b"])
        waiting = asyncio.ensure_future(board.take("t", 0, {}, 5))
        await asyncio.sleep(0.01)
        assert await asyncio.wait_for(board.take("t", 1, {}, 5), 1) == ("done", None)
        assert await asyncio.wait_for(waiting, 1) == ("done", None)
        await board.reset("u", ["a"])
        await board.take("u", 0, {}, 0)
        waiting = asyncio.ensure_future(board.take("u", 1, {}, 5))
        await asyncio.sleep(0.01)
        await board.stop("u", "sat")
        await board.stop("u", "timeout")  # the first reason wins
        assert await asyncio.wait_for(waiting, 1) == ("stop", "sat")
        assert (await board.poll("u", 0, {}))[0] == "sat"
        assert not (await board.progress("u"))["finished"]

    run_async(scenario())


def test_calls_of_an_old_search_are_told_to_stop():
    async def scenario():
        board = Board()
        await board.reset("old", ["a"])
        await board.reset("new", ["b"])
        assert await board.take("old", 0, {}, 0) == ("stop", "stale")
        assert await board.give("old", 0, ["x"]) is False
        assert (await board.poll("old", 0, {}))[0] == "stale"
        assert await board.take("new", 0, {}, 0) == ("work", ["b"])

    run_async(scenario())


# ----- worker loops in threads on an in-process board -----


class InProcessRay:
    """What `WorkLoop` needs of Ray, in one process: the board's coroutines run on an event
    loop in a thread; `put` and `get` pass objects through."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def put(self, value):
        return value

    def get(self, value):
        return value

    def handle(self, board: Board):
        ray = self

        class Method:
            def __init__(self, name):
                self.name = name

            def remote(self, *args):
                coro = getattr(board, self.name)(*args)
                return asyncio.run_coroutine_threadsafe(coro, ray.loop).result()

        return SimpleNamespace(**{m: Method(m) for m in ("take", "give", "poll", "stop")})

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def sharded_in_process(net, region: Region, config: BabConfig, workers: int, seconds: float,
                       tweak=lambda rank, search: None):  # fmt: skip
    """The coordinator's part (root and shards) and `workers` worker loops in threads, each with
    its own search object (`tweak(rank, search)` may change it); returns per worker its
    `(status, counterexample, unproven, gifts, seconds)` and the board's final state."""
    coordinator, mode = make_search(net, region, config, 0)
    coordinator.deadline = time.monotonic() + seconds
    open_, found = coordinator.begin()
    if found is not None or not len(open_):
        return ["root"], {"found": found, "open": len(open_)}
    ray, board = InProcessRay(), Board()
    handle = ray.handle(board)
    asyncio.run_coroutine_threadsafe(board.reset("t", shards_of(open_, workers)), ray.loop).result()
    context = coordinator.context()
    results: dict[int, tuple] = {}

    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            run_worker(rank)
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    searches = []  # built here: tracing a module (torch.fx) is not thread-safe
    for rank in range(workers):
        searches.append(search_for(mode, net, region, config, rank))
        searches[rank].adopt(context)
        tweak(rank, searches[rank])

    def run_worker(rank: int) -> None:
        search = searches[rank]
        start = time.monotonic()
        loop = WorkLoop(ray, handle, "t", rank, search, start + seconds)
        status, found = loop.run()
        results[rank] = (status, found, search.unproven(), loop.gifts, time.monotonic() - start)

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = asyncio.run_coroutine_threadsafe(board.progress("t"), ray.loop).result()
    ray.close()
    if errors:
        raise errors[0]
    return [results[r] for r in range(workers)], state


def answer_of(results, state) -> str:
    """The coordinator's rule (`shards.Run._outcome`) on in-process results."""
    if results == ["root"]:
        return "sat" if state["found"] is not None else "unsat"
    if any(r[0] == "sat" for r in results):
        return "sat"
    done = all(r[0] == "done" for r in results) and state["finished"]
    return ("unknown" if any(r[2] for r in results) else "unsat") if done else "timeout"


def input_case(seed: int, truth: str) -> tuple[nn.Module, Region]:
    """`c y <= b` on a 3-input net, `b` 5% above (sat) or below (unsat) the exact minimum."""
    gen = np.random.default_rng(100 + seed)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU(),
                        nn.Linear(10, 2)).double().eval()  # fmt: skip
    lower = gen.uniform(-1, 0, 3)
    probe = Region(lower, lower + 1, (Polytope(gen.normal(size=(1, 2)), np.zeros(1)),))
    minimum = milp_minimum(net, probe)
    offset = 0.05 * (1 + abs(minimum)) * (1 if truth == "sat" else -1)
    poly = Polytope(probe.unsafe[0].A, np.array([minimum + offset]))
    return net, Region(probe.lower, probe.upper, (poly,))


@pytest.mark.parametrize("truth", ["sat", "unsat"])
@pytest.mark.parametrize("seed", [0, 3])
def test_input_split_shards_in_threads_give_the_exact_answer(seed, truth):
    net, region = input_case(seed, truth)
    results, state = sharded_in_process(net, region, BabConfig(), 2, 20.0)
    assert answer_of(results, state) == truth, (results, state)


@pytest.mark.parametrize("truth", ["sat", "unsat"])
@pytest.mark.parametrize("seed", [1, 3])
def test_relu_split_shards_in_threads_give_the_exact_answer(seed, truth):
    """The MILP cases of test_relu_bab; the coordinator's root intervals travel to the workers
    with the domains and their warm-start slopes and multipliers."""
    net, prop = milp_property(seed, truth)
    config = BabConfig(splitting="relu")
    results, state = sharded_in_process(net, prop.regions[0], config, 2, 30.0)
    assert answer_of(results, state) == truth, (results, state)


def test_in_threads_a_counterexample_stops_the_other_worker():
    """On a region far from proven (test_bab's hard instance), worker 1 reports a
    counterexample after its first step: worker 0 stops at its next poll, not at its deadline."""
    net, prop = hard_instance()
    x = torch.zeros(1, 12)

    def tweak(rank, search):
        if rank == 1:
            step = search.step
            search.step = lambda open_: (step(open_)[0], (x, x))

    results, state = sharded_in_process(net, prop.regions[0], BabConfig(), 2, 60.0, tweak)
    assert [r[0] for r in results] == ["stopped", "sat"] and state["reason"] == "sat"
    assert results[0][4] < 10, results


def test_a_worker_keeps_its_domains_when_the_board_refuses_them():
    """`give` refused (an old search): nothing is lost, the worker goes on with all it had."""
    net, prop = hard_instance()
    search = search_for("input", net, prop.regions[0], BabConfig(), 0)
    search.deadline = time.monotonic() + 10
    open_, _ = search.begin()
    while len(open_) < 4:
        open_, _ = search.step(open_)
    ray = SimpleNamespace(put=lambda v: v, get=lambda v: v)

    def refuse(*args):
        return False

    def hungry(*args):
        return None, 2

    board = SimpleNamespace(
        give=SimpleNamespace(remote=refuse), poll=SimpleNamespace(remote=hungry)
    )
    loop = WorkLoop(ray, board, "t", 0, search, time.monotonic() + 10)
    status, kept = loop._poll(open_)
    assert status is None and len(kept) == len(open_) and loop.gifts == 0


# ----- the suite's scheduler against a scripted stand-in for Ray -----


class Ref:
    """A task's handle (hashable, as Ray's object references are)."""

    def __init__(self, job, run) -> None:
        self.job, self.run = job, run


class Scripted:
    """A stand-in for Ray's task API: a task runs when the scheduler collects it, unless
    `hangs(job)`; `solve` may raise `exceptions.WorkerCrashedError` to simulate a dead worker."""

    exceptions = SimpleNamespace(  # mirrors ray.exceptions
        **{name: type(name, (Exception,), {"cause": None})
           for name in ("WorkerCrashedError", "RayActorError", "NodeDiedError",
                        "TaskCancelledError", "RayTaskError")}
    )  # fmt: skip

    def __init__(self, hangs=lambda job: False) -> None:
        self.hangs, self.submitted, self.cancelled, self.options = hangs, [], [], {}

    def remote(self, solve):
        ray = self

        class Task:
            def options(self, **options):
                ray.options = options
                return self

            def remote(self, *args):  # (job, settings) for an instance, () to warm up
                job = args[0] if args else None
                if job is not None:
                    ray.submitted.append(job)
                return Ref(job, lambda: solve(*args))

        return Task()

    def wait(self, refs, num_returns, timeout):
        ready = [r for r in refs if r.job is None or not self.hangs(r.job)][:num_returns]
        if not ready:
            time.sleep(timeout)
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        if isinstance(ref, list):  # the warm-up's tasks
            return [r.run() for r in ref]
        return ref.run()

    def cancel(self, ref, force=False):
        self.cancelled.append((ref.job.index, force))


def scheduled(tmp_path, ray, timeouts, workers=2):
    args = SimpleNamespace(
        out=tmp_path / "out.csv", instances=tmp_path / "i.csv", timeout_scale=1.0
    )
    instances = [Instance(f"n{i}.onnx", f"p{i}.vnnlib", t, i + 1) for i, t in enumerate(timeouts)]
    out, errors = io.StringIO(), io.StringIO()
    settings = Settings(None, "auto", 0, "cpu", 1)
    scheduler = Scheduler(ray, args, workers, settings, ray.solve, out, errors)
    rows = scheduler.run(instances, tmp_path)
    return rows, scheduler, out.getvalue(), errors.getvalue()


def test_the_scheduler_runs_longest_first_and_writes_rows_in_order(tmp_path):
    ray = Scripted()
    ray.solve = lambda job, settings: Answer(job.index, "unsat", 10, 1)
    rows, scheduler, out, _ = scheduled(tmp_path, ray, [5, 30, 10, 30])
    assert [j.index for j in ray.submitted] == [1, 3, 2, 0]  # longest first, ties in order
    assert [r["network"] for r in rows] == ["n0.onnx", "n1.onnx", "n2.onnx", "n3.onnx"]
    assert [r["network"] for r in scheduler.arrived] == ["n1.onnx", "n3.onnx", "n2.onnx", "n0.onnx"]
    written = (tmp_path / "out.csv").read_text().splitlines()
    assert written[0] == "network,property,result,seconds" and written[1].startswith("n0.onnx")
    assert out.count("unsat") >= 4 and ray.options["max_retries"] == 0


def test_a_lost_worker_reruns_its_instance_once_with_the_time_left(tmp_path):
    ray = Scripted()

    def solve(job, settings):
        if job.index == 1:
            raise Scripted.exceptions.WorkerCrashedError("killed")
        if job.index == 0 and job.attempt == 0:
            raise Scripted.exceptions.WorkerCrashedError("killed")
        return Answer(job.index, "sat")

    ray.solve = solve
    rows, _, _, errors = scheduled(tmp_path, ray, [20, 20, 20])
    assert [r["result"] for r in rows] == ["sat", "unknown", "sat"]
    attempts = [(j.index, j.attempt) for j in ray.submitted]
    assert sorted(attempts) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    rerun = next(j for j in ray.submitted if j.attempt == 1)
    assert rerun.budget <= 20 and "re-run" in errors and "lost again" in errors


def test_an_instance_past_its_limit_is_cancelled_as_a_timeout(tmp_path):
    ray = Scripted(hangs=lambda job: job.index == 0)
    ray.solve = lambda job, settings: Answer(job.index, "unsat")
    start = time.monotonic()
    rows, _, _, _ = scheduled(tmp_path, ray, [0.2, 5])
    assert [r["result"] for r in rows] == ["timeout", "unsat"]
    assert ray.cancelled == [(0, True)]
    assert rows[0]["seconds"] <= 0.2 + 1.0 and time.monotonic() - start < 3


def test_ctrl_c_keeps_the_finished_rows_and_writes_the_running_ones_as_unknown(tmp_path):
    ray = Scripted()

    def solve(job, settings):
        if job.index == 2:
            raise KeyboardInterrupt  # the Ctrl-C arrives while its answer is read
        return Answer(job.index, "unsat")

    ray.solve = solve
    rows, scheduler, _, errors = scheduled(tmp_path, ray, [30, 20, 10, 5])
    assert scheduler.args.interrupted and "interrupted: the finished rows are kept" in errors
    assert [(r["network"], r["result"]) for r in rows] == [
        ("n0.onnx", "unsat"), ("n1.onnx", "unsat"), ("n2.onnx", "unknown"), ("n3.onnx", "unknown")
    ]  # fmt: skip
    assert sorted(i for i, _ in ray.cancelled) == [2, 3]
    assert len((tmp_path / "out.csv").read_text().splitlines()) == 5


def test_skipped_instances_are_reported_with_their_row(tmp_path):
    ray = Scripted()
    ray.solve = lambda job, settings: Answer(job.index, None, error="p0.vnnlib: bad")
    rows, _, _, errors = scheduled(tmp_path, ray, [5], workers=1)
    assert rows == [] and "i.csv:1: skipped: p0.vnnlib: bad" in errors


# ----- what runs inside a suite's task -----


@pytest.mark.data
def test_a_task_answers_as_the_serial_run_and_caches_by_file(shared_data, tmp_path):
    folder = shared_data / ACAS
    net_gz = folder / "onnx" / "ACASXU_run2a_1_1_batch_2000.onnx.gz"
    copy = tmp_path / "net.onnx.gz"
    shutil.copy(net_gz, copy)
    prop = folder / "vnnlib" / "prop_1.vnnlib.gz"
    settings = Settings(None, "auto", 0, "cpu", 1)
    job = Job(0, 1, str(copy), str(prop), 30.0, time.time())
    answer = solve_job(job, settings)
    assert answer.status == "unsat" and answer.domains > 0
    first = cached_network(str(copy), "cpu")
    assert cached_network(str(copy), "cpu") is first
    shutil.copy(net_gz, copy)  # rewritten: a new modification time, read again
    assert cached_network(str(copy), "cpu") is not first
    missing = solve_job(Job(1, 2, str(tmp_path / "no.onnx"), str(prop), 5.0, time.time()), settings)
    assert missing.status is None and "no.onnx" in missing.error


# ----- the progress bar -----


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_counts_instances_answers_and_domains():
    bar = progress.Progress(2, total=4, stream=io.StringIO())
    bar.answer("unsat", 1000)
    bar.answer("sat", 500)
    bar.searching(2500, 40)
    line = bar.line()
    assert line.startswith("[#####.....] 2/4 | unsat 1 sat 1 | 4.0k domains, ")
    assert "/s, 40 open | 2 workers | " in line
    bar.region_done()
    assert bar.domains() == 4000 and bar.open_domains is None


def test_the_bar_redraws_in_place_on_a_terminal_and_writes_lines_elsewhere():
    tty = Terminal()
    bar = progress.Progress(2, total=2, stream=tty, interval=0.0)
    bar.answer("unsat")
    bar.note("[1/2] a b: unsat 0.10 s", tty)
    bar.close()
    text = tty.getvalue()
    assert text.count("\r") >= 2 and "[1/2] a b: unsat 0.10 s\n" in text and text.endswith("\n")
    log = io.StringIO()
    bar = progress.Progress(2, total=2, stream=log, log_interval=3600)
    bar.answer("unsat")
    bar.answer("sat")  # within the interval: no line
    bar.close()
    assert "\r" not in log.getvalue() and log.getvalue().count("\n") == 2


def test_reporting_makes_a_bar_current_inside_the_block():
    bar = progress.Progress(1)
    assert progress.current() is None
    with progress.reporting(bar):
        assert progress.current() is bar
    assert progress.current() is None
