"""Proof certificates (issue 26): what certificate mode costs and whether its certificates hold.

    python benchmarks/certificates.py --suite acasxu|mnist_fc|all [--limit N] [--every K]
        [--fraction 0.05] [--out benchmarks/results/certificates/]

For each VNN-COMP 2022 instance, at `fraction` of its timeout, in one process (1 thread):
`verify.verify(net, spec, timeout=T)` without and with `certificate=path`, in alternating
order (even instances plain first, odd ones certified first), each timed end to end as the user
waits (files loaded inside the call; the first instance run once untimed before, so that
neither mode pays the process's first calls); then `verify.check_certificate` timed on every "unsat" or
"sat" certificate; and for every "unsat" certificate mutations that must come out invalid
(`MUTATIONS`: a claim raised, a leaf removed, a split's children swapped (input splitting) or a
ReLU split's sides swapped, the property's last constant changed in a copied spec). A certificate that `verify` refuses
(`CertificateUnsupportedError`, e.g. ReLU splitting) is recorded as "unsupported".

Per suite: instances solved with and without a certificate (and which differ), the time ratio
with / without (total and per instance, over the instances both solved; target <= 1.2), the
certificates' size (MB) and leaves, check time / certified solve time (target <= 0.1), and the
verdicts (every "unsat" certificate valid, every mutation invalid). Writes
`certificates_<suite>.json` and `.md` under `--out`.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DATA, RESULTS, vnncomp_timed_instances
from verify import check_certificate, verify
from verify.errors import CertificateUnsupportedError

SUITES = ("acasxu", "mnist_fc")
SOLVED = ("sat", "unsat")
Edit = Callable[[str, np.ndarray], "np.ndarray | None"]


def timed_verify(net: Path, spec: Path, seconds: float, cert: Path | None) -> dict[str, Any]:
    """`verify` timed end to end: `{status, seconds}` ("unsupported" when refused)."""
    gc.collect()
    start = time.perf_counter()
    try:
        status = verify(str(net), str(spec), timeout=seconds, certificate=cert).status
    except CertificateUnsupportedError as error:
        return {"status": "unsupported", "seconds": time.perf_counter() - start,
                "error": str(error)}  # fmt: skip
    return {"status": status, "seconds": time.perf_counter() - start}


def rewrite(src: Path, dst: Path, edit: Edit) -> None:
    """A copy of the certificate `src` at `dst` with `edit(name, array)` (None: unchanged)
    applied to each `.npy` member."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name.endswith(".npy"):
                new = edit(name, np.load(io.BytesIO(data), allow_pickle=False).copy())
                if new is not None:
                    buffer = io.BytesIO()
                    np.save(buffer, new, allow_pickle=False)
                    data = buffer.getvalue()
            zout.writestr(name, data)


def batch_of(cert: Path, member: str, last: bool) -> str | None:
    """The prefix `b{k}_` of the first (or last) batch holding `member` (None: no batch)."""
    with zipfile.ZipFile(cert) as zf:
        found = [int(n[1:].split("_")[0]) for n in zf.namelist()
                 if n.split("_", 1)[-1] == f"{member}.npy"]  # fmt: skip
    if not found:
        return None
    return f"b{max(found) if last else min(found)}_"


def _raise_claim(prefix: str) -> Edit:
    def edit(name: str, a: np.ndarray) -> np.ndarray | None:
        if name != f"{prefix}leaf_claim.npy":
            return None
        a[-1] = a[-1] * 10 + 1
        return a

    return edit


def _remove_leaf(prefix: str) -> Edit:
    return lambda name, a: a[:-1] if name.startswith(f"{prefix}leaf_") else None


def _swap(member: str, columns: tuple[int, int]) -> Callable[[str], Edit]:
    """The first split of `member` with its two children's `columns` swapped: the left and
    right children (input splitting, `split_ints` columns 3, 4) or the inactive and active
    ones (ReLU splitting, `relu_split_ints` columns 5, 6)."""

    def make(prefix: str) -> Edit:
        def edit(name: str, a: np.ndarray) -> np.ndarray | None:
            if name != f"{prefix}{member}.npy":
                return None
            a[0, list(columns)] = a[0, list(columns[::-1])]
            return a

        return edit

    return make


# name: (the member edited, in the last batch holding it (else the first), the edit of it)
MUTATIONS: dict[str, tuple[str, bool, Callable[[str], Edit]]] = {
    "claim raised": ("leaf_claim", True, _raise_claim),
    "leaf removed": ("leaf_ints", True, _remove_leaf),
    "split children swapped": ("split_ints", False, _swap("split_ints", (3, 4))),
    "ReLU split sides swapped": ("relu_split_ints", False, _swap("relu_split_ints", (5, 6))),
}


