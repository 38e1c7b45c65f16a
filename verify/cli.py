"""Command line: `python -m verify run NET SPEC --timeout S` and `python -m verify run-all CSV`.

`run` prints one line, the result (`unsat`, `sat`, `unknown` or `timeout`), and writes the
VNN-COMP results file when `--results-file` is given. `run-all` runs a VNN-COMP
`instances.csv` (network, property, timeout per row; a missing `.onnx`/`.vnnlib` is read from its
`.gz` sibling), prints one line per instance and a summary, and writes `network,property,result,
seconds` rows to `--out` after every instance.

Every option is validated before any work (timeouts finite and > 0, counts >= 1, output folders
that exist, a known method and device); a bad one exits with status 2 and names it. Bad input
files give one `error:` line naming the file (and line), status 2. In `run-all`, a bad row of the
CSV (missing columns, a header, a non-numeric timeout, a file that cannot be read) is reported
with its row number and skipped. The first Ctrl-C stops `run-all`: the instance it interrupted is
written as `unknown`, the finished rows are kept, and the exit status is 130.

`--workers N` (N > 1) or `--ray ADDRESS` use Ray (extra `[distributed]`; without it: one
`error:` line, status 2): `run-all` spreads the instances as Ray tasks
(`verify.distributed.suite`), `run` shards the instance over Ray actors
(`verify.distributed.shards`). `--workers 1`, the default, runs in this process without Ray.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from bounds.errors import VerificationInputError
from bounds.registry import available_methods, methods_with
from verify import faults_cli
from verify.bab import SPLITTINGS, BabConfig, ReluSplitConfig, splitting_mode
from verify.io.onnx_loader import load_onnx
from verify.io.vnnlib import load_vnnlib
from verify.property import VnnlibProperty
from verify.verifier import STATUSES, VerificationResult, verify

DEFAULT_METHOD = "crown"
INTERRUPTED = 130  # the shell's status for a run ended by SIGINT


def resolve(root: Path, name: str) -> Path:
    """`root/name`, or its `.gz` sibling when only that exists."""
    path = root / name
    gz = path.with_name(path.name + ".gz")
    return gz if not path.exists() and gz.exists() else path


def seconds_option(text: str) -> float:
    """A finite number of seconds > 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text!r}")
    return value


