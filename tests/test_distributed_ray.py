"""Scale-out on a local 2-CPU Ray cluster (marker `ray`, deselected by default; skipped without
Ray): suites and sharded instances give the serial answers on ACAS Xu and tiny nets; a worker
that dies mid-run (a task that exits, `ray.kill` on a shard actor) loses no result and leaves no
process behind; a counterexample from one shard stops the rest; time limits hold within 5% or
1 s; the command line's own clusters leave no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch

import verify
import verify.verifier as verifier
from tests.test_bab import hard_instance, mlp
from tests.test_distributed import input_case
from tests.test_relu_bab import milp_property
from verify.attack import UnsafeSpec, pgd, validate
from verify.cli.main import main
from verify.cli.options import resolve
from verify.cli.suite import run_suite, solve_job
from verify.distributed import cluster, shards
from verify.property import Polytope, Region, VnnlibProperty

ray = pytest.importorskip("ray", reason="Ray is not installed (extra [distributed])")
pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]
ACAS = Path("vnncomp2022") / "acasxu"
# (network, property, answer) solved within a few seconds serially (VNN-COMP 2022 answers).
QUICK = [("1_1", 1, "unsat"), ("2_1", 2, "sat"), ("1_9", 7, "sat"), ("1_2", 3, "unsat"),
         ("1_5", 2, "sat"), ("2_2", 4, "unsat")]  # fmt: skip


def allowed(limit: float) -> float:
    """The issue's tolerance: within 5% or 1 s."""
    return limit + max(0.05 * limit, 1.0)


