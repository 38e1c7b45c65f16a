"""Scale-out on Ray, measured side by side in one run (issue 16):

1. suite: the ACAS Xu suite (186 instances) at `--scale` of the VNN-COMP timeouts, `run-all`
   with 1 worker (this process, no Ray) and with `--workers` workers (Ray tasks), interleaved,
   `--repeats` times: wall time, instances per hour, the answers (identical or not, and any
   contradiction). The Ray cluster is started once; its start and the workers' first imports
   are reported apart ("startup").
2. hard: hard ACAS Xu instances (`--hard`, default 1_1 prop 6 and 3_3 prop 9, tens of seconds
   serially) by `verify.verify(..., workers=1)` and `workers=N` (sharded, warm workers),
   interleaved, `--repeats` times: time to answer, domains, donations.
3. overhead: Ray's per-task round trip and throughput, one actor call (a board poll), shipping
   batches of input-split and ReLU-split domains between processes; the per-domain costs of
   input splitting (the hard runs) and of ReLU splitting (an mnist_fc instance, serial).
Then a model from these numbers predicts the speedups at 8, 64 and 512 workers (`plan`).

Run: python benchmarks/scaleout.py [--scale 0.05] [--workers 2] [--repeats 3] [--parts suite,hard,overhead]
(needs ../shared/data and Ray; 1 torch thread per worker; writes benchmarks/results/scaleout.{json,txt}).
The machine may be shared: the load average is recorded before and after each part.
"""

from __future__ import annotations

import argparse
import heapq
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DATA, RESULTS
from verify.bab import BabConfig
from verify.cli import main as cli
from verify.cli.suite import Scheduler, settings_of, solve_job
from verify.distributed import cluster, shards
from verify.distributed.searches import make_search, portable, shards_of
from verify.io.onnx_loader import load_onnx
from verify.io.vnnlib_load import load_vnnlib
from verify.verifier import verify

ACAS = DATA / "vnncomp2022" / "acasxu"
MNIST = DATA / "vnncomp2022" / "mnist_fc"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def suite_args(out: Path, scale: float, workers: int, limit: int | None = None) -> Namespace:
    return Namespace(instances=ACAS / "instances.csv", root=None, out=out, limit=limit,
                     timeout_scale=scale, workers=workers, ray=None, method=None,
                     splitting="auto", prox_sweeps=0, threads=1, device="cpu")  # fmt: skip


def one_suite(ray, workers: int, scale: float, out: Path, limit: int | None) -> dict:
    args = suite_args(out, scale, workers, limit)
    sink = io.StringIO()
    before = load()
    start, cpu = time.monotonic(), time.process_time()
    if workers == 1:
        rows = cli.run_all(args, out=sink, errors=sink)
        cpu = time.process_time() - cpu
    else:
        cluster.release()
        scheduler = Scheduler(ray, args, workers, settings_of(args), solve_job, sink, sink)
        rows = scheduler.run(cli.read_instances(args.instances, limit, sink), ACAS)
        cpu = scheduler.cpu_seconds  # the tasks' (the driver mostly waits)
    wall = time.monotonic() - start
    return {"workers": workers, "wall": round(wall, 2), "per_hour": round(len(rows) * 3600 / wall),
            "cpu_seconds": round(cpu, 1), "results": [r["result"] for r in rows],
            "load": [before, load()]}  # fmt: skip


def suite_part(ray, args, tmp: Path, started: float) -> dict:
    """Serial and Ray runs interleaved (serial first on even repeats); `started`: the seconds
    the cluster took to start."""
    tick = time.monotonic()
    options = suite_args(tmp / "w.csv", args.scale, args.workers)
    scheduler = Scheduler(ray, options, args.workers, settings_of(options), solve_job, None, None)
    scheduler.warm_up()
    warmed = time.monotonic() - tick
    runs = []
    for r in range(args.repeats):
        order = (1, args.workers) if r % 2 == 0 else (args.workers, 1)
        for workers in order:
            out = tmp / f"suite_{workers}_{r}.csv"
            runs.append(one_suite(ray, workers, args.scale, out, args.limit))
            print(f"suite repeat {r} workers {workers}: {runs[-1]['wall']} s "
                  f"load {runs[-1]['load']}", flush=True)  # fmt: skip
    serial = [x for x in runs if x["workers"] == 1]
    spread = [x for x in runs if x["workers"] != 1]
    ratios = [s["wall"] / d["wall"] for s, d in zip(serial, spread)]
    diffs = [
        sum(a != b for a, b in zip(s["results"], d["results"])) for s, d in zip(serial, spread)
    ]
    contradictions = sum(
        {a, b} == {"sat", "unsat"} for s in serial for d in spread for a, b in
        zip(s["results"], d["results"])
    )  # fmt: skip
    first = min(x["wall"] for x in spread)
    return {"startup": {"ray_init": round(started, 2), "warm_up": round(warmed, 2)},
            "runs": runs, "ratio_median": round(statistics.median(ratios), 3),
            "ratio_of_minima": round(min(x["wall"] for x in serial) / first, 3),
            "ratio_with_startup": round(min(x["wall"] for x in serial) /
                                        (first + started + warmed), 3),
            "differing_answers": diffs, "contradictions": contradictions,
            "serial_seconds": serial_seconds(tmp / "suite_1_0.csv")}  # fmt: skip


