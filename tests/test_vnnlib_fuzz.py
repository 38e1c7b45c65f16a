"""Property-based tests of the VNN-LIB reader `verify.io.vnnlib`.

1. Random properties (input boxes, polytopes of linear rows over Y and X) are printed by an
   independent reference printer (random term forms, whitespace, comments, line endings, BOM,
   gzip) and must parse to the same regions: boxes equal, each polytope's rows equal as a multiset.
2. Random corruptions of such files (bytes, tokens, lines, truncation, junk) either still parse
   or raise `SpecificationError` with `path:LINE:` inside the file; never another exception.

`VNNLIB_FUZZ_EXAMPLES` (default 200) sets the number of examples per test (a longer soak).
"""

from __future__ import annotations

import gzip
import itertools
import os
import random
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verify.errors import SpecificationError
from verify.io.vnnlib import VnnlibProperty, parse_vnnlib
from verify.io.vnnlib_load import load_vnnlib

FUZZ = settings(
    max_examples=int(os.environ.get("VNNLIB_FUZZ_EXAMPLES", "200")),
    deadline=None,
    database=None,  # writes nothing into the working tree
    suppress_health_check=[HealthCheck.too_slow],
)
ENDINGS = ("\n", "\r\n", "\r")


class Row(NamedTuple):
    """``y . Y + x . X <= b`` (``y`` has a nonzero entry: never a bare input bound)."""

    y: tuple[float, ...]
    x: tuple[float, ...]
    b: float


class Spec(NamedTuple):
    """The intended property: regions ``(lower, upper, polytopes)``, boxes pairwise distinct."""

    n_inputs: int
    n_outputs: int
    regions: tuple[tuple[tuple[float, ...], tuple[float, ...], tuple[tuple[Row, ...], ...]], ...]


# --------------------------------------------------------------------------- random properties

SPECIAL = (0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, -2.5e-7, 5e-324, 1e308, -1e308)


def random_number(rng: random.Random) -> float:
    """Integers, uniform values, values of any magnitude, and a few special ones."""
    kind = rng.randrange(4)
    if kind == 0:
        return float(rng.randint(-50, 50))
    if kind == 1:
        return rng.uniform(-1e4, 1e4)
    if kind == 2:
        return rng.choice((-1.0, 1.0)) * 10.0 ** rng.uniform(-15, 15)
    return rng.choice(SPECIAL)


def random_nonzero(rng: random.Random) -> float:
    value = random_number(rng)
    return value if value != 0.0 else 2.0


def random_row(rng: random.Random, n_inputs: int, n_outputs: int) -> Row:
    ys = set(rng.sample(range(n_outputs), rng.randint(1, n_outputs)))
    xs = set(rng.sample(range(n_inputs), rng.randint(1, n_inputs))) if rng.random() < 0.3 else ()
    y = tuple(random_nonzero(rng) if j in ys else 0.0 for j in range(n_outputs))
    x = tuple(random_nonzero(rng) if i in xs else 0.0 for i in range(n_inputs))
    return Row(y, x, random_number(rng))


@st.composite
def specs(draw) -> Spec:
    """Sizes drawn by hypothesis, numbers by its seeded `random.Random` (fast to generate)."""
    n_inputs, n_outputs = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    n_regions, rng = draw(st.integers(1, 3)), draw(st.randoms(use_true_random=False))
    boxes = {}
    for _ in range(n_regions):
        pairs = [sorted((random_number(rng), random_number(rng))) for _ in range(n_inputs)]
        if rng.random() < 0.2:
            pairs[0][1] = pairs[0][0]  # a point interval
        boxes.setdefault(tuple(p[0] for p in pairs) + tuple(p[1] for p in pairs), None)
    regions = []
    for box in boxes:
        polys = [
            tuple(random_row(rng, n_inputs, n_outputs) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 3))
        ]
        regions.append((box[:n_inputs], box[n_inputs:], tuple(polys)))
    return Spec(n_inputs, n_outputs, tuple(regions))


# ------------------------------------------------------------------------ reference printer


def number(rng: random.Random, v: float) -> list[str]:
    """Tokens of a constant in one of several exact spellings."""
    text = rng.choice([repr(v), format(v, ".17g"), format(v, ".17e")])
    if v < 0 and rng.random() < 0.3:
        return ["(", "-", *number(rng, -v), ")"]
    return [text]


def term_tokens(rng: random.Random, var: str, c: float) -> list[str]:
    if c == 1.0 and rng.random() < 0.5:
        return [var]
    if c == -1.0 and rng.random() < 0.5:
        return ["(", "-", var, ")"]
    if rng.random() < 0.5:
        return ["(", "*", *number(rng, c), var, ")"]
    return ["(", "*", var, *number(rng, c), ")"]