def count_option(minimum: int):
    """An argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def method_option(text: str) -> str:
    if text not in available_methods():
        known = ", ".join(available_methods())
        raise argparse.ArgumentTypeError(f"unknown method {text!r}; available: {known}")
    return text


def device_option(text: str) -> str:
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device on this machine")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu and cuda devices are supported")
    return text


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--method",
        type=method_option,
        help=f"bound method per input-split domain ({DEFAULT_METHOD}); ReLU splitting always "
        "uses alpha-beta-CROWN, so --method with it is an error",
    )
    parser.add_argument(
        "--splitting",
        choices=SPLITTINGS,
        default="auto",
        help="branch on inputs, on ReLUs, or auto: inputs for small input dimensions (auto)",
    )
    parser.add_argument(
        "--prox-sweeps",
        type=count_option(0),
        default=ReluSplitConfig.prox_iterations,
        help="ReLU splitting: iterations of the hard-domain bounder (--hard-bounder) on the "
        f"domains alpha-beta-CROWN leaves open (0: off; default {ReluSplitConfig.prox_iterations})",
    )
    parser.add_argument(
        "--hard-bounder",
        choices=methods_with("hard_bounder"),
        default=ReluSplitConfig.hard_bounder,
        help="ReLU splitting: the bounder of --prox-sweeps: prox (Planet relaxation) or "
        "active-set (Anderson relaxation, tighter; ReLU chains) "
        f"(default {ReluSplitConfig.hard_bounder})",
    )
    parser.add_argument(
        "--hard-stall",
        type=count_option(0),
        default=ReluSplitConfig.hard_stall,
        help="ReLU splitting: give a domain to the hard-domain bounder only once its bound has "
        "improved little over this many splits in a row (the hard-subtree predictor; 0: every "
        f"open domain; default {ReluSplitConfig.hard_stall})",
    )
    parser.add_argument(
        "--hard-warm-start",
        action=argparse.BooleanOptionalAction,
        default=ReluSplitConfig.hard_warm_start,
        help="ReLU splitting with --hard-bounder active-set: children start from the duals and "
        "cuts of their parent's hard bound where that is better than their slopes "
        f"(default {ReluSplitConfig.hard_warm_start})",
    )
    parser.add_argument(
        "--root-bounds",
        choices=("alpha-crown", *methods_with("root_intermediate")),
        default=ReluSplitConfig.root_intermediate,
        help="ReLU splitting: after alpha-CROWN, tighten the root's intermediate bounds by this "
        "dual solver (active-set, sp-fw: the Anderson relaxation, tighter than Planet; prox: "
        f"Planet's), within half the time left; alpha-crown: no further stage (default "
        f"{ReluSplitConfig.root_intermediate})",
    )
    parser.add_argument(
        "--workers",
        type=count_option(1),
        help="worker processes on a Ray cluster (default 1: this process, no Ray); run-all "
        "spreads the instances over them, run shards the instance; with --ray, the default is "
        "the cluster's CPUs over --threads",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="join this Ray cluster (e.g. auto or HOST:6379) instead of starting a local one",
    )
    parser.add_argument(
        "--threads", type=count_option(1), default=1, help="torch threads (1; per worker)"
    )
    parser.add_argument(
        "--device", type=device_option, default="cpu", help="torch device of the network (cpu)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="verify one network and VNN-LIB property")
    run.add_argument("network", type=Path, help="ONNX network (.onnx or .onnx.gz)")
    run.add_argument("property", type=Path, help="VNN-LIB property (.vnnlib or .vnnlib.gz)")
    run.add_argument("--timeout", type=seconds_option, required=True, help="seconds (> 0)")
    run.add_argument("--results-file", type=Path, help="write the VNN-COMP results file here")
    _common(run)
    every = sub.add_parser("run-all", help="verify every instance of an instances.csv")
    every.add_argument("instances", type=Path, help="CSV rows: network, property, timeout")
    every.add_argument("--root", type=Path, help="folder the CSV paths are relative to")
    every.add_argument("--out", type=Path, required=True, help="results CSV to write")
    every.add_argument("--limit", type=count_option(1), help="only the first N instances")
    every.add_argument(
        "--timeout-scale", type=seconds_option, default=1.0, help="multiply timeouts (> 0)"
    )
    _common(every)
    faults_cli.add_parser(sub)
    return parser


def check_output_file(path: Path, option: str) -> None:
    """`path` can be written: its folder exists and it is not a folder (checked before work)."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise VerificationInputError(f"{option} {path} is a folder, not a file")
    if not folder.is_dir():
        raise VerificationInputError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise VerificationInputError(f"{option} {path}: the folder {folder} is not writable")


def load_network(path: Path, device: str) -> torch.nn.Module:
    return load_onnx(path).to(device).eval()


def bab_config(args: argparse.Namespace) -> BabConfig:
    """The branch-and-bound settings the options change (the rest: defaults)."""
    sweeps = getattr(args, "prox_sweeps", ReluSplitConfig.prox_iterations)
    bounder = getattr(args, "hard_bounder", ReluSplitConfig.hard_bounder)
    stall = getattr(args, "hard_stall", ReluSplitConfig.hard_stall)
    root = getattr(args, "root_bounds", ReluSplitConfig.root_intermediate)
    warm = getattr(args, "hard_warm_start", ReluSplitConfig.hard_warm_start)
    relu = ReluSplitConfig(prox_iterations=sweeps, hard_bounder=bounder, hard_stall=stall,
                           root_intermediate=root, hard_warm_start=warm)  # fmt: skip
    return BabConfig(relu=relu)


