"""VNN-COMP's tool interface (the scripts in `vnncomp_scripts/` call these).

- `python -m verify prepare NET SPEC --cache DIR`: converts the ONNX network and reads the
  VNN-LIB property, checks that they fit (typed errors, exit 2: the competition then skips the
  instance), and caches both in `DIR` with the SHA-256 of the two files.
- `python -m verify run NET SPEC --timeout T --cache DIR --started-at S`: reuses the cache when
  its hashes are those of the files (else reads them again), and counts the time since `S`
  (`time.time()` when the script started: Python's imports) against `T`.
- The results file is written through a rename (`write_results`): a run killed at its
  timeout leaves the script's own first answer ("timeout"), never half a file."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from verify.argmax_output import rewrite as rewrite_argmax
from verify.certificate.store import sha256_file
from verify.cli.options import check_output_file, load_networks, network_paths, resolve
from verify.io.vnnlib_load import load_vnnlib
from verify.verifier import check_sizes

CACHE_NAME = "instance.pt"


def add_parser(sub: Any) -> None:
    """The `prepare` command."""
    prepare = sub.add_parser("prepare", help="convert, check and cache a VNN-COMP instance")
    prepare.add_argument("network", type=Path, help="ONNX network (.onnx or .onnx.gz)")
    prepare.add_argument("property", type=Path, help="VNN-LIB property (.vnnlib or .vnnlib.gz)")
    prepare.add_argument("--cache", type=Path, required=True, help="folder for the cache")


def add_run_options(run: argparse.ArgumentParser) -> None:
    """`run`'s options for the competition's scripts."""
    run.add_argument("--cache", type=Path, help="reuse what `prepare --cache` stored here")
    run.add_argument(
        "--started-at", type=float, help="time.time() when the caller started: counts as spent"
    )


def _paths(args: argparse.Namespace) -> tuple[list[Path], Path]:
    return network_paths(Path.cwd(), str(args.network)), resolve(Path.cwd(), str(args.property))


def _hash(paths: list[Path]) -> str:
    return ";".join(sha256_file(p) for p in paths)


def prepare(args: argparse.Namespace) -> None:
    """Load and check the instance, then cache it (`args.cache / CACHE_NAME`, by a rename)."""
    networks, prop_path = _paths(args)
    args.cache.mkdir(parents=True, exist_ok=True)
    check_output_file(args.cache / CACHE_NAME, "--cache")
    prop = load_vnnlib(prop_path)
    net = load_networks(networks, "cpu", prop)
    arg = getattr(net, "argmax_output", None)
    check_sizes(net, prop if arg is None else rewrite_argmax(prop, arg))
    payload = {"network_sha256": _hash(networks), "property_sha256": sha256_file(prop_path),
               "network": net, "property": prop}  # fmt: skip
    fd, tmp = tempfile.mkstemp(dir=args.cache, suffix=".part")
    os.close(fd)
    torch.save(payload, tmp)
    os.replace(tmp, args.cache / CACHE_NAME)


def cached(args: argparse.Namespace) -> tuple[torch.nn.Module, Any] | None:
    """The cached network and property when `--cache` holds those of these two files."""
    path = args.cache / CACHE_NAME if getattr(args, "cache", None) else None
    if path is None or not path.is_file():
        return None
    networks, prop_path = _paths(args)
    payload = torch.load(path, weights_only=False)  # our own file, written by `prepare`
    if (payload.get("network_sha256"), payload.get("property_sha256")) != (
        _hash(networks),
        sha256_file(prop_path),
    ):
        return None
    return payload["network"].to(args.device).eval(), payload["property"]


def budget(args: argparse.Namespace) -> float:
    """`--timeout` less the time since `--started-at` (the whole timeout without it)."""
    started = getattr(args, "started_at", None)
    return args.timeout if started is None else args.timeout - (time.time() - started)


def write_results(path: Path, text: str) -> None:
    """`text` to `path` through a temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", suffix=".part")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