def sum_tokens(rng: random.Random, terms: list[tuple[str, float]]) -> list[str]:
    parts = [term_tokens(rng, var, c) for var, c in terms]
    if len(parts) == 1 and rng.random() < 0.7:
        return parts[0]
    return ["(", "+", *itertools.chain.from_iterable(parts), ")"]


def linear(rng: random.Random, row: Row) -> list[str]:
    """Tokens of ``y . Y + x . X``, written with exact operations only: products by one
    constant, negation, halving a coefficient into two terms of the same variable, and sums or
    differences of such terms."""
    terms = []
    for kind, coefs in (("Y", row.y), ("X", row.x)):
        for i, c in enumerate(coefs):
            if c != 0.0 and abs(c) > 1e-300 and rng.random() < 0.2:
                terms += [(f"{kind}_{i}", c / 2), (f"{kind}_{i}", c / 2)]
            elif c != 0.0:
                terms.append((f"{kind}_{i}", c))
    rng.shuffle(terms)
    if len(terms) >= 2 and rng.random() < 0.3:  # (- P Q) with Q the negated rest
        k = rng.randint(1, len(terms) - 1)
        negated = [(var, -c) for var, c in terms[k:]]
        return ["(", "-", *sum_tokens(rng, terms[:k]), *sum_tokens(rng, negated), ")"]
    return sum_tokens(rng, terms)


def row_tokens(rng: random.Random, row: Row) -> list[str]:
    lhs, b = linear(rng, row), row.b
    form = rng.randrange(4)
    if form == 0:
        return ["(", "<=", *lhs, *number(rng, b), ")"]
    if form == 1:
        return ["(", ">=", *number(rng, b), *lhs, ")"]
    if form == 2:
        return ["(", "<=", "(", "-", *lhs, *number(rng, b), ")", "0", ")"]
    return ["(", ">=", "(", "-", *lhs, ")", "(", "-", *number(rng, b), ")", ")"]


def bound_tokens(rng: random.Random, i: int, lo: float, hi: float) -> list[list[str]]:
    """Comparisons (each a token list) that bound X_i to [lo, hi]."""
    var, form = f"X_{i}", rng.randrange(5)
    if lo == hi and form == 0:
        return [["(", "=", var, *number(rng, lo), ")"]]
    if form == 1:
        return [["(", "<=", *number(rng, lo), var, *number(rng, hi), ")"]]
    if form == 2:
        return [["(", ">=", *number(rng, hi), var, *number(rng, lo), ")"]]
    if form == 3:
        upper = ["(", ">=", "(", "-", var, ")", *number(rng, -hi), ")"]
        return [upper, ["(", ">=", var, *number(rng, lo), ")"]]
    both = [["(", "<=", var, *number(rng, hi), ")"], ["(", ">=", var, *number(rng, lo), ")"]]
    rng.shuffle(both)
    return both


def conjunction(rng: random.Random, parts: list[list[str]]) -> list[str]:
    if len(parts) == 1 and rng.random() < 0.5:
        return parts[0]
    return ["(", "and", *itertools.chain.from_iterable(parts), ")"]


def assertion(formula: list[str]) -> list[str]:
    return ["(", "assert", *formula, ")"]


def print_tokens(rng: random.Random, spec: Spec) -> tuple[list[str], Spec]:
    """Tokens of a file stating ``spec``, and the spec as the reader must return it (regions in
    the order of first appearance in the file)."""
    decls = [("X", i) for i in range(spec.n_inputs)] + [("Y", j) for j in range(spec.n_outputs)]
    rng.shuffle(decls)
    tokens = [t for k, i in decls for t in ("(", "declare-const", f"{k}_{i}", "Real", ")")]
    if len(spec.regions) == 1:
        lo, hi, polys = spec.regions[0]
        for i in range(spec.n_inputs):
            for bound in bound_tokens(rng, i, lo[i], hi[i]):
                tokens += assertion(bound)
        if len(polys) == 1 and rng.random() < 0.5:  # one assert per row
            for row in polys[0]:
                tokens += assertion(row_tokens(rng, row))
        elif len(polys) == 1:
            tokens += assertion(conjunction(rng, [row_tokens(rng, r) for r in polys[0]]))
        else:
            terms = [conjunction(rng, [row_tokens(rng, r) for r in p]) for p in polys]
            tokens += assertion(["(", "or", *itertools.chain.from_iterable(terms), ")"])
        expected = spec
    else:  # one (or (and box_k rows) ...), the terms interleaved at random
        pairs = [(k, p) for k, (_, _, polys) in enumerate(spec.regions) for p in polys]
        rng.shuffle(pairs)
        terms = []
        for k, poly in pairs:
            lo, hi, _ = spec.regions[k]
            bounds = [b for i in range(spec.n_inputs) for b in bound_tokens(rng, i, lo[i], hi[i])]
            parts = bounds + [row_tokens(rng, r) for r in poly]
            rng.shuffle(parts)
            terms.append(["(", "and", *itertools.chain.from_iterable(parts), ")"])
        tokens += assertion(["(", "or", *itertools.chain.from_iterable(terms), ")"])
        order = list(dict.fromkeys(k for k, _ in pairs))
        regions = [(*spec.regions[k][:2], tuple(p for j, p in pairs if j == k)) for k in order]
        expected = spec._replace(regions=tuple(regions))
    if rng.random() < 0.3:
        tokens += ["(", "check-sat", ")"]
    return tokens, expected


