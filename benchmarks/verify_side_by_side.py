"""Branch and bound side by side: `verify.verify` on this tree and on an earlier commit, run
alternately on the same VNN-COMP 2022 instances (each run its own process, 1 thread), to check
that a change keeps the answers and the time to them.

    python benchmarks/verify_side_by_side.py --base REV [--repeats 2] [--scale 0.05]

Instances: every 6th of ACAS Xu (31) and every 15th of mnist_fc (6), at `scale` times their
VNN-COMP timeouts. Per suite: both trees' total seconds (each instance's minimum over the
repeats), the ratio base / current (>= 1: the current tree is faster), and whether every
answer is the same. Writes benchmarks/results/verify_side_by_side.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import DATA, RESULTS, write_json  # noqa: E402
from benchmarks.side_by_side import alternate, base_tree  # noqa: E402

SUITES = {"acasxu": 6, "mnist_fc": 15}  # every k-th instance

# Run inside each tree's process: only the public API (`verify.load_onnx`, `load_vnnlib`,
# `verify`), which both trees have.
RUNNER = """
import csv, json, sys, time, torch
from pathlib import Path
import verify
torch.set_num_threads(1)
data, scale, out = Path(sys.argv[1]), float(sys.argv[2]), {}
for bench, k in json.loads(sys.argv[3]).items():
    rows = list(csv.reader(open(data / bench / "instances.csv")))[::k]
    for onnx, spec, timeout in rows:
        found = lambda p: p if p.exists() else p.with_name(p.name + ".gz")
        net = verify.load_onnx(str(found(data / bench / onnx)))
        prop = verify.load_vnnlib(str(found(data / bench / spec)))
        start = time.perf_counter()
        result = verify.verify(net, prop, timeout=scale * float(timeout))
        out[f"{bench}/{onnx}/{spec}"] = (result.status, time.perf_counter() - start)
print(json.dumps(out))
"""


def run_tree(tree: Path, scale: float) -> dict[str, tuple[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", RUNNER, str(DATA / "vnncomp2022"), str(scale),
           json.dumps(SUITES)]  # fmt: skip
    done = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(base: list[dict], current: list[dict]) -> list[dict]:
    rows = []
    for bench in SUITES:
        keys = [k for k in base[0] if k.startswith(bench + "/")]
        t_base = sum(min(r[k][1] for r in base) for k in keys)
        t_now = sum(min(r[k][1] for r in current) for k in keys)
        same = all(len({r[k][0] for r in base + current}) == 1 for k in keys)
        answers: dict[str, int] = {}
        for k in keys:
            answers[current[0][k][0]] = answers.get(current[0][k][0], 0) + 1
        rows.append({"suite": bench, "n": len(keys), "base_s": t_base, "current_s": t_now,
                     "speed_ratio": t_base / t_now, "answers_identical": same,
                     "answers": answers})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.05)
    args = parser.parse_args()
    base = base_tree(args.base)
    load = os.getloadavg()[0]
    base_runs, current_runs = alternate(base, args.repeats, lambda t: run_tree(t, args.scale))
    rows = compare(base_runs, current_runs)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    cmd = f"python benchmarks/verify_side_by_side.py --base {args.base} --repeats {args.repeats}"
    cmd += f" --scale {args.scale}"
    lines = [f"# verify side by side with {args.base}", "",
             f"`{cmd}` ({stamp}, 1 thread, per-instance min of {args.repeats} alternating runs, "
             f"load average {load:.1f} at start)", "",
             "| suite | n | base s | current s | speed ratio | answers identical | answers |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['suite']} | {r['n']} | {r['base_s']:.2f} | {r['current_s']:.2f} | "
                     f"{r['speed_ratio']:.3f} | {r['answers_identical']} | {r['answers']} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / "verify_side_by_side.md").write_text(text)
    write_json("verify_side_by_side.json", {"meta": {"date": stamp, "base": args.base,
               "command": cmd, "load_average": load}, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
