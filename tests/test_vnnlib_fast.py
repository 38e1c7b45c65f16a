"""The 1.0 reader's fast path for `(<= V c)` / `(>= V c)` (`verify.io.vnnlib._bound`) reads
every file exactly as the token-by-token path does: the same regions, bit for bit, and the
same errors at the same lines."""

from __future__ import annotations

from pathlib import Path

import pytest

import verify.io.vnnlib as vnnlib
from verify.errors import SpecificationError
from verify.io.vnnlib_common import read_text

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def both(text: str, monkeypatch: pytest.MonkeyPatch):
    """`(fast, slow)`: the property, or the error message, of each path."""
    out = []
    for fast in (True, False):
        monkeypatch.setattr(vnnlib, "FAST_COMPARISONS", fast)
        try:
            out.append(vnnlib.parse_vnnlib(text, "p.vnnlib"))
        except SpecificationError as error:
            out.append(str(error))
    return out


def same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if (a.n_inputs, a.n_outputs, len(a.regions)) != (b.n_inputs, b.n_outputs, len(b.regions)):
        return False
    for ra, rb in zip(a.regions, b.regions):
        arrays = [(ra.lower, rb.lower), (ra.upper, rb.upper)]
        if len(ra.unsafe) != len(rb.unsafe):
            return False
        arrays += [(p.A, q.A) for p, q in zip(ra.unsafe, rb.unsafe)]
        arrays += [(p.b, q.b) for p, q in zip(ra.unsafe, rb.unsafe)]
        for x, y in arrays:
            if x.shape != y.shape or x.tobytes() != y.tobytes():  # bits: -0.0 != 0.0
                return False
    return True


HEAD = "(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n"
BOX = "(assert (>= X_0 -1))\n(assert (<= X_0 1))\n(assert (>= X_1 0.0))\n(assert (<= X_1 2e0))\n"


@pytest.mark.parametrize(
    "body",
    [
        BOX + "(assert (<= Y_0 -0.0))",
        BOX + "(assert (or (and (<= Y_0 1) (>= Y_0 0.5)) (>= Y_0 3)))",
        BOX + "(assert (>= 1 Y_0))",  # number first: the general path
        BOX + "(assert (<= Y_0 1e400))",  # overflow: the general path's error
        BOX + "(assert (<= Z_0 1))",  # undeclared
        BOX + "(assert (<= Y_0 1) (<= Y_0 2))",  # two formulas in one assert
        BOX + "(assert (<= Y_0 nan))",
        BOX + "(<= Y_0 1)",  # outside an assert
        BOX + "(assert (+ (<= Y_0 1)))",  # inside a term
        BOX + "(assert (or\n(<= Y_0 1)\n(  >=   Y_0   +2.5e-3  )))",
        "(assert (<= X_0 1))\n" + HEAD + BOX + "(assert (<= Y_0 1))",  # used before declared
    ],
)
def test_edge_cases_read_alike(body: str, monkeypatch: pytest.MonkeyPatch):
    fast, slow = both(HEAD + body if not body.startswith("(assert (<= X_0") else body, monkeypatch)
    assert same(fast, slow), (fast, slow)


def _files() -> list[Path]:
    files = sorted(DATA.glob("vnncomp202*/**/*.vnnlib*"))
    return [f for f in files if f.stat().st_size < 100_000][::7]  # a sample, of small files


@pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is absent (real VNN-LIB files)")
def test_real_files_read_alike(monkeypatch: pytest.MonkeyPatch):
    files = _files()
    assert len(files) >= 20
    for path in files:
        _, text = read_text(path)
        fast, slow = both(text, monkeypatch)
        assert same(fast, slow), path
