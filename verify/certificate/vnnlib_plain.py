"""The checker's own VNN-LIB reader, for the forms of VNN-COMP 2022 ACAS Xu and mnist_fc: each
`assert` is an atom, an `(and atoms)` or an `(or (and atoms) ...)`; an atom compares an input
`X_i` with a number (input box) or outputs `Y_i` with each other or a number, with `<=` or `>=`.

Numbers are read exactly (`Fraction`) and taken as their nearest float64 (`rounded`: the
reading of VNN-COMP and of the engine; an exact-decimal reading, rounded outwards for the box
and `b`, inwards for counterexamples, is one switch away). The property's inputs are the disjunction (over the asserts' cross product, in file order) of
input boxes, its unsafe set the disjunction of output polytopes `{y : A y <= b}` (rows in
atom order). Each box is a `Region(lower, upper, unsafe)` with every polytope: the same regions
and rows, in the same order, as `verify.io.vnnlib_load` reads them for these forms (within the
reading). Anything
else raises `UnsupportedPropertyError`."""

from __future__ import annotations

import gzip
import itertools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

TOKEN = re.compile(r"\(|\)|[^\s()]+")
VAR = re.compile(r"([XY])_(\d+)$")


class UnsupportedPropertyError(ValueError):
    """The VNN-LIB file uses a form the checker does not read."""


@dataclass(frozen=True)
class Polytope:
    """`{y : A y <= b}`: `b` rounded up (a superset, to exclude), `b_inner` down (a subset, to
    show a point inside)."""

    A: np.ndarray
    b: np.ndarray
    b_inner: np.ndarray


@dataclass(frozen=True)
class Region:
    """The box `[lower, upper]` rounded outwards (`inner_*`: inwards) and the unsafe set."""

    lower: np.ndarray
    upper: np.ndarray
    unsafe: tuple[Polytope, ...]
    inner_lower: np.ndarray
    inner_upper: np.ndarray


def _tree(text: str) -> list:
    stack: list[list] = [[]]
    for tok in TOKEN.findall(text):
        if tok == "(":
            stack.append([])
        elif tok == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise UnsupportedPropertyError("unbalanced parentheses")
    return stack[0]


def _term(tok) -> tuple[str, int] | Fraction:
    """A variable `(kind, index)` or the number's exact value."""
    if not isinstance(tok, str):
        raise UnsupportedPropertyError(f"term {tok} is not a variable or a number")
    m = VAR.match(tok)
    return (m.group(1), int(m.group(2))) if m else Fraction(tok)


EXACT_DECIMALS = False  # True: the file's exact decimals, rounded outwards (and inwards)


def rounded(value: Fraction, upward: bool) -> float:
    """The number as the property means it: the nearest float64 (how VNN-COMP tools, and this
    project's engine, read VNN-LIB), or with `EXACT_DECIMALS` the exact decimal rounded towards
    `upward` (then the engine's float32 root box, rounded outwards from the float64 reading,
    can miss the exact box by an ulp of float64, and its counterexamples can lie that much
    outside: mnist_fc's bounds such as 0.029999999329447746)."""
    x = float(value)
    if not EXACT_DECIMALS:
        return x
    if upward and Fraction(x) < value:
        x = math.nextafter(x, math.inf)
    elif not upward and Fraction(x) > value:
        x = math.nextafter(x, -math.inf)
    return x


def _atom(expr: list) -> tuple:
    """`(kind, data)`: ("X", (i, low, high)) or ("Y", (coefficients {j: a}, b)) for `a.y <= b`."""
    if len(expr) != 3 or expr[0] not in ("<=", ">="):
        raise UnsupportedPropertyError(f"atom {expr} is not a comparison")
    left, right = _term(expr[1]), _term(expr[2])
    if expr[0] == ">=":
        left, right = right, left  # left <= right
    if isinstance(left, tuple) and left[0] == "X" and isinstance(right, Fraction):
        return ("X", (left[1], None, right))
    if isinstance(right, tuple) and right[0] == "X" and isinstance(left, Fraction):
        return ("X", (right[1], left, None))
    coef: dict[int, float] = {}
    if isinstance(left, tuple) and left[0] == "Y":
        coef[left[1]] = coef.get(left[1], 0.0) + 1.0
    if isinstance(right, tuple) and right[0] == "Y":
        coef[right[1]] = coef.get(right[1], 0.0) - 1.0
    const = (right if isinstance(right, Fraction) else 0) - (left if isinstance(left, Fraction)
                                                               else 0)  # fmt: skip
    if (
        not coef
        or (isinstance(left, tuple) and left[0] == "X")
        or (isinstance(right, tuple) and right[0] == "X")
    ):
        raise UnsupportedPropertyError(f"atom {expr} mixes inputs and outputs")
    return ("Y", (coef, const))


def _dnf(expr: list) -> list[list[tuple]]:
    """An assert's body as alternatives, each a list of atoms."""
    if expr and expr[0] == "or":
        return [a for part in expr[1:] for a in _dnf(part)]
    if expr and expr[0] == "and":
        return [[_atom(e) for e in expr[1:]]]
    return [[_atom(expr)]]


def read_property(data: bytes) -> list[Region]:
    """The regions of a VNN-LIB file's bytes (gzip or not)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    text = re.sub(r";[^\n]*", "", data.decode())
    n = {"X": 0, "Y": 0}
    inputs, outputs = [[]], [[]]
    for expr in _tree(text):
        if expr[0] == "declare-const":
            kind, index = _term(expr[1])
            n[kind] = max(n[kind], index + 1)
        elif expr[0] == "assert":
            alternatives = _dnf(expr[1])
            kinds = {atom[0] for alt in alternatives for atom in alt}
            if len(kinds) != 1:
                raise UnsupportedPropertyError("an assert mixes inputs and outputs")
            target = inputs if kinds == {"X"} else outputs
            target[:] = [a + b for a, b in itertools.product(target, alternatives)]
    return [_region(alt, outputs, n["X"], n["Y"]) for alt in inputs]


def _region(alt: list[tuple], outputs: list[list[tuple]], n_x: int, n_y: int) -> Region:
    """One input box (its atoms `alt`) with every output polytope."""
    bounds = {}
    for side, upward in (("lower", False), ("upper", True), ("inner_lower", True),
                         ("inner_upper", False)):  # fmt: skip
        bounds[side] = np.full(n_x, -np.inf if "lower" in side else np.inf)
        pick = max if "lower" in side else min
        for _, (i, low, high) in alt:
            value = low if "lower" in side else high
            if value is not None:
                bounds[side][i] = pick(bounds[side][i], rounded(value, upward))
    polytopes = []
    for rows in outputs:
        A, b, inner = np.zeros((len(rows), n_y)), np.zeros(len(rows)), np.zeros(len(rows))
        for r, (_, (coef, const)) in enumerate(rows):
            for j, a in coef.items():
                A[r, j] = a
            b[r], inner[r] = rounded(Fraction(const), True), rounded(Fraction(const), False)
        polytopes.append(Polytope(A, b, inner))
    return Region(bounds["lower"], bounds["upper"], tuple(polytopes), bounds["inner_lower"],
                  bounds["inner_upper"])  # fmt: skip
