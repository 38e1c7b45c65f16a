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
Beside them (issue 28):
- over limit: instances whose wall time exceeds their limit (timeout x scale) by more than 5%
  and 1 s (target: none);
- peer: alpha-beta-CROWN's answers on this CPU (`../shared/data/vnncomp2023/peer_abcrown_cpu/`,
  a subset of the rows at min(10% of the timeout, 30 s)) graded the same way, and ours on the
  same rows ("ours / peer on the peer's rows").

    python -m benchmarks.runall_truth [--scale 0.1] [--only cgan,vit] [--grade-only]
        [--splitting input|relu]
Writes benchmarks/results/runall_truth.{json,md} and runall_NAME.csv per benchmark;
`--grade-only` grades the CSVs already there (wall seconds from the last runall_truth.json).
`--splitting MODE` runs `run-all --splitting MODE` instead of the default (auto) and writes
runall_truth_MODE.{json,md} and runall_NAME_MODE.csv; then, for the benchmarks whose three
CSVs (auto, input, relu) are all there, runall_modes.md sets their correct counts and scores
side by side (issue 28: auto against both fixed modes).
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
PEER = DATA / "peer_abcrown_cpu"
RESULTS = ROOT / "benchmarks" / "results"
ANSWERS = ("sat", "unsat")


MODES = ("auto", "input", "relu")


def suffix(mode: str) -> str:
    """The file-name suffix of a splitting mode's results ("" for the default, auto)."""
    return "" if mode == "auto" else f"_{mode}"


def run_benchmark(name: str, scale: float, mode: str = "auto") -> tuple[Path, float]:
    """Runs `verify run-all` on the benchmark; (its CSV, wall seconds)."""
    out = RESULTS / f"runall_{name}{suffix(mode)}.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "verify", "run-all", str(DATA / name / "instances.csv"),
           "--timeout-scale", str(scale), "--out", str(out), "--splitting", mode]  # fmt: skip
    start = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    return out, time.monotonic() - start


def _answers(path: Path) -> dict[tuple[str, str], tuple[str, float]]:
    """`(result, seconds)` per instance of a results CSV (ours: network, property, result,
    seconds; the peer's: onnx, vnnlib, result, seconds)."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {score.key(r.get("network") or r["onnx"], r.get("property") or r["vnnlib"]):
            (r["result"], float(r["seconds"] or 0)) for r in rows}  # fmt: skip


def grade(name: str, ours_csv: Path, scale: float) -> dict:
    """Counts of correct, wrong, unanswered and extra answers (see the module docstring), the
    competition's score of ours and of the winner (`benchmarks.score`), the instances over
    their limit, and the peer's count beside ours on its rows."""
    winner = score.read_truth(name)
    with open(DATA / name / "instances.csv", newline="") as f:
        listed = {score.key(r[0], r[1]): float(r[2]) for r in csv.reader(f) if len(r) >= 3}
    answers = _answers(ours_csv)
    ours = {k: result for k, (result, _) in answers.items()}
    counts = {"instances": len(listed), "winner_answered": 0, "correct": 0, "wrong": 0,
              "unanswered": 0, "extra": 0, "wrong_cases": [], "over_limit": []}  # fmt: skip
    for key, timeout in listed.items():
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
        limit, seconds = timeout * scale, answers.get(key, ("", 0.0))[1]
        if seconds > limit * 1.05 and seconds > limit + 1:
            counts["over_limit"].append({"instance": key, "seconds": seconds, "limit": limit})
    points = score.score(ours, {k: winner.get(k, "missing") for k in listed})
    counts["score"], counts["winner_score"] = points["score"], points["winner_score"]
    peer = _answers(PEER / f"{name}.csv")
    rows = [k for k in peer if winner.get(k) in ANSWERS]
    counts["peer_rows"] = len(peer)
    counts["peer_correct"] = sum(peer[k][0] == winner[k] for k in rows)
    counts["ours_on_peer_rows"] = sum(ours.get(k) == winner[k] for k in rows)
    return counts