def changed_spec(spec: Path, dst: Path) -> Path:
    """A copy of the VNN-LIB file `spec` with its last numeric constant raised by 1."""
    data = spec.read_bytes()
    text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()
    numbers = list(re.finditer(r"(?<![\w.])-?\d+(\.\d+)?([eE][-+]?\d+)?(?![\w.])", text))
    last = numbers[-1]
    dst.write_text(text[: last.start()] + repr(float(last.group()) + 1.0) + text[last.end() :])
    return dst


def mutations(net: Path, spec: Path, cert: Path, scratch: Path) -> dict[str, dict[str, Any]]:
    """Each mutation of the "unsat" certificate `cert` checked: `{name: {valid, reason}}`."""
    out = {}
    for name, (member, last, make) in MUTATIONS.items():
        prefix = batch_of(cert, member, last)
        if prefix is None:
            continue  # no split to swap: the root was closed
        bad = scratch / "mutated.cert"
        rewrite(cert, bad, make(prefix))
        result = check_certificate(net, spec, bad)
        out[name] = {"valid": result.valid, "reason": result.reason}
    result = check_certificate(net, changed_spec(spec, scratch / "changed.vnnlib"), cert)
    out["property constant changed"] = {"valid": result.valid, "reason": result.reason}
    return out


def leaves_of(cert: Path) -> int:
    with zipfile.ZipFile(cert) as zf:
        names = [n for n in zf.namelist() if n.endswith("_leaf_claim.npy")]
        return sum(len(np.load(io.BytesIO(zf.read(n)))) for n in names)


