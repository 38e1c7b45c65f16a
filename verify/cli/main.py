"""Command line: `python -m verify run NET SPEC --timeout S`, `python -m verify run-all CSV` and
`python -m verify check NET SPEC CERT` (a proof certificate, written by `run --certificate`).

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
(`verify.cli.suite`), `run` shards the instance over Ray actors
(`verify.distributed.shards`). `--workers 1`, the default, runs in this process without Ray.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

import torch

from bounds.errors import VerificationInputError
from verify.bab import BabConfig
from verify.certificate import check_certificate
from verify.certificate.store import sha256_file
from verify.cli import faults, vnncomp
from verify.cli.options import (
    add_common,
    bab_config,
    check_method,
    check_output_file,
    count_option,
    distributed,
    load_networks,
    network_paths,
    resolve,
    seconds_option,
)
from verify.cli.rows import Instance, read_instances, summary, write_rows
from verify.cli.suite import run_suite
from verify.distributed import cluster, progress
from verify.errors import CertificateUnsupportedError
from verify.io.vnnlib_common import ParseDeadlineError
from verify.io.vnnlib_load import load_vnnlib
from verify.property import VnnlibProperty
from verify.result import VerificationResult
from verify.verifier import verify

INTERRUPTED = 130  # the shell's status for a run ended by SIGINT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="verify one network and VNN-LIB property")
    run.add_argument("network", type=Path, help="ONNX network (.onnx or .onnx.gz)")
    run.add_argument("property", type=Path, help="VNN-LIB property (.vnnlib or .vnnlib.gz)")
    run.add_argument("--timeout", type=seconds_option, required=True, help="seconds (> 0)")
    run.add_argument("--results-file", type=Path, help="write the VNN-COMP results file here")
    run.add_argument("--certificate", type=Path, help="write the proof certificate here")
    vnncomp.add_run_options(run)
    add_common(run)
    check = sub.add_parser("check", help="check a proof certificate (exit 0: valid, 1: not)")
    check.add_argument("network", type=Path, help="ONNX network (.onnx or .onnx.gz)")
    check.add_argument("property", type=Path, help="VNN-LIB property (.vnnlib or .vnnlib.gz)")
    check.add_argument("certificate", type=Path, help="the certificate file")
    every = sub.add_parser("run-all", help="verify every instance of an instances.csv")
    every.add_argument("instances", type=Path, help="CSV rows: network, property, timeout")
    every.add_argument("--root", type=Path, help="folder the CSV paths are relative to")
    every.add_argument("--out", type=Path, required=True, help="results CSV to write")
    every.add_argument("--limit", type=count_option(1), help="only the first N instances")
    every.add_argument("--certificates", type=Path, help="write NET__PROP.cert files here")
    every.add_argument(
        "--timeout-scale", type=seconds_option, default=1.0, help="multiply timeouts (> 0)"
    )
    add_common(every)
    faults.add_parser(sub)
    vnncomp.add_parser(sub)
    return parser


def prepared(
    args: argparse.Namespace, deadline: float | None = None
) -> tuple[torch.nn.Module, VnnlibProperty, BabConfig]:
    """`run`'s network, property and settings (bad files and options raise
    VerificationInputError; a property still being read at `deadline`, ParseDeadlineError)."""
    prop = load_vnnlib(resolve(Path.cwd(), str(args.property)), deadline=deadline)
    net = load_networks(network_paths(Path.cwd(), str(args.network)), args.device, prop)
    config = bab_config(args)
    check_method(args)
    return net, prop, config


def run_one(args: argparse.Namespace) -> VerificationResult:
    if args.results_file is not None:
        check_output_file(args.results_file, "--results-file")
    if args.certificate is not None:
        check_output_file(args.certificate, "--certificate")
        network, prop_path = (resolve(Path.cwd(), str(p)) for p in (args.network, args.property))
        result = verify(
            network, prop_path, timeout=args.timeout, method=args.method,
            splitting=args.splitting, config=bab_config(args), workers=args.workers or 1,
            ray_address=args.ray, certificate=args.certificate,
        )  # fmt: skip
    elif distributed(args):
        result = run_sharded(args)
    else:
        deadline = time.monotonic() + vnncomp.budget(args)  # reading counts against it
        try:
            net, prop, config = vnncomp_instance(args, deadline)
        except ParseDeadlineError:
            net = prop = config = None
        seconds = deadline - time.monotonic()
        if seconds <= 0 or prop is None:
            result = VerificationResult("timeout", None, 0.0, {})
        else:
            result = verify(
                net, prop, timeout=seconds, method=args.method,
                splitting=args.splitting, config=config,
            )  # fmt: skip
    if args.results_file is not None:
        vnncomp.write_results(args.results_file, result.results_text())
    return result


def vnncomp_instance(
    args: argparse.Namespace, deadline: float | None = None
) -> tuple[torch.nn.Module, VnnlibProperty, BabConfig]:
    """`prepared(args, deadline)`, from `prepare`'s cache when `--cache` holds this instance."""
    found = vnncomp.cached(args)
    if found is None:
        return prepared(args, deadline)
    config = bab_config(args)
    check_method(args)
    return found[0], found[1], config


