"""Reading and writing certificate files (format v2, see the package docstring): a zip of `.npy`
members, appended batch by batch, and a `manifest.json` member written when the search ends."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

FORMAT, VERSION = "ldverify-certificate", 2


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of the file's bytes (as stored: a `.gz` file is hashed compressed)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class CertificateWriter:
    """Appends batches of records to `path` (created empty); `finish` writes the manifest."""

    def __init__(self, path: str | os.PathLike, network_sha256: str, property_sha256: str) -> None:
        self.path, self.batches = os.fspath(path), 0
        self.hashes = {"network_sha256": network_sha256, "property_sha256": property_sha256}
        with zipfile.ZipFile(self.path, "w"):
            pass

    def append(self, members: dict[str, np.ndarray]) -> None:
        """One batch: each array as member `b{batch}_{name}.npy`."""
        with zipfile.ZipFile(self.path, "a", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for name, array in members.items():
                buffer = io.BytesIO()
                np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
                zf.writestr(f"b{self.batches}_{name}.npy", buffer.getvalue())
        self.batches += 1

    def finish(self, answer: str, regions: int, extra: dict[str, Any] | None = None) -> None:
        manifest = {"format": FORMAT, "version": VERSION, **self.hashes, "answer": answer,
                    "regions": regions, "batches": self.batches, **(extra or {})}  # fmt: skip
        with zipfile.ZipFile(self.path, "a") as zf:
            zf.writestr("manifest.json", json.dumps(manifest, indent=1))


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("manifest.json"))


def read_batches(path: str | os.PathLike, batches: int) -> Iterator[dict[str, np.ndarray]]:
    """Yields each batch's members `{name: array}` (one batch in memory at a time)."""
    with np.load(path, allow_pickle=False) as npz:
        names = set(npz.files)
        for b in range(batches):
            prefix = f"b{b}_"
            yield {n[len(prefix) :]: npz[n] for n in names if n.startswith(prefix)}