def serial_seconds(path: Path) -> list[float]:
    """Per-instance seconds of a serial results file (for the scheduling model)."""
    lines = path.read_text().splitlines()[1:]
    return [float(line.rsplit(",", 1)[1]) for line in lines]


def acas_instance(name: str):
    net, prop = name.split(":")
    net_path = cli.resolve(ACAS, f"onnx/ACASXU_run2a_{net}_batch_2000.onnx")
    return load_onnx(net_path).eval(), load_vnnlib(cli.resolve(ACAS, f"vnnlib/prop_{prop}.vnnlib"))


def summary_of(result, seconds: float) -> dict:
    regions = result.stats.get("regions", [])
    return {"status": result.status, "seconds": round(seconds, 2),
            "domains": sum(r.get("domains", 0) for r in regions),
            "coordinator_domains": sum(r.get("coordinator_domains", 0) for r in regions),
            "gifts": sum(r.get("gifts", 0) for r in regions),
            "max_open": max((r.get("max_open", 0) for r in regions), default=0),
            "worker_status": [r.get("worker_status") for r in regions],
            "worker_domains": [r.get("worker_domains") for r in regions],
            "worker_cpu": [r.get("worker_cpu_seconds") for r in regions],
            "max_depth": [r.get("max_depth") for r in regions]}  # fmt: skip


def hard_part(ray, args) -> dict:
    cluster.release()  # the suite's CPUs back
    tick = time.monotonic()
    pool = shards.pool_for(ray, args.workers, 1, 0.0)
    while not pool.ready():
        time.sleep(0.05)
    boot = time.monotonic() - tick
    out = {"pool_start": round(boot, 2), "instances": {}}
    for name in args.hard:
        net, prop = acas_instance(name)
        runs = []
        for r in range(args.repeats):
            order = (1, args.workers) if r % 2 == 0 else (args.workers, 1)
            for workers in order:
                before, tick, cpu = load(), time.monotonic(), time.process_time()
                result = verify(net, prop, timeout=args.hard_timeout, workers=workers)
                cpu = time.process_time() - cpu
                runs.append({"workers": workers, **summary_of(result, time.monotonic() - tick),
                             "driver_cpu": round(cpu, 2), "load": [before, load()]})  # fmt: skip
                print(f"hard {name} repeat {r} workers {workers}: {runs[-1]['status']} "
                      f"{runs[-1]['seconds']} s", flush=True)  # fmt: skip
        serial = [x["seconds"] for x in runs if x["workers"] == 1]
        spread = [x["seconds"] for x in runs if x["workers"] != 1]
        out["instances"][name] = {"runs": runs, "serial_median": statistics.median(serial),
                                  "sharded_median": statistics.median(spread),
                                  "speedup_median": round(statistics.median(serial) /
                                                          statistics.median(spread), 3)}  # fmt: skip
    return out


def timed_median(fn, n: int) -> float:
    times = []
    for _ in range(n):
        tick = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tick)
    return statistics.median(times)


def overhead_part(ray, args) -> dict:
    cluster.release()

    @ray.remote(num_cpus=1)
    def nothing():
        return 0

    @ray.remote(num_cpus=1)
    def fetch(batch):
        return len(batch)

    ray.get([nothing.remote() for _ in range(args.workers)])
    latency = timed_median(lambda: ray.get(nothing.remote()), 200)
    tick = time.perf_counter()
    ray.get([nothing.remote() for _ in range(1000)])
    throughput = 1000 / (time.perf_counter() - tick)
    pool = shards.pool_for(ray, args.workers, 1, 0.0)
    while not pool.ready():
        time.sleep(0.05)
    poll = timed_median(lambda: ray.get(pool.board.poll.remote(None, 0, {})), 200)
    cluster.release()
    shipped = {}
    for mode, (net, region) in {"input": acas_region("3_3:9"), "relu": mnist_region()}.items():
        domains = frontier(net, region, mode, 256)
        batch = portable(shards_of(domains, 1)[0])
        nbytes = sum(t.numel() * t.element_size() for t in batch._fields())
        ref = ray.put(batch)
        seconds = timed_median(lambda ref=ref: ray.get(fetch.remote(ref)), 20) - latency
        shipped[mode] = {"domains": len(batch), "bytes_per_domain": round(nbytes / len(batch)),
                         "put_get_seconds": round(max(seconds, 0.0), 6)}  # fmt: skip
    relu_cost = relu_per_domain(args)
    return {"task_latency": round(latency, 6), "tasks_per_second": round(throughput),
            "board_poll": round(poll, 6), "shipped": shipped, "relu": relu_cost,
            "input_step": step_costs(*acas_region("3_3:9"))}  # fmt: skip


