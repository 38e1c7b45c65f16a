"""Certificates of ReLU splitting on VNN-COMP mnist_fc (issue 26): per instance, the answer
without and with a certificate (`scale` of the timeout each), the certificate's size, splits
and leaves, and the independent check's answer and time.

    python -m benchmarks.relu_certificates DATA_DIR [--scale 0.05] [--match 256x2] [--out CSV]
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import tempfile
import time

import numpy as np

import verify
from verify.certificate import check_certificate

FIELDS = ["network", "property", "plain", "plain_s", "cert", "cert_s", "size_kb", "splits",
          "leaves", "check", "check_s"]  # fmt: skip


def counts(cert: pathlib.Path) -> tuple[int, int]:
    """(ReLU splits, leaves) stored in the certificate."""
    with np.load(cert) as npz:
        splits = sum(len(npz[n]) for n in npz.files if n.endswith("relu_split_ints"))
        leaves = sum(len(npz[n]) for n in npz.files if n.endswith("leaf_ints"))
    return splits, leaves


def one(root: pathlib.Path, net: str, prop: str, seconds: float, work: pathlib.Path) -> dict:
    """One instance's row (`FIELDS`)."""
    net_path, prop_path = root / (net + ".gz"), root / (prop + ".gz")
    row: dict = {"network": net, "property": prop}
    plain = verify.verify(net_path, prop_path, timeout=seconds)
    row |= {"plain": plain.status, "plain_s": round(plain.seconds, 2)}
    cert = work / "c.cert"
    got = verify.verify(net_path, prop_path, timeout=seconds, certificate=cert)
    row |= {"cert": got.status, "cert_s": round(got.seconds, 2)}
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
    args = parser.parse_args()
    with open(args.data / "instances.csv") as f:
        rows = [r for r in csv.reader(f) if r and args.match in r[0]]
    out = []
    with tempfile.TemporaryDirectory() as work:
        for net, prop, timeout in rows:
            row = one(args.data, net, prop, float(timeout) * args.scale, pathlib.Path(work))
            print(",".join(str(row.get(k, "")) for k in FIELDS), flush=True)
            out.append(row)
    if args.out is not None:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            writer.writerows(out)


if __name__ == "__main__":
    main()
