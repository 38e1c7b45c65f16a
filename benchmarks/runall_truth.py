"""`verify run-all` on the VNN-COMP 2023 benchmarks at a fraction of their timeouts, graded
against the 2023 winner's answers (`../shared/data/vnncomp2023/truth/NAME.csv`, alpha-beta-CROWN).

Each benchmark's `instances.csv` runs through the command a user types,
`python -m verify run-all INSTANCES --timeout-scale F --out CSV`, one process per benchmark
(1 torch thread). Per benchmark it counts, against the winner's result for the same network
and property:
- correct: we answered sat/unsat and so did the winner, the same way;
- wrong: we answered sat where the winner proved unsat, or unsat where it found sat;
- unanswered: the winner answered, we did not (unknown, timeout, skipped);
- extra: we answered where the winner did not (sat: validated counterexample; unsat: cannot
  be graded here).
Target (issue 12): correct >= half of the instances the winner answered, 0 wrong.

    python -m benchmarks.runall_truth [--scale 0.1] [--only cgan,vit]
Writes benchmarks/results/runall_truth.{json,md} and runall_NAME.csv per benchmark.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import score

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "vnncomp2023"
RESULTS = ROOT / "benchmarks" / "results"
ANSWERS = ("sat", "unsat")


def _key(network: str, prop: str) -> tuple[str, str]:
    """Names compared without folders and compression suffixes."""
    net = Path(network).name.removesuffix(".gz").removesuffix(".onnx")
    return net, Path(prop).name.removesuffix(".gz").removesuffix(".vnnlib")


def truth(name: str) -> dict[tuple[str, str], str]:
    """The winner's result per (network, property) of benchmark `name`."""
    path = DATA / "truth" / f"{name}.csv"
    with open(path, newline="") as f:
        return {_key(row[1], row[2]): row[4].strip() for row in csv.reader(f) if len(row) > 4}


def run_benchmark(name: str, scale: float) -> tuple[Path, float]:
    """Runs `verify run-all` on the benchmark; (its CSV, wall seconds)."""
    out = RESULTS / f"runall_{name}.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "verify", "run-all", str(DATA / name / "instances.csv"),
           "--timeout-scale", str(scale), "--out", str(out)]  # fmt: skip
    start = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    return out, time.monotonic() - start


def grade(name: str, ours_csv: Path) -> dict:
    """Counts of correct, wrong, unanswered and extra answers (see the module docstring), and
    the competition's score of ours and of the winner (`benchmarks.score`)."""
    winner = truth(name)
    with open(DATA / name / "instances.csv", newline="") as f:
        listed = [_key(r[0], r[1]) for r in csv.reader(f) if len(r) >= 3]
    ours: dict[tuple[str, str], str] = {}
    if ours_csv.exists():
        with open(ours_csv, newline="") as f:
            for row in csv.DictReader(f):
                ours[_key(row["network"], row["property"])] = row["result"]
    counts = {"instances": len(listed), "winner_answered": 0, "correct": 0, "wrong": 0,
              "unanswered": 0, "extra": 0, "wrong_cases": []}  # fmt: skip
    for key in listed:
        theirs, mine = winner.get(key, "missing"), ours.get(key, "skipped")
        if theirs in ANSWERS:
            counts["winner_answered"] += 1
            if mine == theirs:
                counts["correct"] += 1
            elif mine in ANSWERS:
                counts["wrong"] += 1
                counts["wrong_cases"].append({"instance": key, "ours": mine, "winner": theirs})
            else:
                counts["unanswered"] += 1
        elif mine in ANSWERS:
            counts["extra"] += 1
    points = score.score(ours, {k: winner.get(k, "missing") for k in listed})
    counts["score"], counts["winner_score"] = points["score"], points["winner_score"]
    return counts


def table(rows: list[dict], scale: float) -> str:
    lines = ["| benchmark | instances | winner answered | correct | wrong | unanswered | extra "
             "| score (winner) | target (>= half) | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        met = "met" if 2 * r["correct"] >= r["winner_answered"] and not r["wrong"] else "not met"
        lines.append(f"| {r['benchmark']} | {r['instances']} | {r['winner_answered']} | "
                     f"{r['correct']} | {r['wrong']} | {r['unanswered']} | {r['extra']} | "
                     f"{r['score']} ({r['winner_score']}) | {met} | {r['seconds']:.0f} |")  # fmt: skip
    total = {k: sum(r[k] for r in rows) for k in ("instances", "winner_answered", "correct",
                                                   "wrong", "unanswered", "extra", "seconds",
                                                   "score", "winner_score")}  # fmt: skip
    lines.append(f"| **all** | {total['instances']} | {total['winner_answered']} | "
                 f"{total['correct']} | {total['wrong']} | {total['unanswered']} | "
                 f"{total['extra']} | {total['score']} ({total['winner_score']}) | | "
                 f"{total['seconds']:.0f} |")  # fmt: skip
    return f"`verify run-all` at {scale:g} of the timeouts against the 2023 winner\n\n" + "\n".join(
        lines
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--only", default=None, help="comma-separated benchmark names, in order")
    args = parser.parse_args()
    names = sorted(p.parent.name for p in DATA.glob("*/instances.csv"))
    if args.only:  # in the order given
        names = [n for n in args.only.split(",") if n in names]
    rows = []
    for name in names:
        out, seconds = run_benchmark(name, args.scale)
        rows.append({"benchmark": name, "seconds": seconds, **grade(name, out)})
        print(rows[-1], flush=True)
        text = table(rows, args.scale)
        stamp = time.strftime("%Y-%m-%d %H:%M")
        cmd = f"python -m benchmarks.runall_truth --scale {args.scale}"
        cmd += f" --only {args.only}" if args.only else ""
        (RESULTS / "runall_truth.md").write_text(f"# {cmd} ({stamp}, 1 thread)\n\n{text}\n")
        (RESULTS / "runall_truth.json").write_text(json.dumps(
            {"meta": {"date": stamp, "command": cmd, "scale": args.scale}, "rows": rows},
            indent=1))  # fmt: skip
    print(table(rows, args.scale))


if __name__ == "__main__":
    main()
