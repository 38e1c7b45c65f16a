"""Certificates of ReLU splitting on VNN-COMP mnist_fc (issue 26): per instance, the answer
without a certificate (default settings: `plain`; certificate mode's settings without writing:
`same`) and with one (`cert`), each within `scale` of the timeout, best of `repeat` runs (the
shortest solved one: the machine is shared), the certificate's size, splits and leaves, and
the independent check's answer and time. One torch thread.

    python -m benchmarks.relu_certificates DATA_DIR [--scale 0.05] [--match 256x2] [--out CSV]
        [--repeat 2]
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import tempfile
import time

import numpy as np
import torch

import verify
from verify.bab.relu.certify import relu_certificate_config
from verify.certificate import check_certificate

FIELDS = ["network", "property", "plain", "plain_s", "same", "same_s", "cert", "cert_s",
          "size_kb", "splits", "leaves", "check", "check_s"]  # fmt: skip


def counts(cert: pathlib.Path) -> tuple[int, int]:
    """(ReLU splits, leaves) stored in the certificate."""
    with np.load(cert) as npz:
        splits = sum(len(npz[n]) for n in npz.files if n.endswith("relu_split_ints"))
        leaves = sum(len(npz[n]) for n in npz.files if n.endswith("leaf_ints"))
    return splits, leaves


def best(run, repeat: int) -> verify.VerificationResult:
    """The best of `repeat` runs: the fastest with an answer, else the last."""
    results = [run() for _ in range(repeat)]
    solved = [r for r in results if r.status in ("sat", "unsat")]
    return min(solved, key=lambda r: r.seconds) if solved else results[-1]


def one(root: pathlib.Path, net: str, prop: str, seconds: float, work: pathlib.Path,
        repeat: int) -> dict:  # fmt: skip
    """One instance's row (`FIELDS`)."""
    net_path, prop_path = root / (net + ".gz"), root / (prop + ".gz")
    row: dict = {"network": net, "property": prop}
    same = relu_certificate_config(verify.BabConfig())
    for name, config in (("plain", None), ("same", same)):
        got = best(lambda c=config: verify.verify(net_path, prop_path, timeout=seconds, config=c),
                   repeat)  # fmt: skip
        row |= {name: got.status, f"{name}_s": round(got.seconds, 2)}
    cert = work / "c.cert"
    got = best(lambda: verify.verify(net_path, prop_path, timeout=seconds, certificate=cert),
               repeat)  # fmt: skip
    row |= {"cert": got.status, "cert_s": round(got.seconds, 2)}
    if got.status == "unsat":  # `cert` is the last run's: check it when that one answered
        got = verify.verify(net_path, prop_path, timeout=seconds, certificate=cert)
    if got.status == "unsat":
        tick = time.perf_counter()
        row["check"] = str(check_certificate(net_path, prop_path, cert))
        row["check_s"] = round(time.perf_counter() - tick, 2)
        row["size_kb"] = round(os.path.getsize(cert) / 1024, 1)
        row["splits"], row["leaves"] = counts(cert)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=pathlib.Path)
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--match", default="")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open(args.data / "instances.csv") as f:
        rows = [r for r in csv.reader(f) if r and args.match in r[0]]
    out = []
    with tempfile.TemporaryDirectory() as work:
        net, prop, _ = rows[0]  # warm-up (the first call of a process pays one-time costs)
        verify.verify(args.data / (net + ".gz"), args.data / (prop + ".gz"), timeout=30)
        for net, prop, timeout in rows:
            row = one(args.data, net, prop, float(timeout) * args.scale, pathlib.Path(work),
                      args.repeat)  # fmt: skip
            print(",".join(str(row.get(k, "")) for k in FIELDS), flush=True)
            out.append(row)
    if args.out is not None:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            writer.writerows(out)


if __name__ == "__main__":
    main()