def table(rows: list[dict], scale: float) -> str:
    lines = ["| benchmark | instances | winner answered | correct | wrong | unanswered | extra "
             "| score (winner) | over limit | ours / peer on the peer's rows | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        peer = (f"{r['ours_on_peer_rows']} / {r['peer_correct']} ({r['peer_rows']} rows)"
                if r["peer_rows"] else "no peer file")  # fmt: skip
        lines.append(f"| {r['benchmark']} | {r['instances']} | {r['winner_answered']} | "
                     f"{r['correct']} | {r['wrong']} | {r['unanswered']} | {r['extra']} | "
                     f"{r['score']} ({r['winner_score']}) | {len(r['over_limit'])} | {peer} | "
                     f"{r['seconds']:.0f} |")  # fmt: skip
    keys = ("instances", "winner_answered", "correct", "wrong", "unanswered", "extra",
            "seconds", "score", "winner_score", "ours_on_peer_rows", "peer_correct", "peer_rows")  # fmt: skip
    total = {k: sum(r[k] for r in rows) for k in keys}
    over = sum(len(r["over_limit"]) for r in rows)
    lines.append(f"| **all** | {total['instances']} | {total['winner_answered']} | "
                 f"{total['correct']} | {total['wrong']} | {total['unanswered']} | "
                 f"{total['extra']} | {total['score']} ({total['winner_score']}) | {over} | "
                 f"{total['ours_on_peer_rows']} / {total['peer_correct']} "
                 f"({total['peer_rows']} rows) | {total['seconds']:.0f} |")  # fmt: skip
    late = [f"- {r['benchmark']} {o['instance'][1]}: {o['seconds']:.1f} s for {o['limit']:.1f} s"
            for r in rows for o in r["over_limit"]]  # fmt: skip
    head = f"`verify run-all` at {scale:g} of the timeouts against the 2023 winner\n\n"
    tail = "\n\nOver their limit:\n" + "\n".join(late) if late else ""
    return head + "\n".join(lines) + tail


def modes_table(scale: float) -> str | None:
    """Correct answers and score per benchmark under each splitting mode, for the benchmarks
    with all three results CSVs (None when there is none); auto's shortfall against the best
    fixed mode."""
    rows = []
    for name in sorted(p.parent.name for p in DATA.glob("*/instances.csv")):
        paths = [RESULTS / f"runall_{name}{suffix(m)}.csv" for m in MODES]
        if not all(p.exists() for p in paths):
            continue
        got = [grade(name, p, scale) for p in paths]
        cells = [f"{g['correct']} ({g['score']})" for g in got]
        best = max(g["correct"] for g in got[1:])
        rows.append(f"| {name} | {got[0]['winner_answered']} | {' | '.join(cells)} | "
                    f"{got[0]['correct'] - best:+d} |")  # fmt: skip
    if not rows:
        return None
    return (f"`verify run-all --splitting MODE` at {scale:g} of the timeouts: correct answers "
            "against the 2023 winner (VNN-COMP score)\n\n"
            "| benchmark | winner answered | auto | input | relu | auto - best fixed |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--only", default=None, help="comma-separated benchmark names, in order")
    parser.add_argument("--grade-only", action="store_true", help="grade the CSVs already there")
    parser.add_argument("--splitting", choices=MODES, default="auto")
    args = parser.parse_args()
    mode, last = args.splitting, {}
    summary = RESULTS / f"runall_truth{suffix(mode)}"
    if args.grade_only and summary.with_suffix(".json").exists():
        old = json.loads(summary.with_suffix(".json").read_text())["rows"]
        last = {r["benchmark"]: r["seconds"] for r in old}
    names = sorted(p.parent.name for p in DATA.glob("*/instances.csv"))
    if args.only:  # in the order given
        names = [n for n in args.only.split(",") if n in names]
    rows = []
    for name in names:
        if args.grade_only:
            out, seconds = RESULTS / f"runall_{name}{suffix(mode)}.csv", last.get(name, 0.0)
        else:
            out, seconds = run_benchmark(name, args.scale, mode)
        rows.append({"benchmark": name, "seconds": seconds, **grade(name, out, args.scale)})
        print(rows[-1], flush=True)
        text = table(rows, args.scale)
        stamp = time.strftime("%Y-%m-%d %H:%M")
        cmd = f"python -m benchmarks.runall_truth --scale {args.scale}"
        cmd += f" --only {args.only}" if args.only else ""
        cmd += " --grade-only" if args.grade_only else ""
        cmd += f" --splitting {mode}" if mode != "auto" else ""
        summary.with_suffix(".md").write_text(f"# {cmd} ({stamp}, 1 thread)\n\n{text}\n")
        summary.with_suffix(".json").write_text(json.dumps(
            {"meta": {"date": stamp, "command": cmd, "scale": args.scale, "splitting": mode},
             "rows": rows}, indent=1))  # fmt: skip
    print(table(rows, args.scale))
    modes = modes_table(args.scale)
    if modes is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M")
        (RESULTS / "runall_modes.md").write_text(f"# {stamp}\n\n{modes}\n")
        print(modes)


if __name__ == "__main__":
    main()