def run_instance(net: Path, spec: Path, seconds: float, certified_first: bool,
                 scratch: Path) -> dict[str, Any]:  # fmt: skip
    """One instance (module docstring): both runs, the check and the mutations."""
    cert = scratch / "instance.cert"
    runs = {}
    for mode in ("certified", "plain") if certified_first else ("plain", "certified"):
        runs[mode] = timed_verify(net, spec, seconds, cert if mode == "certified" else None)
    row: dict[str, Any] = {"network": net.name, "property": spec.name, "timeout": seconds,
                           "order": "certified first" if certified_first else "plain first",
                           **runs}  # fmt: skip
    if runs["certified"]["status"] in SOLVED:
        row["size_mb"] = cert.stat().st_size / 2**20
        row["leaves"] = leaves_of(cert)
        start = time.perf_counter()
        result = check_certificate(net, spec, cert)
        row["check"] = {"valid": result.valid, "reason": result.reason,
                        "seconds": time.perf_counter() - start}  # fmt: skip
        if runs["certified"]["status"] == "unsat":
            row["mutations"] = mutations(net, spec, cert, scratch)
    cert.unlink(missing_ok=True)
    return row


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite's figures (module docstring)."""
    plain = {r["network"] + "/" + r["property"] for r in rows if r["plain"]["status"] in SOLVED}
    cert = {r["network"] + "/" + r["property"] for r in rows if r["certified"]["status"] in SOLVED}
    both = [
        r for r in rows if r["plain"]["status"] in SOLVED and r["certified"]["status"] in SOLVED
    ]
    t_plain = sum(r["plain"]["seconds"] for r in both)
    t_cert = sum(r["certified"]["seconds"] for r in both)
    per = [r["certified"]["seconds"] / r["plain"]["seconds"] for r in both]
    checked = [r for r in rows if "check" in r]
    unsat = [r for r in checked if r["certified"]["status"] == "unsat"]
    muts = [m for r in unsat for m in r["mutations"].values()]
    return {
        "instances": len(rows),
        "solved_plain": len(plain), "solved_certified": len(cert),
        "only_plain": sorted(plain - cert), "only_certified": sorted(cert - plain),
        "unsupported": sum(r["certified"]["status"] == "unsupported" for r in rows),
        "both_solved": len(both), "seconds_plain": t_plain, "seconds_certified": t_cert,
        "time_ratio": _ratio(t_cert, t_plain),
        "per_instance_ratio_median": statistics.median(per) if per else None,
        "per_instance_ratio_max": max(per) if per else None,
        "size_mb_total": sum(r["size_mb"] for r in checked),
        "size_mb_max": max((r["size_mb"] for r in checked), default=0.0),
        "leaves_mean": statistics.mean(r["leaves"] for r in checked) if checked else 0.0,
        "leaves_max": max((r["leaves"] for r in checked), default=0),
        "check_ratio": _ratio(sum(r["check"]["seconds"] for r in unsat),
                              sum(r["certified"]["seconds"] for r in unsat)),
        "check_ratio_max": max((r["check"]["seconds"] / r["certified"]["seconds"]
                                for r in unsat), default=None),
        "unsat_valid": sum(r["check"]["valid"] for r in unsat), "unsat": len(unsat),
        "sat_valid": sum(r["check"]["valid"] for r in checked if r not in unsat),
        "sat": len(checked) - len(unsat),
        "mutations_invalid": sum(not m["valid"] for m in muts), "mutations": len(muts),
    }  # fmt: skip


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(summaries: dict[str, dict[str, Any]], command: str, stamp: str) -> str:
    lines = ["# Certificate mode (issue 26)", "", f"`{command}` ({stamp}, 1 thread)", "",
             "| suite | n | solved plain / cert | unsupported | time ratio (total, median, max) "
             "| size MB (total, max) | leaves (mean, max) | check / solve (total, max) "
             "| unsat valid | sat valid | mutations invalid |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for suite, s in summaries.items():
        lines.append(
            f"| {suite} | {s['instances']} | {s['solved_plain']} / {s['solved_certified']} | "
            f"{s['unsupported']} | {_fmt(s['time_ratio'])}, "
            f"{_fmt(s['per_instance_ratio_median'])}, {_fmt(s['per_instance_ratio_max'])} | "
            f"{s['size_mb_total']:.1f}, {s['size_mb_max']:.2f} | {s['leaves_mean']:.0f}, "
            f"{s['leaves_max']} | {_fmt(s['check_ratio'])}, {_fmt(s['check_ratio_max'])} | "
            f"{s['unsat_valid']}/{s['unsat']} | {s['sat_valid']}/{s['sat']} | "
            f"{s['mutations_invalid']}/{s['mutations']} |"
        )  # fmt: skip
    for suite, s in summaries.items():
        if s["only_plain"] or s["only_certified"]:
            lines += ["", f"{suite}: solved only without a certificate: {s['only_plain']}; "
                      f"only with one: {s['only_certified']}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def run_suite(suite: str, fraction: float, limit: int | None, every: int, scratch: Path,
              partial: Path) -> list[dict]:  # fmt: skip
    """Every `every`-th instance of the suite (at most `limit`), each row also appended to
    `partial` (JSON lines) as it is done."""
    rows = []
    instances = vnncomp_timed_instances(suite)[::every][:limit]
    if instances:  # first calls (imports, caches) of both modes, untimed
        warm_net, warm_spec, warm_timeout = instances[0]
        run_instance(warm_net, warm_spec, fraction * warm_timeout, False, scratch)
    for i, (net, spec, timeout) in enumerate(instances):
        row = run_instance(net, spec, fraction * timeout, i % 2 == 1, scratch)
        rows.append({"suite": suite, **row})
        with open(partial, "a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
        check = row.get("check", {})
        print(
            f"[{suite} {i + 1}/{len(instances)}] {net.name} {spec.name}: plain "
            f"{row['plain']['status']} {row['plain']['seconds']:.2f} s, certified "
            f"{row['certified']['status']} {row['certified']['seconds']:.2f} s, check "
            f"{_fmt(check.get('seconds'), '.2f')} s {check.get('valid', '')}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="all", choices=(*SUITES, "all"))
    parser.add_argument("--limit", type=int)
    parser.add_argument("--every", type=int, default=1, help="every k-th instance only")
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=RESULTS / "certificates")
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"the shared data folder {DATA} is absent")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    for suite in SUITES if args.suite == "all" else (args.suite,):
        name = f"certificates_{suite}{'_' + args.tag if args.tag else ''}"
        scratch = Path(tempfile.mkdtemp(prefix="certificates_"))
        partial = args.out / f"{name}.partial.jsonl"
        partial.unlink(missing_ok=True)
        try:
            rows = run_suite(suite, args.fraction, args.limit, args.every, scratch, partial)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        partial.unlink()
        summary = summarize(rows)
        text = markdown({suite: summary}, command, stamp)
        print(text)
        (args.out / f"{name}.md").write_text(text)
        payload = {"meta": {"command": command, "date": stamp, "fraction": args.fraction,
                            "limit": args.limit, "every": args.every}, "summary": summary, "rows": rows}  # fmt: skip
        (args.out / f"{name}.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
