"""VNN-COMP scoring: +10 per correct answer, -150 per wrong one (the 2022-2025 rules), per
benchmark and in total, against the winner's answers (`../shared/data/vnncomp2023/truth/`).

An answer is graded against the winner's answer for the same instance:
- both answered, the same way: correct (+10); the other way: wrong (-150), except that a "sat"
  whose counterexample checks (`check_counterexample`: the point in the input box and the
  network's output there, recomputed, in the unsafe set, at the competition's tolerance of
  1e-4 absolute and 1e-3 relative) is correct whatever the other answered;
- ours only: a "sat" whose counterexample checks, +10 (else -150); an "unsat" no tool
  contradicts counts +10 in the competition, here it is listed as ungraded (`extra_unsat`)
  and scored 0, since no second tool was run;
- unknown, timeout, error or none: 0.

    python -m benchmarks.score RESULTS.csv BENCHMARK   (a `verify run-all` CSV)
`benchmarks/runall_truth.py` prints the score beside the counts."""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

import numpy as np
import torch

CORRECT, WRONG = 10, -150
ATOL, RTOL = 1e-4, 1e-3
ANSWERS = ("sat", "unsat")
ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT.parent / "shared" / "data" / "vnncomp2023" / "truth"
ASSIGNMENT = re.compile(r"\(\s*([XY])_(\d+)\s+([^\s()]+)\s*\)")


def key(network: str, prop: str) -> tuple[str, str]:
    """Instance names compared without folders and compression suffixes."""
    net = Path(network).name.removesuffix(".gz").removesuffix(".onnx")
    return net, Path(prop).name.removesuffix(".gz").removesuffix(".vnnlib")


def read_truth(benchmark: str, folder: Path = TRUTH) -> dict[tuple[str, str], str]:
    """The winner's result per (network, property)."""
    with open(folder / f"{benchmark}.csv", newline="") as f:
        return {key(r[1], r[2]): r[4].strip() for r in csv.reader(f) if len(r) > 4}


def parse_assignment(text: str) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)` of a results file's `((X_0 v) ... (Y_0 v) ...)`."""
    values: dict[str, dict[int, float]] = {"X": {}, "Y": {}}
    for letter, index, value in ASSIGNMENT.findall(text):
        values[letter][int(index)] = float(value)
    x, y = (np.array([v[i] for i in range(len(v))]) for v in (values["X"], values["Y"]))
    return x, y


def check_counterexample(net: torch.nn.Module, prop, x: np.ndarray, y: np.ndarray) -> bool:
    """The competition's check: `x` in some region's box (within ATOL), the network's output
    at `x` within ATOL + RTOL |y| of the stated `y`, and `y` in one of that region's unsafe
    polytopes (within ATOL)."""
    shape = getattr(net, "input_shape", None) or (len(x),)
    with torch.no_grad():
        out = net.double()(torch.tensor(x).reshape(1, *shape)).reshape(-1).numpy()
    if out.shape != y.shape or not (np.abs(out - y) <= ATOL + RTOL * np.abs(y)).all():
        return False
    for region in prop.regions:
        inside = ((x >= region.lower - ATOL) & (x <= region.upper + ATOL)).all()
        unsafe = (((p.A @ y - p.b) <= ATOL).all() for p in region.unsafe if p.A_x is None)
        if inside and any(unsafe):
            return True
    return False


def grade(ours: str, theirs: str, counterexample_ok: bool | None = None) -> tuple[str, int]:
    """`(verdict, points)` of one instance (module docstring); `counterexample_ok`: whether a
    "sat" answer's counterexample checks (None: not checked, taken as valid: our "sat" answers
    are validated in float64 before they are reported)."""
    if ours == "sat" and counterexample_ok is False:
        return "wrong", WRONG
    if ours not in ANSWERS:
        return "unanswered", 0
    if theirs in ANSWERS:
        if ours == theirs or ours == "sat":
            return "correct", CORRECT
        return "wrong", WRONG
    return ("extra_sat", CORRECT) if ours == "sat" else ("extra_unsat", 0)


def score(ours: dict[tuple[str, str], str], truth: dict[tuple[str, str], str]) -> dict:
    """Counts of each verdict, our points and the winner's (+10 per answer it gave)."""
    out = {"correct": 0, "wrong": 0, "unanswered": 0, "extra_sat": 0, "extra_unsat": 0}
    points = 0
    for instance, theirs in truth.items():
        verdict, p = grade(ours.get(instance, "none"), theirs)
        out[verdict] += 1
        points += p
    winner = CORRECT * sum(t in ANSWERS for t in truth.values())
    return {**out, "score": points, "winner_score": winner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a `verify run-all` results CSV")
    parser.add_argument("benchmark", help="the truth file's name (e.g. nn4sys)")
    args = parser.parse_args()
    with open(args.results, newline="") as f:
        ours = {key(r["network"], r["property"]): r["result"] for r in csv.DictReader(f)}
    print(score(ours, read_truth(args.benchmark)))


if __name__ == "__main__":
    main()
