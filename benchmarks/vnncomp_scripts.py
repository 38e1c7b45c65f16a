"""The VNN-COMP scripts end to end (`vnncomp_scripts/`), as the harness calls them, on the
first N ACAS Xu and mnist_fc instances: per instance the seconds of `prepare_instance.sh` and
of `run_instance.sh` (from its start to the answer in the results file), beside the same
instance solved in this process (`verify.verify` after a warm-up): their difference is the
scripts' overhead (Python's start and imports, reading the cache).

    python -m benchmarks.vnncomp_scripts [--n 10] [--fraction 0.05]
Writes benchmarks/results/vnncomp_scripts.{json,md}."""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import verify

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "vnncomp2022"
SCRIPTS = ROOT / "vnncomp_scripts"
RESULTS = ROOT / "benchmarks" / "results"


def instances(suite: str, n: int) -> list[tuple[Path, Path, float]]:
    """The first `n` rows of the suite's instances.csv: (network, property, timeout)."""
    folder = DATA / suite
    out = []
    with open(folder / "instances.csv", newline="") as f:
        for row in list(csv.reader(f))[:n]:
            paths = [folder / row[0], folder / row[1]]
            paths = [p if p.exists() else p.with_name(p.name + ".gz") for p in paths]
            out.append((paths[0], paths[1], float(row[2])))
    return out


def scripted(net: Path, prop: Path, timeout: float, work: Path) -> dict:
    """`prepare_instance.sh` then `run_instance.sh`, timed; the answer in the results file."""
    env = {**os.environ, "LDVERIFY_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    results = work / "results.txt"
    start = time.perf_counter()
    subprocess.run(["bash", str(SCRIPTS / "prepare_instance.sh"), "v1", "bench", str(net),
                    str(prop)], env=env, capture_output=True, check=False)  # fmt: skip
    prepare = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run(["bash", str(SCRIPTS / "run_instance.sh"), "v1", "bench", str(net), str(prop),
                    str(results), str(timeout)], env=env, capture_output=True, check=False)  # fmt: skip
    run = time.perf_counter() - start
    return {"prepare_s": prepare, "run_s": run, "answer": results.read_text().split("\n")[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the scripts' runs (OMP_NUM_THREADS=1, the CLI's --threads 1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        first = instances("acasxu", 1)[0]
        verify.verify(str(first[0]), str(first[1]), timeout=5)  # warm-up, untimed
        for suite in ("acasxu", "mnist_fc"):
            for net, prop, timeout in instances(suite, args.n):
                t = timeout * args.fraction
                start = time.perf_counter()
                inside = verify.verify(str(net), str(prop), timeout=t)
                solve = time.perf_counter() - start
                row = {"suite": suite, "network": net.name, "property": prop.name, "timeout": t,
                       "in_process": inside.status, "solve_s": solve, **scripted(net, prop, t, work)}  # fmt: skip
                row["overhead_s"] = row["run_s"] - solve
                rows.append(row)
                print(row, flush=True)
    lines = ["| suite | network | property | answer (script / in process) | prepare s | run s "
             "| solve s (in process) | overhead s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['suite']} | {r['network']} | {r['property']} | {r['answer']} / "
                     f"{r['in_process']} | {r['prepare_s']:.2f} | {r['run_s']:.2f} | "
                     f"{r['solve_s']:.2f} | {r['overhead_s']:.2f} |")  # fmt: skip
    root = [r["overhead_s"] for r in rows if r["solve_s"] < 1.0]
    cmd = f"python -m benchmarks.vnncomp_scripts --n {args.n} --fraction {args.fraction}"
    summary = (
        f"Overhead on the {len(root)} instances decided within 1 s in process: mean "
        f"{sum(root) / max(len(root), 1):.2f} s, max {max(root, default=0):.2f} s."
    )
    text = (
        f"# {cmd} ({time.strftime('%Y-%m-%d %H:%M')})\n\n" + "\n".join(lines) + f"\n\n{summary}\n"
    )
    (RESULTS / "vnncomp_scripts.md").write_text(text)
    (RESULTS / "vnncomp_scripts.json").write_text(
        json.dumps({"command": cmd, "rows": rows}, indent=1)
    )
    print(text)


if __name__ == "__main__":
    main()