def check_method(args: argparse.Namespace, net: torch.nn.Module, prop, config: BabConfig) -> None:
    """`--method` only applies to input splitting: refuse it where ReLU splitting would run."""
    if args.method is None:
        return
    chosen = BabConfig(splitting=args.splitting, relu=config.relu)
    if any(splitting_mode(net, region, chosen) == "relu" for region in prop.regions):
        raise VerificationInputError(
            f"--method {args.method} applies to input splitting only; this instance is verified "
            "by ReLU splitting, which bounds its domains with alpha-beta-CROWN (drop --method "
            "or pass --splitting input)"
        )


def distributed(args: argparse.Namespace) -> bool:
    """Whether the options ask for Ray (more than one worker, or a cluster address); then Ray
    must be importable (`RayUnavailableError` naming the option, before any work)."""
    if (args.workers or 1) == 1 and args.ray is None:
        return False
    from verify.distributed.cluster import require_ray  # the optional extra

    require_ray(f"--workers {args.workers}" if args.ray is None else f"--ray {args.ray}")
    return True


def prepared(args: argparse.Namespace) -> tuple[torch.nn.Module, VnnlibProperty, BabConfig]:
    """`run`'s network, property and settings (bad files and options raise
    VerificationInputError)."""
    network, prop_path = (resolve(Path.cwd(), str(p)) for p in (args.network, args.property))
    net = load_network(network, args.device)
    prop = load_vnnlib(prop_path)
    config = bab_config(args)
    check_method(args, net, prop, config)
    return net, prop, config


def run_one(args: argparse.Namespace) -> VerificationResult:
    if args.results_file is not None:
        check_output_file(args.results_file, "--results-file")
    if distributed(args):
        result = run_sharded(args)
    else:
        net, prop, config = prepared(args)
        result = verify(
            net, prop, timeout=args.timeout, method=args.method or DEFAULT_METHOD,
            splitting=args.splitting, config=config,
        )  # fmt: skip
    if args.results_file is not None:
        args.results_file.write_text(result.results_text())
    return result


def run_sharded(args: argparse.Namespace) -> VerificationResult:
    """`run` with the instance sharded over Ray workers and an aggregated progress bar on
    stderr; a cluster this call started is shut down at the end."""
    from verify.distributed import cluster, progress  # the optional extra

    try:
        workers = args.workers
        if workers is None:  # --ray alone: the whole cluster
            ray = cluster.connect(1, args.ray, args.threads, f"--ray {args.ray}")
            workers = cluster.cluster_workers(ray, args.threads)
        net, prop, config = prepared(args)
        bar = progress.Progress(workers, stream=sys.stderr)
        with progress.reporting(bar):
            result = verify(
                net, prop, timeout=args.timeout, method=args.method or DEFAULT_METHOD,
                splitting=args.splitting, config=config, workers=workers, ray_address=args.ray,
            )  # fmt: skip
        bar.close()
    finally:
        cluster.shutdown()
    return result


@dataclass(frozen=True)
class Instance:
    """One row of an instances.csv: names as written, the timeout, the 1-based row number."""

    network: str
    property: str
    timeout: float
    row: int


def read_instances(path: Path, limit: int | None = None, errors=None) -> list[Instance]:
    """The valid rows of `path` (at most `limit`); each bad row is reported to `errors` as
    `path:ROW: skipped: why` and left out. An unreadable file raises VerificationInputError."""
    errors = errors or sys.stderr
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise VerificationInputError(f"{path}: cannot read the instances file ({exc})") from exc
    instances: list[Instance] = []
    for number, row in enumerate(rows, 1):
        if not row or all(not cell.strip() for cell in row):
            continue
        why = _row_problem(row)
        if why is not None:
            print(f"{path}:{number}: skipped: {why}", file=errors, flush=True)
            continue
        instances.append(Instance(row[0].strip(), row[1].strip(), float(row[2]), number))
        if limit is not None and len(instances) == limit:
            break
    return instances