def run_sharded(args: argparse.Namespace) -> VerificationResult:
    """`run` with the instance sharded over Ray workers and an aggregated progress bar on
    stderr; a cluster this call started is shut down at the end."""
    try:
        workers = args.workers
        if workers is None:  # --ray alone: the whole cluster
            ray = cluster.connect(1, args.ray, args.threads, f"--ray {args.ray}")
            workers = cluster.cluster_workers(ray, args.threads)
        net, prop, config = prepared(args)
        bar = progress.Progress(workers, stream=sys.stderr)
        with progress.reporting(bar):
            result = verify(
                net, prop, timeout=args.timeout, method=args.method,
                splitting=args.splitting, config=config, workers=workers, ray_address=args.ray,
            )  # fmt: skip
        bar.close()
    finally:
        cluster.shutdown()
    return result


def run_all(
    args: argparse.Namespace, out: TextIO | None = None, errors: TextIO | None = None
) -> list[dict]:
    """Run every instance; returns the rows written to `args.out`. The first Ctrl-C ends the run
    after writing the current instance as "unknown" (`args.interrupted` is then True)."""
    if distributed(args):
        if getattr(args, "certificates", None) is not None:
            raise CertificateUnsupportedError("--certificates needs one worker (no Ray)")
        return run_suite(args, out, errors)
    out, errors = out or sys.stdout, errors or sys.stderr
    if getattr(args, "certificates", None) is not None and not args.certificates.is_dir():
        raise VerificationInputError(f"--certificates: {args.certificates} is not a folder")
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
    net_paths, prop_path = network_paths(root, instance.network), resolve(root, instance.property)
    try:  # reading the property counts against the instance's limit
        prop = load_vnnlib(prop_path, deadline=start + instance.timeout * args.timeout_scale)
    except ParseDeadlineError:
        return "timeout"
    key = ";".join(map(str, net_paths))
    if key not in nets or prop.networks:  # a product is laid out by its property
        nets[key] = load_networks(net_paths, args.device, prop)
    check_method(args)
    budget = instance.timeout * args.timeout_scale - (time.monotonic() - start)
    if budget <= 0:
        return "timeout"
    certificate = hashes = None
    if getattr(args, "certificates", None) is not None:
        if len(net_paths) > 1:
            raise CertificateUnsupportedError("certificates of properties over several networks")
        certificate = args.certificates / f"{_stem(net_paths[0])}__{_stem(prop_path)}.cert"
        hashes = (sha256_file(net_paths[0]), sha256_file(prop_path))
    result = verify(
        nets[key], prop, timeout=budget, method=args.method,
        splitting=args.splitting, config=config, certificate=certificate, hashes=hashes,
    )  # fmt: skip
    if result.stats.get("interrupted"):
        raise KeyboardInterrupt
    return result.status


def _stem(path: Path) -> str:
    """The file's name without `.gz`, `.onnx` or `.vnnlib`."""
    name = path.name.removesuffix(".gz")
    return name.removesuffix(".onnx").removesuffix(".vnnlib")


def main(argv: list[str] | None = None) -> int:
    """The exit status: 0, 2 for bad input (one `error:` line on stderr), 130 when run-all was
    interrupted; `check`: 0 valid, 1 invalid (one line: `valid` or `invalid: <reason>`)."""
    args = build_parser().parse_args(argv)
    if args.command == "check":
        checked = check_certificate(args.network, args.property, args.certificate)
        print(checked, flush=True)
        return 0 if checked.valid else 1
    if args.command == "prepare":
        try:
            vnncomp.prepare(args)
        except VerificationInputError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            return 2
        print("prepared", flush=True)
        return 0
    torch.set_num_threads(args.threads)
    if args.command == "faults":
        return faults.main(args)
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
