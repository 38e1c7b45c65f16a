"""Tests of the VNN-LIB 1.0 reader `verify.io.vnnlib`.

Exact values on handwritten strings, the same properties with CRLF / CR / mixed line endings and
comments, deep nesting, known content of ACAS Xu properties, every file of
../shared/data/vnncomp2022, errors with file and line (for every line-ending convention), and a
semantic check against a small independent evaluator of the S-expression. More bad input:
tests/bad_inputs/test_vnnlib.py; property-based tests: tests/test_vnnlib_fuzz.py.
"""

from __future__ import annotations

import csv
import functools
import gzip
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from verify.errors import SpecificationError
from verify.io.vnnlib import MAX_TERMS, VnnlibProperty, parse_vnnlib
from verify.io.vnnlib_load import load_vnnlib

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
VNNCOMP = DATA / "vnncomp2022"


def _decls(n_inputs: int, n_outputs: int) -> str:
    xs = "".join(f"(declare-const X_{i} Real)\n" for i in range(n_inputs))
    return xs + "".join(f"(declare-const Y_{j} Real)\n" for j in range(n_outputs))


@functools.cache
def _load(path: Path) -> VnnlibProperty:
    """Each real file is parsed once per session (several tests read the same files)."""
    return load_vnnlib(path)


def _data_dir(*parts: str) -> Path:
    if not DATA.is_dir():
        pytest.skip(f"{DATA} is absent (shared data not checked out)")
    folder = VNNCOMP.joinpath(*parts)
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    return folder


# ---------------------------------------------------------------- independent reference evaluator


def _sexprs(text: str) -> list:
    tokens = re.findall(r"\(|\)|[^\s()]+", re.sub(r";[^\n]*", "", text))
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    return stack[0]


def _value(term, env: dict[str, float]) -> float:
    if isinstance(term, str):
        return env[term] if term in env else float(term)
    op, *args = term
    vals = [_value(a, env) for a in args]
    if op == "+":
        return sum(vals)
    if op == "-":
        return -vals[0] if len(vals) == 1 else vals[0] - sum(vals[1:])
    if op == "*":
        return float(np.prod(vals))
    assert op == "/", op
    return vals[0] / float(np.prod(vals[1:]))


_CMP = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "=": lambda a, b: a == b,
}


def _holds(formula, env: dict[str, float]) -> bool:
    op, *args = formula
    if op == "and":
        return all(_holds(a, env) for a in args)
    if op == "or":
        return any(_holds(a, env) for a in args)
    vals = [_value(a, env) for a in args]
    return all(_CMP[op](a, b) for a, b in itertools.pairwise(vals))


def _reference_unsafe(commands: list, x: np.ndarray, y: np.ndarray) -> bool:
    """Direct evaluation of the conjunction of all asserts at (x, y)."""
    env = {f"X_{i}": float(v) for i, v in enumerate(x)}
    env.update({f"Y_{j}": float(v) for j, v in enumerate(y)})
    return all(_holds(cmd[1], env) for cmd in commands if cmd[0] == "assert")


def _parsed_unsafe(prop: VnnlibProperty, x: np.ndarray, y: np.ndarray) -> bool:
    """Membership from the parsed regions, written out without Polytope.contains."""
    for region in prop.regions:
        if np.all(region.lower <= x) and np.all(x <= region.upper):
            for poly in region.unsafe:
                lhs = poly.A @ y + (poly.A_x @ x if poly.A_x is not None else 0.0)
                if np.all(lhs <= poly.b):
                    return True
    return False


def _check_semantics(text: str, prop: VnnlibProperty, n_points: int, seed: int) -> None:
    """Random points near the regions: the parsed sets agree with the formula, both outcomes."""
    rng = np.random.default_rng(seed)
    commands = _sexprs(text)
    outcomes = set()
    for _ in range(n_points):
        region = prop.regions[rng.integers(len(prop.regions))]
        width = region.upper - region.lower
        x = region.lower + rng.uniform(size=prop.n_inputs) * width
        if rng.uniform() < 0.4:  # push one coordinate out of the box
            i = rng.integers(prop.n_inputs)
            x[i] += rng.choice([-1.0, 1.0]) * (0.01 + rng.uniform() * width[i])
        y = rng.normal(scale=3.0, size=prop.n_outputs)
        expected = _reference_unsafe(commands, x, y)
        assert _parsed_unsafe(prop, x, y) == expected, (x, y)
        outcomes.add(expected)
    assert outcomes == {True, False}, "sampling never reached one of the outcomes"


