"""VNN-COMP 2022 benchmarks (ACAS Xu, mnist_fc) through `python -m verify run-all`.

    python benchmarks/vnncomp.py --bench acasxu --timeout-scale 0.05

Writes `benchmarks/results/vnncomp_<bench>[_<tag>].csv` (network,property,result,seconds),
`vnncomp_<bench>.json` (settings, counts, rows, contradictions with the known answers) and
`vnncomp_<bench>.png` (cactus plot). "sat" answers carry a counterexample validated in float64
by construction; "unsat" answers on instances known to be violated are listed as contradictions.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cactus import plot
from benchmarks.common import DATA, RESULTS, write_json
from verify.bab import SPLITTINGS, BabConfig, ReluSplitConfig
from verify.cli.main import build_parser, run_all
from verify.cli.rows import summary

# ACAS Xu instances violated in VNN-COMP 2022 that are known independently of our tool
# (Katz et al. 2017: property 7 on N_1,9 and property 8 on N_2,9 are violated).
KNOWN_SAT = {
    "acasxu": {
        ("onnx/ACASXU_run2a_1_9_batch_2000.onnx", "vnnlib/prop_7.vnnlib"),
        ("onnx/ACASXU_run2a_2_9_batch_2000.onnx", "vnnlib/prop_8.vnnlib"),
    }
}


def contradictions(bench: str, rows: list[dict]) -> list[dict]:
    """Rows answered "unsat" on an instance known to be violated."""
    known = KNOWN_SAT.get(bench, set())
    return [r for r in rows if r["result"] == "unsat" and (r["network"], r["property"]) in known]


def run(
    bench: str, scale: float, limit: int | None, method: str | None, splitting: str, tag: str = "",
    prox_sweeps: int = 0, instances: Path | None = None, hard_bounder: str = "prox",
    hard_stall: int = 0, root_bounds: str = ReluSplitConfig.root_intermediate,
    hard_warm_start: bool = ReluSplitConfig.hard_warm_start,
    input_branching: str = BabConfig.branching, clip: bool = BabConfig.clip,
) -> dict:  # fmt: skip
    name = f"vnncomp_{bench}{tag}"
    folder = DATA / "vnncomp2022" / bench
    argv = [
        "run-all", str(instances or folder / "instances.csv"), "--root", str(folder),
        "--out", str(RESULTS / f"{name}.csv"), "--timeout-scale", str(scale),
        "--splitting", splitting, "--prox-sweeps", str(prox_sweeps),
        "--hard-bounder", hard_bounder, "--hard-stall", str(hard_stall), "--device", "cpu",
        "--threads", "1", "--root-bounds", root_bounds,
        "--hard-warm-start" if hard_warm_start else "--no-hard-warm-start",
        "--input-branching", input_branching, "--clip" if clip else "--no-clip",
    ]  # fmt: skip
    if method is not None:
        argv += ["--method", method]
    if limit is not None:
        argv += ["--limit", str(limit)]
    args = build_parser().parse_args(argv)  # every option the CLI has, with its defaults
    start = time.monotonic()
    rows = run_all(args)
    payload = {
        "benchmark": bench,
        "timeout_scale": scale,
        "method": method,
        "splitting": splitting,
        "prox_sweeps": prox_sweeps,
        "hard_bounder": hard_bounder,
        "hard_stall": hard_stall,
        "root_bounds": root_bounds,
        "hard_warm_start": hard_warm_start,
        "input_branching": input_branching,
        "clip": clip,
        "instances": str(args.instances),
        "threads": torch.get_num_threads(),
        "wall_seconds": round(time.monotonic() - start, 1),
        "counts": dict(Counter(r["result"] for r in rows)),
        "per_property": _per_property(rows),
        "contradictions": contradictions(bench, rows),
        "rows": rows,
    }
    write_json(f"{name}.json", payload)
    plot({f"{bench} x{scale}": rows}, RESULTS / f"{name}.png", title=bench)
    return payload


def _per_property(rows: list[dict]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter] = {}
    for r in rows:
        table.setdefault(Path(r["property"]).name, Counter())[r["result"]] += 1
    return {prop: dict(counts) for prop, counts in sorted(table.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", nargs="+", default=["acasxu"], choices=["acasxu", "mnist_fc"])
    parser.add_argument("--timeout-scale", type=float, default=1.0)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--method", help="bound method of input splitting (default: the CLI's)")
    parser.add_argument(
        "--splitting", nargs="+", default=["auto"], choices=SPLITTINGS,
        help="one or more modes, run one after the other (each tagged with its name when "
        "several) and compared side by side",
    )  # fmt: skip
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--prox-sweeps", type=int, default=0, help="see python -m verify run -h")
    parser.add_argument("--instances", type=Path, help="a subset CSV (paths as in the bench's)")
    parser.add_argument(
        "--hard-bounder", default="prox", choices=("prox", "active-set"),
        help="the bounder of --prox-sweeps (see python -m verify run -h)",
    )  # fmt: skip
    parser.add_argument("--hard-stall", type=int, default=0, help="see python -m verify run -h")
    parser.add_argument(
        "--root-bounds", default=ReluSplitConfig.root_intermediate,
        help="see python -m verify run -h"
    )  # fmt: skip
    parser.add_argument(
        "--hard-warm-start", action=argparse.BooleanOptionalAction,
        default=ReluSplitConfig.hard_warm_start, help="see python -m verify run -h",
    )  # fmt: skip
    parser.add_argument(
        "--input-branching", default=BabConfig.branching, help="see python -m verify run -h"
    )
    parser.add_argument(
        "--clip", action=argparse.BooleanOptionalAction, default=BabConfig.clip,
        help="see python -m verify run -h",
    )  # fmt: skip
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"the shared data folder {DATA} is absent")
    torch.set_num_threads(1)
    for bench in args.bench:
        answered: dict[str, int] = {}
        for splitting in args.splitting:
            parts = [args.tag] + ([splitting] if len(args.splitting) > 1 else [])
            tag = "".join(f"_{p}" for p in parts if p)
            payload = run(
                bench, args.timeout_scale, args.limit, args.method, splitting, tag,
                args.prox_sweeps, args.instances, args.hard_bounder, args.hard_stall,
                args.root_bounds, args.hard_warm_start, args.input_branching, args.clip,
            )  # fmt: skip
            print(f"{bench}, --splitting {splitting}:")
            print(summary(payload["rows"]))
            print("per property:", payload["per_property"])
            print("contradictions with known answers:", payload["contradictions"] or "none")
            answered[splitting] = sum(r["result"] in ("sat", "unsat") for r in payload["rows"])
        if len(answered) > 1:
            print(side_by_side(bench, answered))


def side_by_side(bench: str, answered: dict[str, int]) -> str:
    """The answered counts per splitting mode, and auto's against the best fixed mode."""
    lines = [f"{bench}: answered per splitting mode", "mode      answered"]
    lines += [f"{mode:<9} {count:>8}" for mode, count in answered.items()]
    fixed = {m: c for m, c in answered.items() if m != "auto"}
    if "auto" in answered and fixed:
        best = max(fixed, key=fixed.get)
        lines.append(f"auto - best fixed ({best}): {answered['auto'] - fixed[best]:+d}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