def step_costs(net, region) -> dict:
    """Seconds of one input-splitting step on 8 and on 200 parents (the batch size pinned at
    2048): `fixed + per_parent * n` fitted through the two (medians of 5)."""
    domains = frontier(net, region, "input", 256)
    search, _ = make_search(net, region, BabConfig(), 0)
    search.deadline = time.monotonic() + 600
    times = {}
    for n in (8, 200):
        part = domains.take(torch.arange(min(n, len(domains))))

        def one(part=part):
            search.sizer.size = search.sizer.high = 2048
            search.step(part)

        times[n] = timed_median(one, 5)
    per_parent = (times[200] - times[8]) / (200 - 8)
    return {"seconds": {str(k): round(v, 4) for k, v in times.items()},
            "fixed": round(max(times[8] - 8 * per_parent, 0.0), 4),
            "per_parent": round(per_parent, 6)}  # fmt: skip


def acas_region(name: str):
    net, prop = acas_instance(name)
    return net, prop.regions[0]


def mnist_region():
    net = load_onnx(cli.resolve(MNIST, "onnx/mnist-net_256x4.onnx")).eval()
    prop = load_vnnlib(cli.resolve(MNIST, "vnnlib/prop_0_0.05.vnnlib"))
    return net, prop.regions[0]


def frontier(net, region, mode: str, size: int):
    """Open domains of a serial search of `mode`, stepped until at least `size` are open."""
    config = BabConfig(splitting=mode)
    search, _ = make_search(net, region, config, 0)
    search.deadline = time.monotonic() + 120
    open_, _ = search.begin()
    while 0 < len(open_) < size and time.monotonic() < search.deadline:
        open_, _ = search.step(open_)
    return open_


def relu_per_domain(args) -> dict:
    """A serial ReLU-splitting run on mnist_fc 256x4 prop 0 (0.05) for `relu_seconds`."""
    net = mnist_region()[0]
    prop = load_vnnlib(cli.resolve(MNIST, "vnnlib/prop_0_0.05.vnnlib"))
    tick = time.monotonic()
    result = verify(net, prop, timeout=args.relu_seconds)
    seconds = time.monotonic() - tick
    stats = result.stats["regions"][0] if result.stats["regions"] else {}
    return {"status": result.status, "seconds": round(seconds, 2),
            "root_seconds": stats.get("root_seconds"), "domains": stats.get("domains", 0),
            "per_domain": round((seconds - (stats.get("root_seconds") or 0)) /
                                max(1, stats.get("domains", 1)), 6)}  # fmt: skip


def lpt_makespan(times: list[float], workers: int, per_task: float) -> float:
    """The finishing time of `times` dealt in the given order to the first free of `workers`."""
    free = [0.0] * workers
    for t in times:
        heapq.heapreplace(free, free[0] + t + per_task)
    return max(free)


POLL_SECONDS = 0.05  # workers.POLL_SECONDS
CHILDREN_PER_PARENT = 10  # input splitting: 2 children for each of 5 trial dimensions
EFFICIENT_CHILDREN = 64  # bounds per box flat from about 64 boxes a call (measured)


