"""Cactus plots: instances solved (sat or unsat) against the time limit, and the time per
instance sorted, from `network,property,result,seconds` results CSVs."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

SOLVED = ("sat", "unsat")


def read_results(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [dict(r, seconds=float(r["seconds"])) for r in csv.DictReader(f)]


def solved_times(rows: list[dict]) -> list[float]:
    """Sorted seconds of the solved instances."""
    return sorted(r["seconds"] for r in rows if r["result"] in SOLVED)


def plot(results: dict[str, list[dict]], path: Path, title: str = "") -> Path:
    """Two panels: the number solved within t seconds (cactus), and every instance's seconds
    sorted (solved and not). `results` maps a label to its rows."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # optional plotting dependency
        raise ImportError("cactus plots need matplotlib: pip install matplotlib") from error
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, rows in results.items():
        times = solved_times(rows)
        left.step([0.0, *times], range(len(times) + 1), where="post", label=label)
        right.plot(sorted(r["seconds"] for r in rows), marker=".", linestyle="", label=label)
    left.set(xlabel="time limit (s)", ylabel="instances solved", title="solved vs time")
    right.set(xlabel="instance (sorted)", ylabel="seconds", yscale="log", title="time per instance")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="+", type=Path, help="results CSVs (one curve each)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args()
    print(plot({p.stem: read_results(p) for p in args.csv}, args.out))


if __name__ == "__main__":
    main()
