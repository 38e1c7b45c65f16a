"""Bad VNN-LIB files: each raises `SpecificationError` naming the file (and the line where one
applies), with no other exception type, and nothing is written."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.bad_inputs.conftest import no_side_effects, raises_where
from verify.errors import SpecificationError
from verify.io import vnnlib_common as vnnlib
from verify.io.vnnlib import MAX_TERMS, parse_vnnlib
from verify.io.vnnlib_load import load_vnnlib

DECLS = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n"  # lines 1-2
BOX = "(assert (>= X_0 0))\n(assert (<= X_0 1))\n"  # lines 3-4
OUT = "(assert (<= Y_0 0))\n"  # line 5
VALID = DECLS + BOX + OUT


class Case(NamedTuple):
    make: Callable[[Path], Path]  # writes the file under tmp_path, returns the path to load
    line: int | None  # expected line in `path:LINE:`, None for file-level errors
    fragment: str  # the "what" of the message
    limits: tuple[tuple[str, int], ...] = ()  # module limits lowered for the case


def file(data: str | bytes, name: str = "bad.vnnlib") -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    return make


def gz(data: str, name: str = "bad.vnnlib.gz") -> Callable[[Path], Path]:
    return file(gzip.compress(data.encode()), name)


def directory(folder: Path) -> Path:
    (folder / "dir.vnnlib").mkdir()
    return folder / "dir.vnnlib"


def fifo(folder: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    os.mkfifo(folder / "pipe.vnnlib")
    return folder / "pipe.vnnlib"


def with_endings(text: str, ending: str) -> str:
    return text.replace("\n", ending)


NESTED = 5000
DEEP_AND = DECLS + BOX + "(assert\n" + "(and " * NESTED + "\n(<= Y_0 bad)" + ")" * (NESTED + 1)
DEEP_TERM = DECLS + BOX + "(assert (<= Y_0\n" + "(- " * NESTED + "\n(max Y_0 1)" + ")" * NESTED
BLOW_UP = DECLS + BOX + "(assert (or (<= Y_0 0) (<= Y_0 1)))\n" * 18  # 2**18 > MAX_TERMS

CASES: dict[str, Case] = {
    # ------------------------------------------------------------------ file level (no line)
    "missing_file": Case(lambda d: d / "absent.vnnlib", None, "no such file"),
    "directory": Case(directory, None, "is a directory"),
    "named_pipe": Case(fifo, None, "not a regular file"),
    "nul_in_path": Case(lambda d: Path(f"{d}/a\0b.vnnlib"), None, "cannot read"),
    "empty_file": Case(file(b""), None, "file is empty"),
    "whitespace_only": Case(file(" \r\n\t\n"), None, "empty specification"),
    "gzip_magic_over_garbage": Case(file(b"\x1f\x8b" + b"garbage" * 9), None, "gzip"),
    "gzip_truncated": Case(file(gzip.compress(VALID.encode())[:-12], "t.vnnlib.gz"), None, "gzip"),
    "gz_suffix_plain_text": Case(file(VALID, "plain.vnnlib.gz"), None, "not a valid gzip"),
    "empty_after_gunzip": Case(gz(""), None, "empty specification"),
    "file_too_large": Case(file(VALID), None, "larger than 64 bytes", (("MAX_BYTES", 64),)),
    "gzip_bomb": Case(gz(VALID + " " * 5000), None, "decompresses to more", (("MAX_BYTES", 200),)),
    # ------------------------------------------------------------ encoding and line endings
    "not_utf8": Case(file(DECLS.encode() + b"(assert (>= X_0 \xff0))\n"), 3, "not UTF-8"),
    "not_utf8_cr_only": Case(file(with_endings(DECLS + BOX, "\r").encode() + b"\xc3("), 5, "UTF-8"),
    "not_utf8_crlf": Case(file(with_endings(DECLS, "\r\n").encode() + b"\xed\xa0\x80"), 3, "UTF-8"),
    "error_after_cr_only_comment": Case(
        file(with_endings(DECLS + "; box\n" + BOX + "(assert (<= Y_0 Y_9))\n", "\r")),
        6,
        "undeclared variable 'Y_9'",
    ),
    "error_after_mixed_endings": Case(
        file("(declare-const X_0 Real)\r\n(declare-const Y_0 Real)\r; c\n\n(assert (<= X_0 nan))"),
        5,
        "not a finite number",
    ),
    "nul_byte_in_number": Case(file(DECLS + BOX + "(assert (<= Y_0 0\0))\n"), 5, "non-numeric"),
    # ------------------------------------------------------------------------ parentheses
    "unbalanced_close": Case(file(DECLS + BOX + "(assert (<= Y_0 0)))\n"), 5, "unbalanced ')'"),
    "unclosed_open": Case(file(DECLS + BOX + "(assert (<= Y_0\n0)\n\n"), 5, "unclosed '('"),
    "close_before_anything": Case(file(")\n" + VALID), 1, "unbalanced ')'"),
    "deep_unclosed": Case(file(DECLS + "(assert " + "(and " * 20_000), 3, "unclosed '('"),
    "nested_too_deep": Case(
        file(DECLS + BOX + "(assert\n" + "(and " * 60),
        6,
        "nested deeper than 50",
        (("MAX_DEPTH", 50),),
    ),
    "deep_and_with_error_at_bottom": Case(file(DEEP_AND), 7, "undeclared variable 'bad'"),
    "deep_term_with_error_at_bottom": Case(file(DEEP_TERM), 7, "unknown operator 'max'"),
    "bare_atom_at_top": Case(file(VALID + "assert\n"), 6, "outside ( )"),
    "empty_list_at_top": Case(file(VALID + "()\n"), 6, "expected a command"),
    # ------------------------------------------------------------------------ declarations
    "comments_only": Case(file("; nothing\n; here\n"), 2, "no X_i variable declared"),
    "no_output_declared": Case(file("(declare-const X_0 Real)\n" + BOX), 3, "no Y_i variable"),
    "declared_twice": Case(file(DECLS + "(declare-const Y_0 Real)\n"), 3, "declared twice"),
    "index_gap": Case(file(DECLS + "(declare-const X_2 Real)\n" + BOX + OUT), 3, "missing declara"),
    "index_out_of_range": Case(file(DECLS + "(declare-const Y_1234567890 Real)\n"), 3, "not named"),
    "leading_zero_index": Case(file(DECLS + "(declare-const Y_01 Real)\n"), 3, "not named X_i"),
    "declare_int": Case(file("(declare-const X_0 Int)\n"), 1, "expected (declare-const NAME Real)"),
    "declare_nested": Case(file("(declare-const (X_0) Real)\n"), 1, "expected (declare-const"),
    "use_before_declaration": Case(
        file("(declare-const X_0 Real)\n" + BOX + OUT + "(declare-const Y_0 Real)\n"),
        4,
        "undeclared variable 'Y_0'",
    ),
    "assert_on_undeclared_input": Case(file(VALID + "(assert (<= X_1 0))\n"), 6, "undeclared"),
    "unknown_command": Case(file(VALID + "(define-fun f () Real 1)\n"), 6, "unknown command"),
    # ------------------------------------------------------------------ formulas and terms
    "assert_without_formula": Case(file(VALID + "(assert)\n"), 6, "exactly one formula"),
    "assert_two_formulas": Case(
        file(DECLS + BOX + "(assert (<= Y_0 0) (>= Y_0 1))\n"), 5, "exactly one formula"
    ),
    "assert_atom": Case(file(VALID + "(assert true)\n"), 6, "expected a formula"),
    "unknown_connective": Case(file(DECLS + BOX + "(assert (not (<= Y_0 0)))\n"), 5, "'not'"),
    "and_without_arguments": Case(file(VALID + "(assert (and))\n"), 6, "without arguments"),
    "comparison_one_argument": Case(file(VALID + "(assert (<= Y_0))\n"), 6, "two arguments"),
    "constant_comparison": Case(file(VALID + "(assert (<= 0 1))\n"), 6, "without variables"),
    "nonlinear": Case(file(DECLS + BOX + "(assert (<= (* Y_0 Y_0) 1))\n"), 5, "non-linear"),
    "division_by_zero": Case(file(DECLS + BOX + "(assert (<= (/ Y_0 0) 1))\n"), 5, "by zero"),
    "quoted_symbol": Case(file(DECLS + BOX + "(assert (<= |Y_0| 0))\n"), 5, "non-numeric"),
    # ---------------------------------------------------------------------------- numbers
    "nan_constant": Case(file(DECLS + BOX + "(assert (<= Y_0 NaN))\n"), 5, "not a finite"),
    "inf_constant": Case(file(DECLS + "(assert (>= X_0 -inf))\n"), 3, "not a finite number"),
    "overflowing_literal": Case(file(DECLS + BOX + "(assert (<= Y_0 1e400))\n"), 5, "overflow"),
    "overflowing_product": Case(
        file(DECLS + BOX + "(assert (<= (* 1e300 1e300 Y_0) 0))\n"), 5, "arithmetic overflow"
    ),
    "overflowing_difference": Case(
        file(DECLS + BOX + "(assert (<= (+ Y_0 1.7e308) -1.7e308))\n"), 5, "arithmetic overflow"
    ),
    "overflowing_bound": Case(
        file(DECLS + "(assert (<= (* 1e-300 X_0) 1e300))\n(assert (>= X_0 0))\n" + OUT),
        3,
        "bound on X_0 overflows",
    ),
    "non_numeric_exponent": Case(file(DECLS + BOX + "(assert (<= Y_0 1e))\n"), 5, "non-numeric"),
    "unicode_digit": Case(file(DECLS + BOX + "(assert (<= Y_0 ٣))\n"), 5, "non-numeric"),
    # ------------------------------------------------------------------ boxes and unsafe set
    "empty_box": Case(file(DECLS + "(assert (>= X_0 2))\n(assert (<= X_0 1))\n" + OUT), 4, "empty"),
    "empty_box_in_or": Case(
        file(DECLS + BOX + "(assert (or (>= X_0 5) (<= Y_0 0)))\n"), 5, "empty"
    ),
    "missing_upper_bound": Case(file(DECLS + "(assert (>= X_0 0))\n" + OUT), 1, "no upper bound"),
    "no_output_constraint": Case(file(DECLS + BOX + "\n; no Y\n"), 6, "unsafe set is missing"),
    # ----------------------------------------------------------------------------- blow-ups
    "dnf_blow_up": Case(file(BLOW_UP), 22, f"more than {MAX_TERMS} terms"),
    "disjunction_too_long": Case(
        file(DECLS + BOX + "(assert (or\n" + "(<= Y_0 0)" * 101 + "))"),
        5,
        "disjunction has 101 terms",
        (("MAX_DISJUNCTION", 100),),
    ),
    "too_many_steps": Case(
        file(DECLS + BOX + "(assert (<= (+ Y_0 Y_0 Y_0 Y_0 Y_0 Y_0) 1))\n"),
        5,
        "too large to expand",
        (("MAX_STEPS", 4),),
    ),
    "too_many_constraints": Case(
        file(DECLS + BOX + "(assert (or (<= Y_0 0) (<= Y_0 1) (<= Y_0 2)))\n"),
        5,
        "more than 8",
        (("MAX_ENTRIES", 8),),
    ),
}


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_bad_vnnlib_file(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    for limit, value in case.limits:
        monkeypatch.setattr(vnnlib, limit, value)
    path = case.make(tmp_path)
    where = f"{path}:{case.line}: " if case.line is not None else f"{path}: "
    with no_side_effects(tmp_path), raises_where(SpecificationError, where, case.fragment) as info:
        load_vnnlib(path)
    assert (info.value.path, info.value.line) == (str(path), case.line)
    assert str(info.value).count(str(path)) == 1, "the path is named once (no re-wrapping)"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(b"(declare-const X_0 Real)", "expected text (str), got bytes"), (None, "got NoneType")],
    ids=["bytes", "none"],
)
def test_parse_vnnlib_wrong_type(value: object, fragment: str) -> None:
    with raises_where(SpecificationError, "spec.vnnlib: ", fragment):
        parse_vnnlib(value, path="spec.vnnlib")  # type: ignore[arg-type]


def test_load_vnnlib_wrong_path_type(tmp_path: Path) -> None:
    with no_side_effects(tmp_path), raises_where(SpecificationError, "expected a file path"):
        load_vnnlib(3.5)  # type: ignore[arg-type]
