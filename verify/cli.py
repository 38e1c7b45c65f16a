"""Command line: `python -m verify run NET SPEC --timeout S` and `python -m verify run-all CSV`.

`run` prints one line, the result (`unsat`, `sat`, `unknown` or `timeout`), and writes the
VNN-COMP results file when `--results-file` is given. `run-all` runs a VNN-COMP
`instances.csv` (network, property, timeout per row; a missing `.onnx`/`.vnnlib` is read from its
`.gz` sibling), prints one line per instance and a summary, and writes `network,property,result,
seconds` rows to `--out`.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from verify.bab import SPLITTINGS, BabConfig
from verify.onnx_loader import load_onnx
from verify.relu_bab import ReluSplitConfig
from verify.verifier import STATUSES, VerificationResult, verify


def resolve(root: Path, name: str) -> Path:
    """`root/name`, or its `.gz` sibling when only that exists."""
    path = root / name
    gz = path.with_name(path.name + ".gz")
    return gz if not path.exists() and gz.exists() else path


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", default="crown", help="bound method per input-split domain")
    parser.add_argument(
        "--splitting",
        choices=SPLITTINGS,
        default="auto",
        help="branch on inputs, on ReLUs, or auto: inputs for small input dimensions (auto)",
    )
    parser.add_argument(
        "--prox-sweeps",
        type=int,
        default=ReluSplitConfig.prox_iterations,
        help="ReLU splitting: proximal-solver sweeps on the domains alpha-beta-CROWN leaves "
        f"open (0: off; default {ReluSplitConfig.prox_iterations})",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    parser.add_argument("--device", default="cpu", help="torch device of the network (cpu)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="verify one network and VNN-LIB property")
    run.add_argument("network", type=Path, help="ONNX network (.onnx or .onnx.gz)")
    run.add_argument("property", type=Path, help="VNN-LIB property (.vnnlib or .vnnlib.gz)")
    run.add_argument("--timeout", type=float, required=True, help="seconds")
    run.add_argument("--results-file", type=Path, help="write the VNN-COMP results file here")
    _common(run)
    every = sub.add_parser("run-all", help="verify every instance of an instances.csv")
    every.add_argument("instances", type=Path, help="CSV rows: network, property, timeout")
    every.add_argument("--root", type=Path, help="folder the CSV paths are relative to")
    every.add_argument("--out", type=Path, required=True, help="results CSV to write")
    every.add_argument("--limit", type=int, help="only the first N instances")
    every.add_argument("--timeout-scale", type=float, default=1.0, help="multiply timeouts")
    _common(every)
    return parser


def load_network(path: Path, device: str) -> torch.nn.Module:
    return load_onnx(path).to(device).eval()


def bab_config(args: argparse.Namespace) -> BabConfig:
    """The branch-and-bound settings the options change (the rest: defaults)."""
    sweeps = getattr(args, "prox_sweeps", ReluSplitConfig.prox_iterations)
    if sweeps < 0:
        raise SystemExit("--prox-sweeps must be >= 0")
    return BabConfig(relu=ReluSplitConfig(prox_iterations=sweeps))


def run_one(args: argparse.Namespace) -> VerificationResult:
    network, prop = (resolve(Path.cwd(), str(p)) for p in (args.network, args.property))
    net = load_network(network, args.device)
    result = verify(
        net, prop, timeout=args.timeout, method=args.method, splitting=args.splitting,
        config=bab_config(args),
    )  # fmt: skip
    if args.results_file is not None:
        args.results_file.write_text(result.results_text())
    return result


def read_instances(path: Path, root: Path, limit: int | None) -> list[tuple[str, str, float]]:
    """(network, property, timeout) rows, names as written in the CSV."""
    with open(path, newline="") as f:
        rows = [(r[0].strip(), r[1].strip(), float(r[2])) for r in csv.reader(f) if r]
    return rows[:limit] if limit is not None else rows


def run_all(args: argparse.Namespace, out=None) -> list[dict]:
    """Run every instance; returns the rows written to `args.out`."""
    out = out or sys.stdout
    root = args.root or args.instances.parent
    instances = read_instances(args.instances, root, args.limit)
    nets: dict[Path, torch.nn.Module] = {}
    rows: list[dict] = []
    config = bab_config(args)
    for i, (net_name, prop_name, timeout) in enumerate(instances, 1):
        net_path, prop_path = resolve(root, net_name), resolve(root, prop_name)
        start = time.monotonic()
        if net_path not in nets:
            nets[net_path] = load_network(net_path, args.device)
        budget = timeout * args.timeout_scale - (time.monotonic() - start)
        result = verify(
            nets[net_path], prop_path, timeout=budget, method=args.method,
            splitting=getattr(args, "splitting", "auto"), config=config,
        )  # fmt: skip
        seconds = time.monotonic() - start
        rows.append(dict(network=net_name, property=prop_name, result=result.status,
                         seconds=round(seconds, 3)))  # fmt: skip
        print(f"[{i}/{len(instances)}] {net_name} {prop_name}: {result.status} {seconds:.2f} s",
              file=out, flush=True)  # fmt: skip
        write_rows(args.out, rows)  # after each instance: an interrupted run keeps its rows
    write_rows(args.out, rows)
    print(summary(rows), file=out, flush=True)
    return rows


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["network", "property", "result", "seconds"])
        writer.writeheader()
        writer.writerows(rows)


def summary(rows: list[dict]) -> str:
    """A table: count and total seconds per result, and the totals."""
    counts = Counter(r["result"] for r in rows)
    lines = [f"{'result':<8} {'count':>6} {'seconds':>9}"]
    for status in STATUSES:
        total = sum(r["seconds"] for r in rows if r["result"] == status)
        lines.append(f"{status:<8} {counts.get(status, 0):>6} {total:>9.1f}")
    lines.append(f"{'total':<8} {len(rows):>6} {sum(r['seconds'] for r in rows):>9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads < 1:
        raise SystemExit("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    if args.command == "run":
        print(run_one(args).status, flush=True)
    else:
        run_all(args)
    return 0
