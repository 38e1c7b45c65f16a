"""What the float64 recheck of closing bounds costs: `verify` with `BabConfig(float64_recheck=
True)` and `False` side by side (interleaved per instance, one process) on a fixed sample:
every 9th ACAS Xu instance (20) and the first 10 of `benchmarks/instances/mnist_fc_sample15.csv`,
at `--scale` of the VNN-COMP timeouts.

Run: python benchmarks/recheck_cost.py [--scale 0.05]   (needs ../shared/data; 1 thread; writes
benchmarks/results/recheck_cost.{txt,json})
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DATA, RESULTS, ROOT
from verify.bab import BabConfig
from verify.cli.options import resolve
from verify.io.onnx_loader import load_onnx
from verify.verifier import verify


def sample() -> list[tuple[str, str, str, float]]:
    """(benchmark, network, property, timeout) rows."""
    with open(DATA / "vnncomp2022" / "acasxu" / "instances.csv", newline="") as f:
        acas = [r for r in csv.reader(f) if r][::9][:20]
    with open(ROOT / "benchmarks" / "instances" / "mnist_fc_sample15.csv", newline="") as f:
        mnist = [r for r in csv.reader(f) if r][:10]
    rows = [("acasxu", *r[:2], float(r[2])) for r in acas]
    return rows + [("mnist_fc", *r[:2], float(r[2])) for r in mnist]


def run_one(net, prop: Path, timeout: float, recheck: bool) -> dict:
    start = time.monotonic()
    result = verify(net, prop, timeout=timeout, config=BabConfig(float64_recheck=recheck))
    regions = result.stats.get("regions", [])
    return {
        "status": result.status,
        "seconds": time.monotonic() - start,
        "rechecked": sum(r.get("rechecked", 0) for r in regions),
        "failed": sum(r.get("recheck_failed", 0) for r in regions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.05, help="share of the timeouts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for bench, net_name, prop_name, timeout in sample():
        root = DATA / "vnncomp2022" / bench
        net = load_onnx(resolve(root, net_name)).eval()
        prop = resolve(root, prop_name)
        row = {"bench": bench, "network": net_name, "property": prop_name}
        for mode in ("on", "off"):
            row[mode] = run_one(net, prop, timeout * args.scale, mode == "on")
        rows.append(row)
        print(f"{bench} {net_name} {prop_name}: on {row['on']['status']} "
              f"{row['on']['seconds']:.2f} s, off {row['off']['status']} "
              f"{row['off']['seconds']:.2f} s", flush=True)  # fmt: skip
    lines = [f"{'benchmark':<10} {'mode':<4} {'solved':>6} {'same':>5} {'s (solved by both)':>19} "
             f"{'rechecks':>9} {'failed':>7}"]  # fmt: skip
    for bench in ("acasxu", "mnist_fc"):
        part = [r for r in rows if r["bench"] == bench]
        both = [r for r in part if {r["on"]["status"], r["off"]["status"]} <= {"sat", "unsat"}]
        same = sum(r["on"]["status"] == r["off"]["status"] for r in part)
        for mode in ("on", "off"):
            solved = sum(r[mode]["status"] in ("sat", "unsat") for r in part)
            seconds = sum(r[mode]["seconds"] for r in both)
            rechecks = sum(r[mode]["rechecked"] for r in part)
            failed = sum(r[mode]["failed"] for r in part)
            lines.append(f"{bench:<10} {mode:<4} {solved:>3}/{len(part):<2} {same:>5} "
                         f"{seconds:>19.2f} {rechecks:>9} {failed:>7}")  # fmt: skip
    text = f"python benchmarks/recheck_cost.py --scale {args.scale}\n" + "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "recheck_cost.txt").write_text(text + "\n")
    (RESULTS / "recheck_cost.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