COMMENT_CHARS = "abc XY_0 ()<=;.-+*é\t"


def layout(rng: random.Random, tokens: list[str], ending: str | None) -> str:
    """Joins the tokens with random whitespace, comments and line endings (``None``: mixed)."""
    out = ["\ufeff"] if rng.random() < 0.1 else []
    previous = "("
    for tok in tokens:
        brk = ending or rng.choice(ENDINGS)
        sep = rng.choice(["", "", " ", "  ", "\t", brk, brk + brk, " \f", "comment"])
        if sep == "comment":
            text = "".join(rng.choice(COMMENT_CHARS) for _ in range(rng.randrange(12)))
            sep = f" ;{text}{brk}"
        if not sep and previous not in "()" and tok not in "()":
            sep = " "
        out += [sep, tok]
        previous = tok
    if rng.random() < 0.5:
        out.append(ending or rng.choice(ENDINGS))
    return "".join(out)


@st.composite
def printed(draw) -> tuple[str, Spec]:
    spec = draw(specs())
    rng = draw(st.randoms(use_true_random=False))
    tokens, expected = print_tokens(rng, spec)
    ending = draw(st.sampled_from([*ENDINGS, None]))
    return layout(rng, tokens, ending), expected


def polytope_rows(poly, n_inputs: int) -> list[tuple]:
    a_x = poly.A_x if poly.A_x is not None else np.zeros((poly.A.shape[0], n_inputs))
    return sorted((*a, *x, b) for a, x, b in zip(poly.A.tolist(), a_x.tolist(), poly.b.tolist()))


def assert_same(prop: VnnlibProperty, spec: Spec) -> None:
    assert (prop.n_inputs, prop.n_outputs) == (spec.n_inputs, spec.n_outputs)
    assert len(prop.regions) == len(spec.regions)
    for region, (lo, hi, polys) in zip(prop.regions, spec.regions):
        np.testing.assert_array_equal(region.lower, lo)
        np.testing.assert_array_equal(region.upper, hi)
        assert len(region.unsafe) == len(polys)
        for poly, want in zip(region.unsafe, polys):
            expected = sorted((*r.y, *r.x, r.b) for r in want)
            assert polytope_rows(poly, spec.n_inputs) == expected
            assert (poly.A_x is None) == all(not any(r.x) for r in want)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vnnlib_fuzz")


@FUZZ
@given(case=printed(), compress=st.booleans())
def test_printed_property_parses_to_its_spec(case: tuple[str, Spec], compress, folder) -> None:
    text, spec = case
    data = text.encode()
    path = folder / ("p.vnnlib.gz" if compress else "p.vnnlib")
    path.write_bytes(gzip.compress(data) if compress else data)
    assert_same(load_vnnlib(path), spec)


@FUZZ
@given(case=printed())
def test_line_endings_do_not_change_the_spec(case: tuple[str, Spec]) -> None:
    text, spec = case
    for ending in ENDINGS:
        assert_same(parse_vnnlib(re.sub(r"\r\n|\r|\n", ending, text)), spec)


def line_count(data: bytes) -> int:
    breaks = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    return max(breaks + (0 if data.endswith((b"\n", b"\r")) else 1), 1)


def line_at(text: str, offset: int) -> int:
    return line_count(text[:offset].encode() + b"x")


NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def code_parts(text: str) -> list[tuple[int, str]]:
    """``(offset, line without its comment)`` for each line of ``text``."""
    parts, start = [], 0
    for match in [*re.finditer(r"\r\n|\r|\n", text), None]:
        end = match.start() if match else len(text)
        code = text[start:end].split(";", 1)[0]
        parts.append((start, code))
        start = match.end() if match else end
    return parts


