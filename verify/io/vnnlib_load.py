"""`load_vnnlib`: a VNN-LIB file of either version, read once and given to its reader: 2.0
(`verify.io.vnnlib2`) when it has a ``(vnnlib-version`` or ``(declare-network`` form, else 1.0
(`verify.io.vnnlib`). Both readers are below this module; neither imports the other."""

from __future__ import annotations

import os

from verify.io.vnnlib import parse_vnnlib
from verify.io.vnnlib2 import parse_vnnlib2
from verify.io.vnnlib_common import is_vnnlib2, read_text
from verify.property import VnnlibProperty


def load_vnnlib(path: str | os.PathLike, deadline: float | None = None) -> VnnlibProperty:
    """Read a ``.vnnlib`` file of either version, gzip-compressed or not.

    A file with a ``(vnnlib-version`` or ``(declare-network`` form is read as VNN-LIB 2.0
    (the `vnnlib` package, extra ``vnnlib2``), else as 1.0.

    Args:
        path: the file (``.vnnlib`` or ``.vnnlib.gz``; gzip detected by magic bytes or ``.gz``).
        deadline: ``time.monotonic()`` after which reading a 1.0 file stops.

    Returns:
        The `VnnlibProperty`: ``regions``, each a box ``lower``, ``upper`` (``[n_inputs]``,
        float64) with its ``unsafe`` polytopes ``A y + A_x x <= b`` (``A`` ``[m, n_outputs]``).

    Raises:
        SpecificationError: a missing, unreadable or malformed file, named with ``path:line:``.
        ParseDeadlineError: the deadline passed while reading.
    """
    name, text = read_text(path)
    if is_vnnlib2(text):
        return parse_vnnlib2(text, path=name)
    return parse_vnnlib(text, path=name, deadline=deadline)


__all__ = ["load_vnnlib"]
