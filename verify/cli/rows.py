"""The command line's rows: the instances of a VNN-COMP `instances.csv` (`read_instances`, a
bad row reported with its number and skipped), the results CSV (`write_rows`, written through
a rename) and the summary table (`summary`)."""

from __future__ import annotations

import csv
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bounds.errors import VerificationInputError
from verify.result import STATUSES


@dataclass(frozen=True)
class Instance:
    """One row of an instances.csv: names as written, the timeout, the 1-based row number."""

    network: str
    property: str
    timeout: float
    row: int


def read_instances(
    path: Path, limit: int | None = None, errors: TextIO | None = None
) -> list[Instance]:
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