@FUZZ
@given(case=printed(), data=st.data())
def test_bad_constant_is_reported_on_its_line(case: tuple[str, Spec], data) -> None:
    """A number in an assert replaced by nan/inf/1e999: the error names that exact line."""
    text, _ = case
    spans = [
        (start + m.start(), start + m.end())
        for start, code in code_parts(text)
        for m in re.finditer(r"[^\s();]+", code)
        if NUMBER.fullmatch(m[0])
    ]
    start, end = data.draw(st.sampled_from(spans))  # the printer always writes a number
    bad = data.draw(st.sampled_from(["nan", "-inf", "+Infinity", "1e999", "-4e400"]))
    with pytest.raises(SpecificationError) as info:
        parse_vnnlib(text[:start] + bad + text[end:], path="c.vnnlib")
    assert info.value.line == line_at(text, start), str(info.value)
    assert str(info.value).startswith(f"c.vnnlib:{info.value.line}: ")


# ------------------------------------------------------------------------------ corruptions

SNIPPETS = [
    b"(", b")", b";", b" ", b"\n", b"\r", b"\r\n", b"X_7", b"Y_0", b"X_0", b"nan", b"1e999",
    b"-", b"0", b".", b"e", b"and", b"or", b"<=", b"assert", b"(declare-const X_0 Real)",
    b"(assert (<= Y_0 0))", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", "é".encode(),
    b"\x1f\x8b", b"\xef\xbb\xbf", b"()", b"(and", b"|", b'"',
]  # fmt: skip
TOKEN = re.compile(rb"\(|\)|[^\s();]+")
LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


@st.composite
def corruptions(draw, raw: bytes) -> bytes:
    """``raw`` with one random corruption."""
    op = draw(st.sampled_from(["delete", "insert", "replace", "token", "truncate", "lines"]))
    at = draw(st.integers(0, len(raw)))
    junk = draw(st.one_of(st.sampled_from(SNIPPETS), st.binary(min_size=1, max_size=4)))
    if op == "delete":
        return raw[:at] + raw[at + draw(st.integers(1, 3)) :]
    if op == "insert":
        return raw[:at] + junk + raw[at:]
    if op == "replace":
        return raw[:at] + junk[:1] + raw[at + 1 :]
    if op == "truncate":
        return raw[:at]
    if op == "token":
        tok = draw(st.sampled_from(list(TOKEN.finditer(raw))))
        new = draw(st.sampled_from([b"", junk, tok[0] + b" " + tok[0]]))
        return raw[: tok.start()] + new + raw[tok.end() :]
    lines = LINE.findall(raw)
    i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
    if draw(st.booleans()):
        lines.insert(i, lines[i])  # duplicate a line
    else:
        lines[i], lines[j] = lines[j], lines[i]  # swap two lines
    return b"".join(lines)


def check_outcome(path: Path, data: bytes) -> None:
    """Parses or raises SpecificationError naming the file and, for text, a line inside it."""
    try:
        load_vnnlib(path)
    except SpecificationError as err:
        assert err.path == str(path)
        text = data.decode("utf-8", "replace").removeprefix("\ufeff")
        if data[:2] != b"\x1f\x8b" and text.strip():
            assert err.line is not None, str(err)
            assert 1 <= err.line <= line_count(data), (str(err), line_count(data))
            assert str(err).startswith(f"{path}:{err.line}: ")


@FUZZ
@given(data=st.data())
def test_corrupted_file_parses_or_names_its_line(data, folder: Path) -> None:
    text, _ = data.draw(printed())
    mutated = data.draw(corruptions(text.encode()))
    path = folder / "corrupt.vnnlib"
    path.write_bytes(mutated)
    check_outcome(path, mutated)


@FUZZ
@given(data=st.data())
def test_corrupted_gzip_raises_only_specification_error(data, folder: Path) -> None:
    text, _ = data.draw(printed())
    packed = gzip.compress(text.encode())
    mutated = data.draw(corruptions(packed)) if data.draw(st.booleans()) else packed[:-5]
    path = folder / "corrupt.vnnlib.gz"
    path.write_bytes(mutated)
    try:
        load_vnnlib(path)
    except SpecificationError as err:
        assert str(err).startswith(f"{path}:")


VOCABULARY = [
    "(", ")", "(", ")", "assert", "declare-const", "Real", "and", "or", "<=", ">=", "=", "+",
    "-", "*", "/", "X_0", "X_1", "Y_0", "Y_1", "0", "1.5", "-2e3", "nan", ";", "\n", "\r",
    "check-sat",
]  # fmt: skip


@FUZZ
@given(soup=st.lists(st.sampled_from(VOCABULARY), max_size=60), noise=st.binary(max_size=40))
def test_token_soup_and_noise_raise_only_specification_error(soup, noise, folder: Path) -> None:
    for data in (" ".join(soup).encode(), noise):
        path = folder / "soup.vnnlib"
        path.write_bytes(data)
        check_outcome(path, data)