def _row_problem(row: list[str]) -> str | None:
    if len(row) < 3:
        return f"{len(row)} columns, expected 3 (network, property, timeout)"
    if not row[0].strip() or not row[1].strip():
        return "an empty network or property name"
    try:
        timeout = float(row[2])
    except ValueError:
        return f"timeout {row[2].strip()!r} is not a number (a header row?)"
    if not math.isfinite(timeout) or timeout <= 0:
        return f"timeout {row[2].strip()!r} must be finite and > 0"
    return None


def run_all(args: argparse.Namespace, out=None, errors=None) -> list[dict]:
    """Run every instance; returns the rows written to `args.out`. The first Ctrl-C ends the run
    after writing the current instance as "unknown" (`args.interrupted` is then True)."""
    if distributed(args):
        from verify.distributed.suite import run_suite  # the optional extra

        return run_suite(args, out, errors)
    out, errors = out or sys.stdout, errors or sys.stderr
    check_output_file(args.out, "--out")
    root = args.root or args.instances.parent
    instances = read_instances(args.instances, args.limit, errors)
    nets: dict[Path, torch.nn.Module] = {}
    rows: list[dict] = []
    config = bab_config(args)
    args.interrupted = False
    for i, instance in enumerate(instances, 1):
        start = time.monotonic()
        try:
            status = _run_instance(args, instance, root, nets, config, start)
        except KeyboardInterrupt:
            status, args.interrupted = "unknown", True
        except VerificationInputError as error:
            print(f"{args.instances}:{instance.row}: skipped: {error}", file=errors, flush=True)
            continue
        seconds = time.monotonic() - start
        rows.append(dict(network=instance.network, property=instance.property, result=status,
                         seconds=round(seconds, 3)))  # fmt: skip
        print(f"[{i}/{len(instances)}] {instance.network} {instance.property}: {status} "
              f"{seconds:.2f} s", file=out, flush=True)  # fmt: skip
        write_rows(args.out, rows)  # after each instance: an interrupted run keeps its rows
        if args.interrupted:
            print("interrupted: the finished rows are kept", file=errors, flush=True)
            break
    write_rows(args.out, rows)
    print(summary(rows), file=out, flush=True)
    return rows


def _run_instance(args, instance: Instance, root: Path, nets: dict, config, start: float) -> str:
    """The status of one instance (KeyboardInterrupt propagates; bad files raise
    VerificationInputError)."""
    net_path, prop_path = resolve(root, instance.network), resolve(root, instance.property)
    if net_path not in nets:
        nets[net_path] = load_network(net_path, args.device)
    prop = load_vnnlib(prop_path)
    check_method(args, nets[net_path], prop, config)
    budget = instance.timeout * args.timeout_scale - (time.monotonic() - start)
    if budget <= 0:
        return "timeout"
    result = verify(
        nets[net_path], prop, timeout=budget, method=args.method or DEFAULT_METHOD,
        splitting=args.splitting, config=config,
    )  # fmt: skip
    if result.stats.get("interrupted"):
        raise KeyboardInterrupt
    return result.status


def write_rows(path: Path, rows: list[dict]) -> None:
    """Writes the CSV through a temporary file and a rename: an interrupt never leaves it half
    written."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["network", "property", "result", "seconds"])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


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
    """The exit status: 0, 2 for bad input (one `error:` line on stderr), 130 when run-all was
    interrupted."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.command == "faults":
        return faults_cli.main(args)
    try:
        if args.command == "run":
            result = run_one(args)
            print(result.status, flush=True)
            args.interrupted = bool(result.stats.get("interrupted"))
        else:
            run_all(args)
    except VerificationInputError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return INTERRUPTED if getattr(args, "interrupted", False) else 0