def plan(results: dict) -> dict:
    """Predicted speedups at 8, 64 and 512 workers from the measured costs (see
    scaleout_plan.md for the model and its assumptions)."""
    out: dict = {}
    over = results.get("overhead", {})
    per_task = over.get("task_latency", 0.002)
    poll = over.get("board_poll", 0.001)
    board_workers = POLL_SECONDS / (poll / 2)  # polls the one board actor can serve
    widths = (2, 8, 64, 512)
    suite = results.get("suite")
    if suite:
        times = suite["serial_seconds"]
        total = sum(times)
        out["suite"] = {w: {"file_order": round(total / lpt_makespan(times, w, per_task), 1),
                            "true_longest_first": round(
                                total / lpt_makespan(sorted(times, reverse=True), w, per_task), 1)}
                        for w in widths}  # fmt: skip
    hard, step = results.get("hard"), over.get("input_step")
    if hard and step:
        out["input_splitting"] = {}
        for name, data in hard["instances"].items():
            serial = [r for r in data["runs"] if r["workers"] == 1 and r["status"] == "unsat"]
            if not serial:
                continue
            run = min(serial, key=lambda r: r["seconds"])
            depth = sum(d for d in run["max_depth"] if d is not None)  # regions in turn
            frontier = run["max_open"] * CHILDREN_PER_PARENT / EFFICIENT_CHILDREN
            work, critical = run["seconds"], depth * step["seconds"]["8"]
            out["input_splitting"][name] = {
                w: round(work / max(work / min(w, frontier, board_workers)
                                    * (1 + poll / POLL_SECONDS), critical), 1)
                for w in widths
            } | {"work_seconds": work, "critical_path_seconds": round(critical, 2),
                 "efficient_workers": round(frontier)}  # fmt: skip
    relu = over.get("relu")
    if relu and relu.get("domains"):
        work, root = 100.0, relu["root_seconds"] or 0.0  # a 100 s serial search
        out["relu_splitting_100s"] = {
            w: round(work / (root + (work - root) / min(w, board_workers)
                             * (1 + poll / POLL_SECONDS)), 1)
            for w in widths
        }  # fmt: skip
    out["board_workers"] = round(board_workers)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.05, help="share of the timeouts")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="suite,hard,overhead")
    parser.add_argument("--hard", default="1_1:6,3_3:9", help="NET:PROP,... ACAS Xu instances")
    parser.add_argument("--hard-timeout", type=float, default=116.0)
    parser.add_argument("--relu-seconds", type=float, default=20.0)
    parser.add_argument("--tag", default="", help="suffix of the results files")
    parser.add_argument("--limit", type=int, help="only the first N suite instances (smoke runs)")
    parser.add_argument("--replan", type=Path, help="recompute the plan of this results JSON")
    args = parser.parse_args()
    if args.replan is not None:
        results = json.loads(args.replan.read_text())
        results["plan"] = plan(results)
        args.replan.write_text(json.dumps(results, indent=1) + "\n")
        args.replan.with_suffix(".txt").write_text(table(results))
        print(table(results))
        return
    args.hard = args.hard.split(",")
    torch.set_num_threads(1)
    ray = cluster.require_ray("benchmarks/scaleout.py")
    tmp = Path(tempfile.mkdtemp(prefix="scaleout-"))  # the runs' results files
    parts = args.parts.split(",")
    results: dict = {"cpus": os.cpu_count(), "workers": args.workers, "scale": args.scale,
                     "repeats": args.repeats, "load_start": load(),
                     "uptime_start": os.popen("uptime").read().strip()}  # fmt: skip
    tick = time.monotonic()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             logging_level="warning", _system_config=cluster.LOCAL_CONFIG)  # fmt: skip
    started = time.monotonic() - tick
    if "suite" in parts:
        results["suite"] = suite_part(ray, args, tmp, started)
    if "hard" in parts:
        results["hard"] = hard_part(ray, args)
    if "overhead" in parts:
        results["overhead"] = overhead_part(ray, args)
    results["plan"] = plan(results)
    results["load_end"], results["uptime_end"] = load(), os.popen("uptime").read().strip()
    cluster.release()
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    name = f"scaleout{args.tag}"
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / f"{name}.txt").write_text(table(results))
    print(table(results))


def table(results: dict) -> str:
    lines = [f"scale-out on {results['cpus']} CPUs, {results['workers']} workers "
             f"(load {results['load_start']} -> {results['load_end']})"]  # fmt: skip
    suite = results.get("suite")
    if suite:
        lines.append(f"suite ACAS Xu x{results['scale']}: startup {suite['startup']}")
        for run in suite["runs"]:
            lines.append(f"  workers {run['workers']}: {run['wall']:7.1f} s  "
                         f"{run['per_hour']:6d} instances/h  cpu {run['cpu_seconds']} s  "
                         f"load {run['load']}")  # fmt: skip
        lines.append(f"  ratio (median of pairs) {suite['ratio_median']}, of minima "
                     f"{suite['ratio_of_minima']}, with startup {suite['ratio_with_startup']}; "
                     f"differing answers {suite['differing_answers']}, contradictions "
                     f"{suite['contradictions']}")  # fmt: skip
    hard = results.get("hard")
    if hard:
        lines.append(f"hard instances (pool start {hard['pool_start']} s)")
        for name, data in hard["instances"].items():
            for run in data["runs"]:
                lines.append(f"  {name} workers {run['workers']}: {run['status']:8s} "
                             f"{run['seconds']:7.1f} s  {run['domains']} domains  "
                             f"depth {run['max_depth']}  gifts {run['gifts']}  driver cpu "
                             f"{run['driver_cpu']}  workers cpu {run['worker_cpu']}  "
                             f"load {run['load']}")  # fmt: skip
            lines.append(f"  {name}: speedup (medians) {data['speedup_median']}")
    over = results.get("overhead")
    if over:
        lines.append(f"overhead: {over}")
    lines.append(f"plan: {results.get('plan')}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
