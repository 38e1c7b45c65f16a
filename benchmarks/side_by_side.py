"""Side by side: `benchmarks/bounds_table.py` on this tree and on an earlier commit, run
alternately on the same inputs (each in its own process, 1 thread), to check that a change
keeps ReLU nets exactly as tight and no slower.

Per suite and method it reports both trees' seconds per instance (each instance's minimum
over the repeats, its least disturbed run, averaged over the instances), the speed ratio `base / current` (>= 1: the current tree
is faster), and whether every instance's margin is identical.

Usage: python benchmarks/side_by_side.py [--base REV] [--repeats 3] [-- bounds_table args]
Python's cyclic garbage collector is off in both runs: with ~300k objects (the loaded nets) a
generation-2 collection takes about 0.5 s here and lands in whichever tree's timed region its
allocation count dictates (measured: a 0.6 s "slow instance" that was a collection).
(default base: ea162e9, the last commit before the general-networks issue; default table
args: --quick --methods crown,alpha-crown). The base tree is a `git worktree` under /tmp.
Writes benchmarks/results/side_by_side.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, write_json  # noqa: E402

DEFAULT_BASE = "ea162e9"
DEFAULT_ARGS = ["--quick", "--methods", "crown,alpha-crown"]


def base_tree(rev: str) -> Path:
    """A worktree of `rev` (created once; `../shared` linked beside it for the data)."""
    full = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    parent = Path("/tmp") / f"ldverify_base_{full[:12]}"
    tree = parent / "main"
    if not tree.exists():
        parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), full], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
    shared = parent / "shared"
    if not shared.exists():
        shared.symlink_to(ROOT.parent / "shared")
    return tree


def run_table(tree: Path, args: list[str]) -> dict:
    """One run of the tree's own bounds_table.py; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    runner = ("import gc, runpy, sys; gc.disable(); sys.argv = sys.argv[1:]; "
              "runpy.run_path('benchmarks/bounds_table.py', run_name='__main__')")  # fmt: skip
    cmd = [sys.executable, "-c", runner, "benchmarks/bounds_table.py", *args]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((tree / "benchmarks/results/bounds_table.json").read_text())


def alternate(base: Path, repeats: int, run: Callable[[Path], Any]) -> tuple[list, list]:
    """`(base runs, current runs)`: `run(tree)` on the base tree and this one, `repeats` times,
    in alternating order (so a disturbance hits both)."""
    base_runs: list = []
    current_runs: list = []
    for k in range(repeats):
        order = [(base, base_runs), (ROOT, current_runs)]
        for tree, runs in order if k % 2 == 0 else order[::-1]:
            runs.append(run(tree))
            print(f"repeat {k + 1}: {'base' if tree == base else 'current'} done", flush=True)
    return base_runs, current_runs


def _seconds(runs: list[dict], i: int) -> float:
    """Mean over the instances of row `i` of each instance's least disturbed time."""
    per_run = [[inst["seconds"] for inst in r["rows"][i]["per_instance"]] for r in runs]
    best = [min(times) for times in zip(*per_run)]
    return sum(best) / len(best)


def compare(base_runs: list[dict], current_runs: list[dict]) -> list[dict]:
    rows = []
    for i, row in enumerate(current_runs[0]["rows"]):
        base_row = base_runs[0]["rows"][i]
        assert (base_row["suite"], base_row["method"]) == (row["suite"], row["method"])
        t_base, t_now = _seconds(base_runs, i), _seconds(current_runs, i)
        same = all(
            a["margin"] == b["margin"]
            for a, b in zip(base_row["per_instance"], row["per_instance"])
        )
        worst = max(
            abs(a["margin"] - b["margin"])
            for a, b in zip(base_row["per_instance"], row["per_instance"])
        )
        rows.append({
            "suite": row["suite"], "method": row["method"], "n": row["n"],
            "base_s": t_base, "current_s": t_now, "speed_ratio": t_base / t_now,
            "margins_identical": same, "max_margin_difference": worst,
            "base_proven": base_row["proven"], "current_proven": row["proven"],
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=DEFAULT_BASE)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("table_args", nargs="*", default=DEFAULT_ARGS)
    args = parser.parse_args()
    base = base_tree(args.base)
    load = os.getloadavg()[0]
    base_runs, current_runs = alternate(base, args.repeats, lambda t: run_table(t, args.table_args))
    rows = compare(base_runs, current_runs)
    head = ("| suite | method | n | base s/inst | current s/inst | speed ratio | "
            "margins identical | max diff | proven base/current |")  # fmt: skip
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['suite']} | {r['method']} | {r['n']} | {r['base_s']:.4f} | "
            f"{r['current_s']:.4f} | {r['speed_ratio']:.3f} | {r['margins_identical']} | "
            f"{r['max_margin_difference']:.2e} | {r['base_proven']}/{r['current_proven']} |"
        )
    stamp = time.strftime("%Y-%m-%d %H:%M")
    cmd = f"python benchmarks/side_by_side.py --base {args.base} --repeats {args.repeats}"
    cmd += " -- " + " ".join(args.table_args)
    text = "\n".join([f"# Side by side with {args.base}", "", f"`{cmd}` ({stamp}, 1 thread, "
                      f"per-instance min of {args.repeats} alternating runs, load average {load:.1f} at "
                      "start)", "", *lines, ""])  # fmt: skip
    print(text)
    (RESULTS / "side_by_side.md").write_text(text)
    write_json("side_by_side.json", {"meta": {"date": stamp, "base": args.base,
               "command": cmd, "load_average": load}, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
