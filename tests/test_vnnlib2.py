"""Tests of the VNN-LIB 2.0 reader `verify.io.vnnlib2` (needs the optional package ``vnnlib``).

Exact boxes and polytopes of handwritten 2.0 properties (row-major flattening of tensors, nested
and/or, ``==``, strict comparisons, scalar tensors, gzip, CRLF), the same spec as the 1.0 reader
on hand translations of 1.0 properties, and errors with path and line for unsupported or
malformed files.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from tests.bad_inputs.conftest import line_of, no_side_effects, raises_where
from verify.errors import SpecificationError
from verify.io.vnnlib import MAX_TERMS, parse_vnnlib

pytest.importorskip("vnnlib", reason="the optional package vnnlib (VNN-LIB 2.0 parser) is absent")

from tests.test_vnnlib import _assert_same
from verify.io.vnnlib2 import MAX_DEPTH, is_vnnlib2, load_vnnlib2

V2 = "(vnnlib-version <2.0>)\n"


def _net(x_shape: str, y_shape: str, name: str = "N") -> str:
    return (
        f"(declare-network {name}\n  (declare-input X float32 {x_shape})\n"
        f"  (declare-output Y float32 {y_shape})\n)\n"
    )


def _write(tmp_path: Path, text: str, name: str = "prop.vnnlib") -> Path:
    path = tmp_path / name
    path.write_text(text, newline="")
    return path


# ------------------------------------------------------------------------------- exact values


def test_matrix_input_is_flattened_row_major(tmp_path: Path) -> None:
    box = " ".join(
        f"(<= X[{i},{j}] {1.0 + 3 * i + j}) (>= X[{i},{j}] {-1.0 - 3 * i - j})"
        for i in range(2)
        for j in range(3)
    )
    text = (
        V2
        + _net("[2,3]", "[2]")
        + f"(assert (and {box}))\n"
        + "(assert (or (<= Y[0] (* 2.0 Y[1]))\n"
        + "            (and (>= Y[1] 3.0) (<= (+ Y[0] X[1,2]) 0.5))))\n"
    )
    spec = load_vnnlib2(_write(tmp_path, text))
    assert (spec.n_inputs, spec.n_outputs) == (6, 2)
    assert spec.path == str(tmp_path / "prop.vnnlib")
    (region,) = spec.regions
    np.testing.assert_array_equal(region.upper, [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(region.lower, [-1, -2, -3, -4, -5, -6])
    first, second = region.unsafe
    np.testing.assert_array_equal(first.A, [[1.0, -2.0]])
    np.testing.assert_array_equal(first.b, [0.0])
    assert first.A_x is None
    np.testing.assert_array_equal(second.A, [[0.0, -1.0], [1.0, 0.0]])
    np.testing.assert_array_equal(second.b, [-3.0, 0.5])
    expected_ax = np.zeros((2, 6))
    expected_ax[1, 5] = 1.0  # X[1,2] is x[1 * 3 + 2]
    np.testing.assert_array_equal(second.A_x, expected_ax)


def test_two_boxes_nested_or_give_two_regions(tmp_path: Path) -> None:
    text = (
        V2
        + _net("[2]", "[3]")
        + "(assert (<= X[1] 1.0))\n(assert (>= X[1] 0.0))\n"
        + "(assert (or (and (>= X[0] 0.0) (<= X[0] 1.0))\n"
        + "            (and (>= X[0] 2.0) (<= X[0] 3.0))))\n"
        + "(assert (or (>= Y[0] Y[1]) (or (>= Y[0] Y[2]) (and (< Y[1] 4.0) (> Y[2] -4.0)))))\n"
    )
    spec = load_vnnlib2(_write(tmp_path, text))
    assert len(spec.regions) == 2
    for region, (lo, hi) in zip(spec.regions, [(0.0, 1.0), (2.0, 3.0)]):
        np.testing.assert_array_equal(region.lower, [lo, 0.0])
        np.testing.assert_array_equal(region.upper, [hi, 1.0])
        assert [p.A.tolist() for p in region.unsafe] == [
            [[-1.0, 1.0, 0.0]],
            [[-1.0, 0.0, 1.0]],
            [[0.0, 1.0, 0.0], [0.0, 0.0, -1.0]],
        ]
        assert [p.b.tolist() for p in region.unsafe] == [[0.0], [0.0], [4.0, 4.0]]


def test_scalar_tensors_equality_and_gzip(tmp_path: Path) -> None:
    text = (
        V2
        + _net("[]", "[]")
        + "(assert (<= X 2.5))\n(assert (>= X -0.5))\n(assert (== (- Y (* 3.0 X)) 1.0))\n"
    )
    path = tmp_path / "prop.vnnlib.gz"
    path.write_bytes(gzip.compress(text.encode()))
    spec = load_vnnlib2(path)
    assert (spec.n_inputs, spec.n_outputs) == (1, 1)
    (region,) = spec.regions
    assert region.lower.tolist() == [-0.5] and region.upper.tolist() == [2.5]
    (poly,) = region.unsafe
    assert poly.A.tolist() == [[1.0], [-1.0]]
    assert poly.A_x.tolist() == [[-3.0], [3.0]]
    assert poly.b.tolist() == [1.0, -1.0]
    assert poly.contains([7.0], x=[2.0]) and not poly.contains([7.5], x=[2.0])


# --------------------------------------------------------------- same spec as the 1.0 reader

ACAS_LIKE_10 = """
(declare-const X_0 Real)
(declare-const X_1 Real)
(declare-const X_2 Real)
(declare-const X_3 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(declare-const Y_2 Real)
(assert (<= X_0 0.68))
(assert (>= X_0 0.6))
(assert (and (<= X_1 0.5) (>= X_1 -0.5)))
(assert (<= X_3 0.25))
(assert (>= X_3 -0.25))
(assert (or (and (<= X_2 -0.1) (>= X_2 -0.4)) (and (<= X_2 0.4) (>= X_2 0.1))))
(assert (<= (+ X_0 (* -2.0 X_1)) 0.75))
(assert (or
    (and (<= Y_0 Y_1) (<= Y_0 (- Y_2 0.125)))
    (and (>= Y_1 Y_0) (or (<= (* 0.5 Y_2) -1.5) (= Y_1 (+ Y_2 3.0))))
))
"""


def _to_v2(text: str, x_shape: str, y_shape: str, index) -> str:
    """The 1.0 text with declarations replaced and X_i / Y_j renamed to ``index(kind, i)``."""
    body = "\n".join(line for line in text.splitlines() if "declare-const" not in line)
    for kind in ("X", "Y"):
        for i in reversed(range(4)):
            body = body.replace(f"{kind}_{i}", index(kind, i))
    return V2 + _net(x_shape, y_shape) + body.replace("(= ", "(== ") + "\n"


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "index"),
    [
        ("[4]", "[3]", lambda kind, i: f"{kind}[{i}]"),
        ("[2,2]", "[1,3,1]", lambda k, i: f"X[{i // 2},{i % 2}]" if k == "X" else f"Y[0,{i},0]"),
    ],
    ids=["vectors", "tensors"],
)
def test_hand_translation_matches_the_10_reader(tmp_path: Path, x_shape, y_shape, index) -> None:
    v1 = parse_vnnlib(ACAS_LIKE_10, path="acas.vnnlib")
    v2 = load_vnnlib2(_write(tmp_path, _to_v2(ACAS_LIKE_10, x_shape, y_shape, index)))
    assert len(v1.regions) == 2 and sum(len(r.unsafe) for r in v1.regions) == 6
    _assert_same(v2, v1)


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_crlf_and_comments_keep_lines(tmp_path: Path, newline: str) -> None:
    text = (
        V2 + _net("[1]", "[1]") + "; comment (((\n(assert (<= X[0] 1.0))\n(assert (!= Y[0] 0.0))\n"
    )
    path = _write(tmp_path, text.replace("\n", newline))
    with raises_where(SpecificationError, str(path), "not supported", "'!='") as info:
        load_vnnlib2(path)
    assert line_of(str(info.value)) == 8
    assert info.value.line == 8 and info.value.path == str(path)


def test_is_vnnlib2_detects_the_version_or_network_form() -> None:
    assert is_vnnlib2(V2 + _net("[1]", "[1]"))
    assert is_vnnlib2("; no version\n( declare-network N (declare-input X float32 [1]))")
    assert is_vnnlib2("(assert (<= X_0 1.0))(declare-network N)")
    assert not is_vnnlib2(ACAS_LIKE_10)
    assert not is_vnnlib2("; (declare-network in a comment is not enough\n(assert (<= X_0 1))")


# ----------------------------------------------------------------------------------- errors

BOX = "(assert (<= X[0] 1.0))\n(assert (>= X[0] 0.0))\n"
TWO_NETS = (
    V2
    + _net("[1]", "[1]")
    + "(declare-network M (declare-input A float32 [1]) (declare-output B float32 [1]))\n"
    + BOX
    + "(assert (<= Y[0] B[0]))\n"
)
TWO_INPUTS = (
    V2
    + "(declare-network N (declare-input X float32 [1]) (declare-input Z float32 [1])\n"
    + "  (declare-output Y float32 [1]))\n"
    + BOX
    + "(assert (<= Y[0] Z[0]))\n"
)
HIDDEN = (
    V2
    + '(declare-network N (declare-input X float32 [1]) (declare-hidden H float32 [1] "h")\n'
    + "  (declare-output Y float32 [1]))\n"
    + BOX
    + "(assert (<= Y[0] H[0]))\n"
)
HEAD = V2 + _net("[1]", "[2]")  # lines 1-5; BOX lines 6-7, the next assert is line 8
BLOWUP = "(assert (and " + " ".join(f"(or (<= Y[0] {i}.0) (<= Y[1] {i}.0))" for i in range(18))

BAD = [
    ("two-networks-one-unbounded", TWO_NETS, ("input A[0] has no lower bound",), 9),
    ("two-inputs", TWO_INPUTS, ("not supported", "2 inputs and 1 outputs"), None),
    ("hidden", HIDDEN, ("not supported", "hidden"), 2),
    (
        "int-tensor",
        HEAD.replace("X float32", "X int8") + BOX.replace(".0", "") + "(assert (<= Y[0] 1.0))\n",
        ("not supported", "tensor X of type I8"),
        None,
    ),
    (
        "nonlinear",
        HEAD + BOX + "(assert (<= (* Y[0] Y[1]) 1.0))\n",
        ("not supported", "Non-linear"),
        8,
    ),
    (
        "not-equal",
        HEAD + BOX + "(assert (or (<= Y[0] 0.0)\n (!= Y[1] 0.0)))\n",
        ("not supported", "'!='"),
        9,
    ),
    ("syntax", HEAD + BOX + "(assert (<= Y[0] 1.0 2.0))\n", ("syntax error",), 8),
    ("unclosed", HEAD + BOX + "(assert (<= Y[0] 1.0)\n", ("syntax error",), 8),
    ("no-version", _net("[1]", "[2]") + BOX + "(assert (<= Y[0] 1.0))\n", ("syntax error",), 1),
    ("type-mismatch", HEAD + BOX + "(assert (<= Y[0] 1))\n", ("Type mismatch", "'1'"), 8),
    ("undeclared", HEAD + BOX + "\n(assert (<= Z[0] 1.0))\n", ("Undeclared variable", "'Z'"), 9),
    ("out-of-bounds", HEAD + BOX + "(assert (<= Y[2] 1.0))\n", ("out of bounds", "Y[2]"), 8),
    (
        "no-upper-bound",
        HEAD + "(assert (>= X[0] 0.0))\n(assert (<= Y[0] 1.0))\n",
        ("input X[0] has no upper bound",),
        7,
    ),
    (
        "empty-box",
        HEAD + "(assert (<= X[0] 0.0))\n(assert (>= X[0] 1.0))\n(assert (<= Y[0] 1.0))\n",
        ("empty input box", "X[0]"),
        7,
    ),
    ("no-output", HEAD + BOX, ("no constraint on the output Y",), 7),
    ("no-assert", HEAD, ("syntax error",), 5),
    (
        "only-a-true-constant-on-outputs",
        HEAD + BOX + "(assert (<= 1.0 2.0))\n",
        ("no constraint on the output Y",),
        8,
    ),
    ("dnf-too-large", HEAD + BOX + BLOWUP + "))\n", (f"more than {MAX_TERMS} terms",), 8),
    (
        "too-deep",
        HEAD
        + BOX
        + "(assert "
        + "(and " * MAX_DEPTH
        + "(<= Y[0] 1.0)"
        + ")" * (MAX_DEPTH + 1)
        + "\n",
        ("not supported", f"deeper than {MAX_DEPTH}"),
        8,
    ),
    (
        "nul-char",
        HEAD + BOX + "(assert (<= Y[0] 1.0))\n\x00(assert (<= Y[1] 1.0))\n",
        ("NUL character",),
        9,
    ),
    (
        "huge-constant",
        HEAD + BOX + "(assert (<= Y[0] " + "1" * 400 + ".0))\n",
        ("parser failed", "float64 range"),
        None,
    ),
    ("empty-file", "", ("file is empty",), None),
    ("blank-file", "\n ; only a comment\n", ("syntax error",), 2),
    ("not-utf8", None, ("not UTF-8",), 1),
]


@pytest.mark.parametrize(
    ("text", "fragments", "line"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_bad_files_raise_with_path_and_line(tmp_path: Path, text, fragments, line) -> None:
    path = tmp_path / "bad.vnnlib"
    if text is None:
        path.write_bytes(b"(vnnlib-version <2.0>) \xff\n")
    else:
        _write(tmp_path, text, path.name)
    with no_side_effects(tmp_path), raises_where(SpecificationError, str(path), *fragments) as info:
        load_vnnlib2(path)
    assert info.value.path == str(path)
    assert info.value.line == line
    assert line_of(str(info.value)) == line


def test_missing_file_and_bad_path_type(tmp_path: Path) -> None:
    missing = tmp_path / "absent.vnnlib"
    with raises_where(SpecificationError, str(missing), "no such file"):
        load_vnnlib2(missing)
    with raises_where(SpecificationError, "expected a file path, got int"):
        load_vnnlib2(3)


def test_load_vnnlib_reads_a_20_file_through_the_20_reader(tmp_path: Path) -> None:
    """`verify.load_vnnlib` (the one entry point of `verify.verify` and the CLI) dispatches 2.0
    files, also gzipped, and keeps reading 1.0 files with the 1.0 reader."""
    from verify.io.vnnlib_load import load_vnnlib

    text = _to_v2(ACAS_LIKE_10, "[4]", "[3]", lambda kind, i: f"{kind}[{i}]")
    path = _write(tmp_path, text)
    _assert_same(load_vnnlib(path), load_vnnlib2(path))
    gz = tmp_path / "prop.vnnlib.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    _assert_same(load_vnnlib(gz), parse_vnnlib(ACAS_LIKE_10, path="acas.vnnlib"))
    plain = _write(tmp_path, ACAS_LIKE_10, "v1.vnnlib")
    _assert_same(load_vnnlib(plain), parse_vnnlib(ACAS_LIKE_10, path="acas.vnnlib"))


def test_constant_comparisons_hold_or_empty_the_unsafe_set(tmp_path: Path) -> None:
    """A comparison of constants (or of cancelling terms) that holds is dropped; one that
    does not makes its conjunction false: alone, the unsafe set is empty (no region)."""
    text = HEAD + BOX + "(assert (<= (- X[0] X[0]) (* 2.0 0.5)))\n(assert (<= Y[0] 1.0))\n"
    prop = load_vnnlib2(_write(tmp_path, text))
    assert len(prop.regions) == 1 and prop.regions[0].unsafe[0].A.shape == (1, 2)
    either = HEAD + BOX + "(assert (or (<= 3.0 2.0) (<= Y[1] 1.0)))\n"
    (poly,) = load_vnnlib2(_write(tmp_path, either)).regions[0].unsafe
    assert poly.A.tolist() == [[0.0, 1.0]]
    never = HEAD + BOX + "(assert (<= Y[0] 1.0))\n(assert (>= (+ 1.0 1.0) 3.0))\n"
    assert load_vnnlib2(_write(tmp_path, never)).regions == ()


STANDARD = Path(__file__).resolve().parents[2] / "shared" / "data" / "vnnlib2"
STANDARD_FILES = {  # file: None (read) or (fragment of the refusal, line)
    "acc.vnnlib": None,
    "single_network.vnnlib": None,
    "initialized.vnnlib": ("'initialized' input", 4),
    "intermediate_nodes.vnnlib": ("hidden tensors (declare-hidden)", 4),
    "multiple_networks.vnnlib": ("input E[0] has no lower bound", 47),  # AcasZu's input
    "test_linearise.vnnlib": ("empty input box: X[0]", 26),
}


@pytest.mark.skipif(not STANDARD.exists(), reason="../shared/data/vnnlib2 is absent")
@pytest.mark.parametrize("name", sorted(STANDARD_FILES))
def test_the_standards_own_files_are_read_or_refused_with_file_and_line(name: str) -> None:
    path = STANDARD / name
    expected = STANDARD_FILES[name]
    if expected is None:
        prop = load_vnnlib2(path)
        assert prop.n_inputs == 3 and prop.regions
        return
    with raises_where(SpecificationError, str(path), expected[0]) as info:
        load_vnnlib2(path)
    assert info.value.line == expected[1]


@pytest.mark.skipif(not STANDARD.exists(), reason="../shared/data/vnnlib2 is absent")
def test_acc_scalar_output_and_linear_input_row() -> None:
    """`Y` declared `[]` is output 0; `(+ (* -1.5 X[1]) X[2]) <= -15` is a row over the inputs
    (`A_x`) in every polytope; the box comes from the single-input bounds."""
    prop = load_vnnlib2(STANDARD / "acc.vnnlib")
    (region,) = prop.regions
    assert prop.n_outputs == 1
    assert region.lower.tolist() == [0.0, -50.0, 0.0] and region.upper.tolist() == [50, 50, 150]
    for poly in region.unsafe:
        assert poly.A_x is not None and [0.0, -1.5, 1.0] in poly.A_x.tolist()
        assert -15.0 in poly.b.tolist()