@pytest.fixture(scope="module")
def local_cluster():
    """A 2-CPU local cluster; this module's functions travel by value (the workers cannot
    import `tests`)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning",
             _system_config=cluster.LOCAL_CONFIG)  # fmt: skip
    yield ray
    cluster.release()
    ray.shutdown()


@pytest.fixture
def warm_pool(local_cluster):
    """The 2-worker shard pool, started (so sharding begins right after the root)."""
    pool = shards.pool_for(ray, 2, torch.get_num_threads(), 0.0)
    deadline = time.monotonic() + 300
    while not pool.ready():
        assert time.monotonic() < deadline, "the shard workers did not start"
        time.sleep(0.05)
    return pool


def gone(pids, within: float = 20.0) -> bool:
    """Whether none of `pids` is a live process (zombies count as gone) within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def marked(marker: str) -> list[int]:
    """Processes (other than this one) whose environment holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def acas_csv(shared: Path, folder: Path, instances, timeout: float) -> Path:
    rows = [f"onnx/ACASXU_run2a_{n}_batch_2000.onnx,vnnlib/prop_{p}.vnnlib,{timeout}"
            for n, p, *_ in instances]  # fmt: skip
    path = folder / "instances.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def suite_args(csv: Path, root: Path, out: Path, workers: int = 2, scale: float = 1.0):
    return Namespace(instances=csv, root=root, out=out, limit=None, timeout_scale=scale,
                     workers=workers, ray=None, method=None, splitting="auto", prox_sweeps=0,
                     threads=1, device="cpu")  # fmt: skip


def results(path: Path) -> list[str]:
    return [line.split(",")[2] for line in path.read_text().splitlines()[1:]]


# ----- suites -----


@pytest.mark.data
def test_a_suite_gives_the_serial_answers(local_cluster, shared_data, tmp_path, capsys):
    folder = shared_data / ACAS
    csv = acas_csv(shared_data, tmp_path, QUICK, 60)
    serial, spread, joined = (tmp_path / f"{n}.csv" for n in ("serial", "spread", "joined"))
    base = ["run-all", str(csv), "--root", str(folder)]
    assert main([*base, "--out", str(serial)]) == 0
    assert main([*base, "--out", str(spread), "--workers", "2"]) == 0
    # --ray alone: this process's cluster (connected already), as many workers as its CPUs
    assert main([*base, "--out", str(joined), "--ray", "auto"]) == 0
    assert results(spread) == results(joined) == results(serial) == [a for *_, a in QUICK]
    out = capsys.readouterr().out
    assert out.count(f"/{len(QUICK)}] ") == 3 * len(QUICK)


def crash_once(job, settings):
    """The first attempt at instance 0 records its pid and kills its own process."""
    if job.index == 0 and job.attempt == 0:
        Path(job.property).with_name("crashed.pid").write_text(str(os.getpid()))
        os._exit(1)
    return solve_job(job, settings)


def linked(shared: Path, folder: Path, names) -> None:
    """`folder` holding links to the shared files `names` (their `.gz`), so that tests write
    only into `folder`."""
    for name in names:
        source = resolve(shared / ACAS, name)
        link = folder / Path(name).parent / source.name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(source)


@pytest.mark.data
def test_an_instance_whose_worker_died_is_rerun(local_cluster, shared_data, tmp_path, capsys):
    folder = tmp_path / "acas"
    csv = acas_csv(shared_data, tmp_path, QUICK[:3], 60)
    names = [n for line in csv.read_text().splitlines() for n in line.split(",")[:2]]
    linked(shared_data, folder, names)
    args = suite_args(csv, folder, tmp_path / "out.csv")
    rows = run_suite(args, solve=crash_once)
    assert [r["result"] for r in rows] == [answer for *_, answer in QUICK[:3]]
    assert "re-run" in capsys.readouterr().err
    pid = int((folder / "vnnlib" / "crashed.pid").read_text())
    assert gone([pid])


def hang(job, settings):
    """Instance 0 never answers; the others are solved."""
    if job.index == 0:
        Path(job.property).with_name("hung.pid").write_text(str(os.getpid()))
        time.sleep(3600)
    return solve_job(job, settings)


@pytest.mark.data
def test_suite_time_limits_hold_and_a_hung_task_is_cancelled(local_cluster, shared_data, tmp_path):
    """Instance 0 hangs (cancelled past its limit, its process killed); instance 1 is a hard
    ACAS Xu instance (1_1 prop 5) that must stop at its 3 s limit."""
    folder = tmp_path / "acas"
    csv = acas_csv(shared_data, tmp_path, [("1_1", 1), ("1_1", 5)], 3)
    linked(shared_data, folder, [n for line in csv.read_text().splitlines()
                                 for n in line.split(",")[:2]])  # fmt: skip
    rows = run_suite(suite_args(csv, folder, tmp_path / "out.csv"), solve=hang)
    assert [r["result"] for r in rows] == ["timeout", "timeout"], rows
    assert all(r["seconds"] <= allowed(3.0) for r in rows), rows
    assert gone([int((folder / "vnnlib" / "hung.pid").read_text())])


# ----- sharded instances -----


@pytest.mark.parametrize("truth", ["sat", "unsat"])
@pytest.mark.parametrize("splitting, seed", [("input", 0), ("input", 3), ("relu", 1), ("relu", 3)])
def test_sharded_answers_are_the_serial_ones_on_tiny_nets(warm_pool, monkeypatch, splitting,
                                                         seed, truth):  # fmt: skip
    """The exact (MILP) cases, the root attack off: branch and bound decides, over 2 workers."""
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)
    if splitting == "input":
        net, region = input_case(seed, truth)
        prop = VnnlibProperty("<milp>", 3, 2, (region,))
    else:
        net, prop = milp_property(seed, truth)
    serial = verify.verify(net, prop, timeout=60, splitting=splitting)
    sharded = verify.verify(net, prop, timeout=60, splitting=splitting, workers=2)
    assert sharded.status == serial.status == truth, sharded.stats
    if truth == "sat":
        x, _ = sharded.counterexample
        assert validate(net, prop.regions[0], x.reshape(1, -1).to(torch.float64)) is not None


@pytest.mark.data
@pytest.mark.parametrize(("net", "prop", "answer"), [("1_1", 1, "unsat"), ("4_7", 1, "unsat"),
                                                     ("1_9", 7, "sat")])  # fmt: skip
def test_sharded_acas_xu_gives_the_serial_answers(warm_pool, shared_data, net, prop, answer):
    folder = shared_data / ACAS
    net_path = resolve(folder, f"onnx/ACASXU_run2a_{net}_batch_2000.onnx")
    spec = verify.load_vnnlib(resolve(folder, f"vnnlib/prop_{prop}.vnnlib"))
    model = verify.load_onnx(net_path)
    serial = verify.verify(model, spec, timeout=100)
    sharded = verify.verify(model, spec, timeout=100, workers=2)
    assert sharded.status == serial.status == answer, sharded.stats


def kill_when_working(pool, rank: int, killed: list) -> None:
    """Kill worker `rank` once the board shows it has bounded domains (within 120 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = ray.get(pool.board.progress.remote(pool.token))
        if pool.token is not None and state["per_rank"].get(rank, {}).get("domains", 0) > 0:
            killed.append(pool.pids.get(rank))
            ray.kill(pool.actors[rank], no_restart=True)
            return
        time.sleep(0.02)


@pytest.mark.data
def test_a_killed_shard_worker_loses_nothing(warm_pool, shared_data):
    """ACAS Xu 3_3 prop 9 (unsat, about 10 s serially): worker 1 is killed mid-run; the region
    is re-run on fresh workers and still proven; the killed process is gone."""
    folder = shared_data / ACAS
    model = verify.load_onnx(resolve(folder, "onnx/ACASXU_run2a_3_3_batch_2000.onnx"))
    spec = verify.load_vnnlib(resolve(folder, "vnnlib/prop_9.vnnlib"))
    killed: list = []
    killer = threading.Thread(target=kill_when_working, args=(warm_pool, 1, killed))
    killer.start()
    result = verify.verify(model, spec, timeout=200, workers=2)
    killer.join()
    stats = result.stats["regions"][0]
    assert killed and result.status == "unsat", stats
    assert stats["restarts"] == 1, stats
    assert gone([p for p in killed if p is not None])


def needle() -> tuple[torch.nn.Module, VnnlibProperty]:
    """test_bab's 12-input net with `y_0 <= b`, `b` 3% above the best value of a long PGD: a
    counterexample exists; far from proven where it is not."""
    net = mlp([12, 64, 64, 64, 2], 7).float()
    lower, upper = -np.ones(12), np.ones(12)
    probe = Region(lower, upper, (Polytope(np.array([[1.0, 0.0]]), np.zeros(1)),))
    box = [torch.tensor(a, dtype=torch.float32)[None] for a in (lower, upper)]
    starts = torch.rand(256, 12, generator=torch.Generator().manual_seed(0)) * 2 - 1
    _, values = pgd(net, *box, UnsafeSpec.of(probe), starts, steps=200)
    best = float(values.min())
    poly = Polytope(probe.unsafe[0].A, np.array([best + 0.03 * (1 + abs(best))]))
    return net, VnnlibProperty("<needle>", 12, 2, (Region(lower, upper, (poly,)),))


def test_a_counterexample_from_one_shard_stops_the_rest(warm_pool, monkeypatch):
    monkeypatch.setattr(verifier, "_attack_all", lambda *args: None)  # the workers must find it
    net, prop = needle()
    start = time.monotonic()
    result = verify.verify(net, prop, timeout=120, workers=2)
    elapsed = time.monotonic() - start
    stats = result.stats["regions"][0]
    assert result.status == "sat" and elapsed < 30, (elapsed, stats)
    assert "sat" in stats["worker_status"], stats
    assert set(stats["worker_status"]) <= {"sat", "stopped", "killed"}, stats
    x, _ = result.counterexample
    assert validate(net, prop.regions[0], x.reshape(1, 12)) is not None


@pytest.mark.parametrize("limit", [3.0, 8.0])
def test_sharded_time_limits_hold(warm_pool, limit):
    net, prop = hard_instance()
    start = time.monotonic()
    result = verify.verify(net, prop, timeout=limit, workers=2)
    elapsed = time.monotonic() - start
    stats = result.stats["regions"][0]
    assert result.status in ("timeout", "unknown") and elapsed <= allowed(limit), (elapsed, stats)
    assert "worker_status" in stats, stats  # the workers searched (the pool was up)


def test_the_limit_holds_while_the_workers_are_still_starting(local_cluster):
    """A fresh pool: the workers take seconds to start; the coordinator searches meanwhile
    and answers at the limit."""
    cluster.release()
    net, prop = hard_instance()
    start = time.monotonic()
    result = verify.verify(net, prop, timeout=2.0, workers=2)
    assert time.monotonic() - start <= allowed(2.0), result.stats


# ----- the command line's own clusters -----


def cli(marker: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, LDVERIFY_TEST_MARK=marker, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "verify", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.data
def test_the_command_lines_clusters_leave_no_process_behind(shared_data, tmp_path):
    folder = shared_data / ACAS
    csv = acas_csv(shared_data, tmp_path, QUICK[:3], 60)
    marker = uuid.uuid4().hex
    done = cli(marker, "run-all", str(csv), "--root", str(folder), "--out",
               str(tmp_path / "out.csv"), "--workers", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert results(tmp_path / "out.csv") == [answer for *_, answer in QUICK[:3]]
    assert not wait_unmarked(marker), "processes of the run-all cluster are left"
    net_path = resolve(folder, "onnx/ACASXU_run2a_4_7_batch_2000.onnx")
    prop_path = resolve(folder, "vnnlib/prop_1.vnnlib")
    done = cli(marker, "run", str(net_path), str(prop_path), "--timeout", "100", "--workers", "2")
    assert done.returncode == 0 and done.stdout == "unsat\n", done.stderr
    assert not wait_unmarked(marker), "processes of the run cluster are left"


def wait_unmarked(marker: str, within: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_bad_file_in_a_task_is_skipped_with_its_row(local_cluster, tmp_path, capsys):
    """The task wrapper in a worker process: an unreadable file is reported by its row."""
    csv = tmp_path / "instances.csv"
    csv.write_text("missing.onnx,missing.vnnlib,5\n")
    rows = run_suite(suite_args(csv, tmp_path, tmp_path / "out.csv"))
    err = capsys.readouterr().err
    assert rows == [] and f"{csv}:1: skipped: " in err and "missing.onnx" in err, err