# ------------------------------------------------------------------------- handwritten strings

BOX_AND_POLYTOPE = (
    _decls(2, 2)
    + """
(assert (>= X_0 -1))
(assert (<= X_0 1e0))
(assert (<= 0.5 X_1)) ; constant on the left
(assert (< X_1 2.5E+0))
(assert (<= (+ Y_0 (* 2 Y_1)) 3))
(assert (>= Y_0 (- 0.5)))
"""
)


def test_box_and_single_polytope() -> None:
    prop = parse_vnnlib(BOX_AND_POLYTOPE, path="box.vnnlib")
    assert (prop.path, prop.n_inputs, prop.n_outputs) == ("box.vnnlib", 2, 2)
    (region,) = prop.regions
    np.testing.assert_array_equal(region.lower, [-1.0, 0.5])
    np.testing.assert_array_equal(region.upper, [1.0, 2.5])
    (poly,) = region.unsafe
    np.testing.assert_array_equal(poly.A, [[1.0, 2.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(poly.b, [3.0, 0.5])
    assert poly.A_x is None
    assert poly.A.dtype == np.float64 and not poly.A.flags.writeable


DISJUNCTION = (
    _decls(1, 2)
    + """
(assert (and (>= X_0 0) (<= X_0 1)))
(assert (or (and (<= Y_0 Y_1) (>= Y_0 0)) (<= Y_1 -0.25)))
"""
)


def test_disjunction_of_polytopes() -> None:
    (region,) = parse_vnnlib(DISJUNCTION).regions
    np.testing.assert_array_equal(region.lower, [0.0])
    np.testing.assert_array_equal(region.upper, [1.0])
    first, second = region.unsafe
    np.testing.assert_array_equal(first.A, [[1.0, -1.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(first.b, [0.0, 0.0])
    np.testing.assert_array_equal(second.A, [[0.0, 1.0]])
    np.testing.assert_array_equal(second.b, [-0.25])


INPUT_BOXES = (
    _decls(1, 1)
    + """
(assert (or (and (>= X_0 0) (<= X_0 1)) (and (>= X_0 2) (<= X_0 3))))
(assert (or (<= Y_0 0) (>= Y_0 1)))
"""
)


def test_input_box_disjunction_distributes_and_groups() -> None:
    prop = parse_vnnlib(INPUT_BOXES)
    assert len(prop.regions) == 2
    for region, (lo, hi) in zip(prop.regions, [(0.0, 1.0), (2.0, 3.0)]):
        np.testing.assert_array_equal(region.lower, [lo])
        np.testing.assert_array_equal(region.upper, [hi])
        assert [p.A.tolist() for p in region.unsafe] == [[[1.0]], [[-1.0]]]
        assert [p.b.tolist() for p in region.unsafe] == [[0.0], [-1.0]]


def test_and_over_two_output_disjunctions_is_a_cartesian_product() -> None:
    text = _decls(1, 2) + "(assert (<= 0 X_0 1))\n"
    text += "(assert (or (<= Y_0 1) (<= Y_0 2)))\n(assert (or (<= Y_1 3) (<= Y_1 4)))\n"
    (region,) = parse_vnnlib(text).regions
    np.testing.assert_array_equal(region.lower, [0.0])  # chained comparison 0 <= X_0 <= 1
    np.testing.assert_array_equal(region.upper, [1.0])
    assert [p.b.tolist() for p in region.unsafe] == [[1, 3], [1, 4], [2, 3], [2, 4]]
    for poly in region.unsafe:
        np.testing.assert_array_equal(poly.A, [[1.0, 0.0], [0.0, 1.0]])


MIXED = (
    _decls(2, 1)
    + """
(assert (>= X_0 (- 0.5)))
(assert (<= X_0 0.5))
(assert (= X_1 0.25))
(assert (<= (- Y_0 (* 0.5 X_0)) 0))
(assert (<= (+ X_0 X_1) 1))
"""
)


def test_mixed_constraints_go_to_a_x() -> None:
    (region,) = parse_vnnlib(MIXED).regions
    np.testing.assert_array_equal(region.lower, [-0.5, 0.25])
    np.testing.assert_array_equal(region.upper, [0.5, 0.25])
    (poly,) = region.unsafe
    np.testing.assert_array_equal(poly.A, [[1.0], [0.0]])
    np.testing.assert_array_equal(poly.A_x, [[-0.5, 0.0], [1.0, 1.0]])
    np.testing.assert_array_equal(poly.b, [0.0, 1.0])


TERM_FORMS = (
    _decls(1, 3)
    + """
(assert (>= X_0 (- 0.5))) (assert (<= X_0 -1.5e-1))
(assert (>= (- Y_0 Y_1 0.5) (- Y_2)))
(assert (<= (* -2 Y_0) (* Y_1 3)))
(assert (> (/ Y_2 4) (- 1 2)))
(assert (= (+ Y_0 1) (* 2 (- Y_1))))
"""
)


def test_term_forms_exact_rows() -> None:
    (region,) = parse_vnnlib(TERM_FORMS).regions
    np.testing.assert_array_equal(region.lower, [-0.5])
    np.testing.assert_array_equal(region.upper, [-0.15])
    (poly,) = region.unsafe
    np.testing.assert_array_equal(
        poly.A,
        [[-1, 1, -1], [-2, -3, 0], [0, 0, -0.25], [1, 2, 0], [-1, -2, 0]],
    )
    np.testing.assert_array_equal(poly.b, [-0.5, 0, 1, -1, 1])


def test_strict_reads_as_non_strict() -> None:
    strict = parse_vnnlib(BOX_AND_POLYTOPE.replace("<=", "<").replace(">=", ">"))
    plain = parse_vnnlib(BOX_AND_POLYTOPE)
    for a, b in zip(strict.regions, plain.regions):
        np.testing.assert_array_equal(a.lower, b.lower)
        np.testing.assert_array_equal(a.upper, b.upper)
        np.testing.assert_array_equal(a.unsafe[0].A, b.unsafe[0].A)
        np.testing.assert_array_equal(a.unsafe[0].b, b.unsafe[0].b)


def test_term_without_output_constraint_is_whole_output_space() -> None:
    text = _decls(1, 1) + "(assert (or (and (>= X_0 0) (<= X_0 1)) (and (>= X_0 2) "
    text += "(<= X_0 3) (>= Y_0 1))))\n"
    first, second = parse_vnnlib(text).regions
    assert first.unsafe[0].A.shape == (0, 1)
    np.testing.assert_array_equal(second.unsafe[0].A, [[-1.0]])


@pytest.mark.parametrize(
    "text",
    [BOX_AND_POLYTOPE, DISJUNCTION, INPUT_BOXES, MIXED, TERM_FORMS.replace("(= ", "(>= ")],
    ids=["box", "disjunction", "input_boxes", "mixed", "term_forms"],
)
def test_semantics_handwritten(text: str) -> None:
    _check_semantics(text, parse_vnnlib(text), n_points=300, seed=0)


def test_cartesian_product_blow_up_is_refused() -> None:
    text = _decls(1, 1) + "(assert (>= X_0 0)) (assert (<= X_0 1))\n"
    n = int(np.ceil(np.log2(MAX_TERMS))) + 1
    text += "(assert (or (<= Y_0 0) (<= Y_0 1)))\n" * n
    with pytest.raises(SpecificationError, match="more than"):
        parse_vnnlib(text)


def test_gzip_by_suffix_and_by_magic(tmp_path: Path) -> None:
    data = BOX_AND_POLYTOPE.encode()
    (tmp_path / "a.vnnlib").write_bytes(data)
    (tmp_path / "b.vnnlib.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.vnnlib").write_bytes(gzip.compress(data))  # gzip without the suffix
    for name in ("a.vnnlib", "b.vnnlib.gz", "c.vnnlib"):
        prop = load_vnnlib(tmp_path / name)
        assert prop.path == str(tmp_path / name)
        np.testing.assert_array_equal(prop.regions[0].unsafe[0].b, [3.0, 0.5])
    (tmp_path / "d.vnnlib.gz").write_bytes(data)  # suffix says gzip, content is not
    with pytest.raises(SpecificationError, match="gzip"):
        load_vnnlib(tmp_path / "d.vnnlib.gz")


# ------------------------------------------------------------- line endings, nesting, encoding


def _assert_same(a: VnnlibProperty, b: VnnlibProperty) -> None:
    assert (a.n_inputs, a.n_outputs, len(a.regions)) == (b.n_inputs, b.n_outputs, len(b.regions))
    for ra, rb in zip(a.regions, b.regions):
        np.testing.assert_array_equal(ra.lower, rb.lower)
        np.testing.assert_array_equal(ra.upper, rb.upper)
        assert len(ra.unsafe) == len(rb.unsafe)
        for pa, pb in zip(ra.unsafe, rb.unsafe):
            np.testing.assert_array_equal(pa.A, pb.A)
            np.testing.assert_array_equal(pa.b, pb.b)
            assert (pa.A_x is None) == (pb.A_x is None)
            if pa.A_x is not None:
                np.testing.assert_array_equal(pa.A_x, pb.A_x)


def _commented(text: str) -> str:
    """Each line followed by a comment that mentions more constraints (to be ignored)."""
    return "; header (assert (<= Y_0 -100))\n" + text.replace("\n", " ; (<= Y_0 7) ;;\n")


@pytest.mark.parametrize("ending", ["\r\n", "\r", "mixed"])
@pytest.mark.parametrize(
    "text",
    [BOX_AND_POLYTOPE, DISJUNCTION, INPUT_BOXES, MIXED, TERM_FORMS],
    ids=["box", "disjunction", "input_boxes", "mixed", "term_forms"],
)
def test_line_endings_parse_to_the_same_spec(text: str, ending: str) -> None:
    reference = parse_vnnlib(text)
    _assert_same(parse_vnnlib(_commented(text)), reference)
    if ending == "mixed":
        breaks = itertools.cycle(["\r", "\n", "\r\n"])
        converted = re.sub("\n", lambda _: next(breaks), _commented(text))
    else:
        converted = _commented(text).replace("\n", ending)
    _assert_same(parse_vnnlib(converted), reference)


def test_cr_only_file_keeps_the_constraints_after_comments() -> None:
    """Regression: on a CR-only file the first `;` used to swallow the rest of the file."""
    text = _decls(1, 1) + "; box\n(assert (>= X_0 0)) ; low\n(assert (<= X_0 1)) ; high\n"
    text += "; unsafe iff Y_0 >= 5\n(assert (>= Y_0 5))\n"
    (region,) = parse_vnnlib(text.replace("\n", "\r")).regions
    np.testing.assert_array_equal([region.lower, region.upper], [[0.0], [1.0]])
    (poly,) = region.unsafe
    np.testing.assert_array_equal(poly.A, [[-1.0]])
    np.testing.assert_array_equal(poly.b, [-5.0])


def test_utf8_byte_order_mark_and_gzip_with_crlf(tmp_path: Path) -> None:
    path = tmp_path / "bom.vnnlib.gz"
    path.write_bytes(
        gzip.compress(b"\xef\xbb\xbf" + BOX_AND_POLYTOPE.replace("\n", "\r\n").encode())
    )
    _assert_same(load_vnnlib(path), parse_vnnlib(BOX_AND_POLYTOPE))
    assert load_vnnlib(str(path).encode()).path == str(path)  # a bytes path works too


@pytest.mark.parametrize("depth", [3000, 30_000])
def test_deep_nesting_parses_without_recursion(depth: int) -> None:
    formula = "(and " * depth + "(or (<= Y_0 1) (<= Y_0 2))" + ")" * depth
    term = "(- " * (2 * depth) + "Y_0" + ")" * (2 * depth)  # an even number of negations
    ors = "(or " * depth + "(<= Y_0 3)" + ")" * depth
    text = _decls(1, 1) + f"(assert (<= 0 X_0 1))\n(assert {formula})\n(assert (<= {term} 4))\n"
    (region,) = parse_vnnlib(text + f"(assert {ors})\n").regions
    assert [p.b.tolist() for p in region.unsafe] == [[4, 3, 1], [4, 3, 2]]  # common rows first
    assert all(p.A.tolist() == [[1.0]] * 3 for p in region.unsafe)


# ---------------------------------------------------------------------------------- bad input

_D = _decls(1, 1)  # lines 1-2
_BOX = "(assert (>= X_0 0))\n(assert (<= X_0 1))\n"  # lines 3-4 after _D
_Y = "(assert (<= Y_0 0))\n"

MALFORMED = {
    "extra_close": (_D + _BOX + "(assert (<= Y_0 0)))\n", 5),
    "unclosed": (_D + _BOX + "(assert (<= Y_0\n 0)\n", 5),
    "unknown_operator": (_D + _BOX + "(assert (<= Y_0\n (max Y_0 1)))\n", 6),
    "unknown_connective": (_D + _BOX + "\n(assert (not (<= Y_0 0)))\n", 6),
    "undeclared_variable": (_D + _BOX + "(assert (<= Y_0\n\n Y_1))\n", 7),
    "no_lower_bound": (_D + "(assert (<= X_0 1))\n" + _Y, 1),
    "no_upper_bound": (_decls(2, 1) + _BOX + "(assert (>= X_1 0))\n" + _Y, 2),
    "empty_box": (_D + "(assert (>= X_0 2))\n(assert (<= X_0 1))\n" + _Y, 4),
    "empty_box_in_or": (_D + _BOX + "(assert (or (>= X_0 5) (<= Y_0 0)))\n", 5),
    "nonlinear": (_D + _BOX + "(assert (<= (*\n Y_0 Y_0) 1))\n", 5),
    "missing_declaration": ("(declare-const X_0 Real)\n(declare-const X_2 Real)\n", 2),
    "non_numeric": (_D + _BOX + "(assert (<= Y_0 0.5.1))\n", 5),
    "non_numeric_exponent": (_D + _BOX + "\n(assert (<= Y_0 1e))\n", 6),
    "overflow": (_D + _BOX + "(assert (<= Y_0 1e999))\n", 5),
    "no_output_constraint": (_D + _BOX + "\n; nothing about Y\n", 6),
    "no_output_declared": ("(declare-const X_0 Real)\n" + _BOX + "\n", 4),
    "declared_twice": (_D + "(declare-const X_0 Real)\n", 3),
    "int_declaration": ("(declare-const X_0 Int)\n", 1),
    "bad_name": ("(declare-const Z_0 Real)\n", 1),
    "unknown_command": (_D + _BOX + _Y + "(define-fun f () Real 1)\n", 6),
    "assert_two_formulas": (_D + _BOX + "(assert (<= Y_0 0) (<= Y_0 1))\n", 5),
    "constant_comparison": (_D + _BOX + _Y + "(assert (<= 0 1))\n", 6),
    "bare_atom": (_D + _BOX + _Y + "X_0\n", 6),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_raises_with_path_and_line(name: str) -> None:
    text, line = MALFORMED[name]
    path = f"bad/{name}.vnnlib"
    with pytest.raises(SpecificationError) as info:
        parse_vnnlib(text, path=path)
    assert (info.value.path, info.value.line) == (path, line), str(info.value)
    assert str(info.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("ending", ["\r\n", "\r"], ids=["crlf", "cr"])
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_line_numbers_with_other_line_endings(name: str, ending: str) -> None:
    text, line = MALFORMED[name]
    with pytest.raises(SpecificationError) as info:
        parse_vnnlib(text.replace("\n", ending), path="bad.vnnlib")
    assert info.value.line == line, str(info.value)


def test_malformed_file_on_disk_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.vnnlib.gz"
    path.write_bytes(gzip.compress(MALFORMED["undeclared_variable"][0].encode()))
    with pytest.raises(SpecificationError, match=re.escape(f"{path}:7: undeclared variable")):
        load_vnnlib(path)


# ------------------------------------------------------------------------------- real data


@pytest.mark.data
def test_every_vnncomp2022_file_parses() -> None:
    files = sorted(_data_dir().glob("*/vnnlib/*.vnnlib*"))
    assert files, "no .vnnlib files found"
    for path in files:
        prop = _load(path)
        assert prop.regions and all(r.unsafe for r in prop.regions), path
        for region in prop.regions:
            assert region.lower.shape == (prop.n_inputs,)
            assert np.all(region.lower <= region.upper), path
            assert all(p.A.shape[1] == prop.n_outputs for p in region.unsafe)


@pytest.mark.data
@pytest.mark.parametrize(
    ("suite", "sizes"), [("acasxu", (5, 5)), ("mnist_fc", (784, 10)), ("oval21", (3072, 10))]
)
def test_instances_csv_references_parse(suite: str, sizes: tuple[int, int]) -> None:
    folder = _data_dir(suite)
    if not (folder / "vnnlib").is_dir():
        pytest.skip(f"{folder}/vnnlib is absent (instances.csv only)")
    with open(folder / "instances.csv", newline="") as f:
        names = sorted({row[1] for row in csv.reader(f) if row})
    for name in names:
        plain = folder / name
        path = plain if plain.exists() else plain.with_name(plain.name + ".gz")
        prop = _load(path)
        assert (prop.n_inputs, prop.n_outputs) == sizes, path


ACAS_PROP1_LOWER = [0.6, -0.5, -0.5, 0.45, -0.5]
ACAS_PROP1_UPPER = [0.679857769, 0.5, 0.5, 0.5, -0.45]


@pytest.mark.data
def test_acasxu_property_1() -> None:
    prop = load_vnnlib(_data_dir("acasxu", "vnnlib") / "prop_1.vnnlib.gz")
    (region,) = prop.regions
    np.testing.assert_array_equal(region.lower, ACAS_PROP1_LOWER)
    np.testing.assert_array_equal(region.upper, ACAS_PROP1_UPPER)
    (poly,) = region.unsafe  # unsafe iff Y_0 >= 3.991125645861615
    np.testing.assert_array_equal(poly.A, [[-1.0, 0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(poly.b, [-3.991125645861615])
    assert poly.A_x is None


@pytest.mark.data
def test_acasxu_property_2_is_one_polytope() -> None:
    """Prop 2: four separate asserts Y_j <= Y_0 (COC maximal): a conjunction, not a disjunction."""
    (region,) = load_vnnlib(_data_dir("acasxu", "vnnlib") / "prop_2.vnnlib.gz").regions
    np.testing.assert_array_equal(region.lower, ACAS_PROP1_LOWER)  # same box as prop 1
    np.testing.assert_array_equal(region.upper, ACAS_PROP1_UPPER)
    (poly,) = region.unsafe
    expected = np.hstack([-np.ones((4, 1)), np.eye(4)])
    np.testing.assert_array_equal(poly.A, expected)
    np.testing.assert_array_equal(poly.b, np.zeros(4))


@pytest.mark.data
def test_acasxu_property_6_has_two_input_boxes() -> None:
    prop = load_vnnlib(_data_dir("acasxu", "vnnlib") / "prop_6.vnnlib.gz")
    first, second = prop.regions
    assert (first.lower[1], first.upper[1]) == (0.11140846, 0.499999896)
    assert (second.lower[1], second.upper[1]) == (-0.499999896, -0.11140846)
    for region in prop.regions:
        assert len(region.unsafe) == 4  # COC (Y_0) not minimal: some Y_j <= Y_0
        for j, poly in enumerate(region.unsafe, start=1):
            np.testing.assert_array_equal(poly.A, [np.eye(5)[j] - np.eye(5)[0]])


@pytest.mark.data
@pytest.mark.parametrize(
    "name",
    [
        "acasxu/vnnlib/prop_1",
        "acasxu/vnnlib/prop_2",
        "acasxu/vnnlib/prop_6",
        "acasxu/vnnlib/prop_7",
        "mnist_fc/vnnlib/prop_0_0.03",
    ],
)
def test_semantics_real_files(name: str) -> None:
    path = _data_dir() / f"{name}.vnnlib.gz"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    text = gzip.decompress(path.read_bytes()).decode()
    n_points = 60 if "mnist" in name else 300
    _check_semantics(text, load_vnnlib(path), n_points=n_points, seed=1)


def test_and_of_disjunctions_past_ten_thousand_terms():
    """14 two-term disjunctions AND-ed: 16,384 DNF terms, read (the cap was 10,000; it is now
    a flat OR's, MAX_TERMS, with memory capped by MAX_ENTRIES), each term its 14 rows."""
    text = (
        "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"
        "(assert (>= X_0 0))\n(assert (<= X_0 1))\n"
        + "".join(f"(assert (or (<= Y_0 {i}) (<= Y_1 {i})))\n" for i in range(14))
    )
    (region,) = parse_vnnlib(text).regions
    assert len(region.unsafe) == 2**14
    first, last = region.unsafe[0], region.unsafe[-1]
    assert first.A.shape == (14, 2) and last.A.shape == (14, 2)
    assert first.A[:, 0].tolist() == [1.0] * 14 and last.A[:, 1].tolist() == [1.0] * 14
    assert first.b.tolist() == [float(i) for i in range(14)]
