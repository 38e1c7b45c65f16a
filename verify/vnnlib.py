"""Reader for VNN-LIB 1.0 property files (``.vnnlib`` and ``.vnnlib.gz``).

A VNN-LIB file states the *unsafe* set of a network ``y = f(x)``: the property holds (the solver
answers ``unsat``) iff no input ``x`` in the input region reaches an output ``y`` in the unsafe
set. Format: http://www.vnnlib.org (VNN-LIB 1.0, an SMT-LIB 2 subset over the reals).

The formula (the conjunction of all ``assert`` commands) is brought to disjunctive normal form
(DNF); each DNF term is split into the bounds of single inputs (``X_i <= c``, ``c <= X_i``), which
give an input box, and its other linear constraints, which give a polytope ``A y + A_x x <= b``.
Terms with the same box are grouped into one :class:`Region`, so ACAS Xu property 6 (two input
boxes, four output polytopes) becomes two regions of four polytopes each.

Supported: comments ``;``; ``(declare-const X_i Real)`` / ``(declare-const Y_j Real)`` with indices
``0..n-1``; ``assert`` over ``and``, ``or`` (nested at any depth), ``<=``, ``>=``, ``<``, ``>``
(strict comparisons are read as non-strict: the closure of the unsafe set is checked, which is sound
for verification) and ``=`` (two inequalities); comparisons with more than two arguments chain as in
SMT-LIB; linear terms: numbers (``-0.5``, ``1e-3``), ``(- 0.5)``, variables, ``(+ a b ...)``,
``(- a b ...)``, ``(- a)``, ``(* c ... v)`` with at most one non-constant factor, ``(/ a c)``.
``check-sat``, ``get-model``, ``exit``, ``set-logic``, ``set-info`` and ``set-option`` are ignored.

Conventions: a constraint over several inputs and no output is kept in the polytope (zero row of
``A``, the coefficients in ``A_x``); a DNF term with no output constraint gives a polytope with zero
rows (all of ``R^n_outputs``: every input of its box is unsafe); several bounds on one input
intersect; an empty box (lower > upper) is an error even inside a disjunction. Every malformed file
raises :class:`verify.errors.SpecificationError` with the path and the 1-based line of the
offending token (for a missing bound: the declaration of the input; for a missing unsafe set: the
last line).
"""

from __future__ import annotations

import gzip
import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from verify.errors import ShapeMismatchError, SpecificationError

MAX_TERMS = 10_000
"""Largest number of DNF terms we expand to before raising (guards the cartesian product)."""

_TOKEN = re.compile(r"\(|\)|[^\s();]+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][\w.!?$%&*+<=>@^~-]*")
_VAR = re.compile(r"([XY])_(0|[1-9]\d*)")
_COMPARISONS = ("<=", ">=", "<", ">", "=")
_IGNORED = ("check-sat", "get-model", "exit", "set-logic", "set-info", "set-option")


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Polytope:
    """The set ``{y : A y + A_x x <= b}`` (``A_x x`` only when some row mixes inputs and outputs).

    Shapes: ``A`` ``[m, n_outputs]``, ``b`` ``[m]``, ``A_x`` ``[m, n_inputs]`` or ``None``.
    ``m == 0`` is the whole output space. Arrays are float64 and read-only.
    """

    A: np.ndarray
    b: np.ndarray
    A_x: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "A", _readonly(self.A))
        object.__setattr__(self, "b", _readonly(self.b))
        if self.A.ndim != 2 or self.b.shape != (self.A.shape[0],):
            raise ShapeMismatchError(f"Polytope: A {self.A.shape} and b {self.b.shape} disagree")
        if self.A_x is not None:
            object.__setattr__(self, "A_x", _readonly(self.A_x))
            if self.A_x.ndim != 2 or self.A_x.shape[0] != self.A.shape[0]:
                raise ShapeMismatchError(f"Polytope: A_x {self.A_x.shape} vs A {self.A.shape}")

    def contains(self, y: np.ndarray, x: np.ndarray | None = None, tol: float = 0.0) -> bool:
        """Whether ``A y + A_x x <= b + tol`` (``x`` [n_inputs] is needed iff ``A_x`` is set)."""
        lhs = self.A @ np.asarray(y, dtype=np.float64)
        if self.A_x is not None:
            if x is None:
                raise ShapeMismatchError("Polytope.contains: this polytope needs the input x")
            lhs = lhs + self.A_x @ np.asarray(x, dtype=np.float64)
        return bool(np.all(lhs <= self.b + tol))


@dataclass(frozen=True, eq=False)
class Region:
    """An input box ``lower <= x <= upper`` (``[n_inputs]`` each) and its unsafe set.

    The unsafe set is the union of ``unsafe``: the property is violated in this region iff some
    ``x`` in the box has ``f(x)`` in ANY of the polytopes.
    """

    lower: np.ndarray
    upper: np.ndarray
    unsafe: tuple[Polytope, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "lower", _readonly(self.lower))
        object.__setattr__(self, "upper", _readonly(self.upper))
        object.__setattr__(self, "unsafe", tuple(self.unsafe))
        if self.lower.ndim != 1 or self.lower.shape != self.upper.shape:
            raise ShapeMismatchError(f"Region: lower {self.lower.shape} vs {self.upper.shape}")


@dataclass(frozen=True, eq=False)
class VnnlibProperty:
    """A parsed VNN-LIB file: the property is violated iff ``(x, f(x))`` lies in ANY region."""

    path: str
    n_inputs: int
    n_outputs: int
    regions: tuple[Region, ...]


class _Atom(NamedTuple):
    text: str
    line: int


class _List(NamedTuple):
    items: tuple[_Atom | _List, ...]
    line: int


_Node = _Atom | _List


class _Linear(NamedTuple):
    """``sum coefs[v] * v + const``; a variable is ``("X", i)`` or ``("Y", j)``."""

    coefs: dict[tuple[str, int], float]
    const: float


class _Constraint(NamedTuple):
    """``sum coefs[v] * v <= bound``, from the token on ``line``."""

    coefs: dict[tuple[str, int], float]
    bound: float
    line: int


@dataclass(frozen=True)
class _Context:
    path: str
    decls: dict[tuple[str, int], int]  # variable -> line of its declaration

    def error(self, message: str, line: int | None) -> SpecificationError:
        return SpecificationError(message, path=self.path, line=line)


def load_vnnlib(path: str | os.PathLike) -> VnnlibProperty:
    """Read a ``.vnnlib`` file, gzip-compressed or not (detected by magic bytes or ``.gz``)."""
    name = os.fspath(path)
    raw = Path(name).read_bytes()
    if raw[:2] == b"\x1f\x8b" or name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise SpecificationError(f"not a valid gzip file ({exc})", path=name) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecificationError(f"not UTF-8 text ({exc.reason})", path=name) from exc
    return parse_vnnlib(text, path=name)


def parse_vnnlib(text: str, path: str = "<string>") -> VnnlibProperty:
    """Parse VNN-LIB text; ``path`` is only used in error messages and the result."""
    commands, last_line = _read_sexprs(text, path)
    ctx = _Context(path, _declarations(commands, path))
    n_inputs, n_outputs = _check_declarations(ctx, last_line)
    dnfs = [_dnf(ctx, _single_arg(ctx, c)) for c in commands if _head(c) == "assert"]
    common = [con for dnf in dnfs if len(dnf) == 1 for con in dnf[0]]
    terms = _conjoin([dnf for dnf in dnfs if len(dnf) > 1], ctx, last_line)
    if not any(v[0] == "Y" for term in [common, *terms] for con in term for v in con.coefs):
        raise ctx.error("no constraint on the outputs Y (the unsafe set is missing)", last_line)
    regions = _group_regions(ctx, common, terms, (n_inputs, n_outputs))
    return VnnlibProperty(path, n_inputs, n_outputs, regions)


def _tokenize(text: str) -> list[_Atom]:
    """Tokens ``(``, ``)`` and atoms with their 1-based line; ``;`` comments run to the line end."""
    return [
        _Atom(tok, number)
        for number, line in enumerate(text.split("\n"), start=1)
        for tok in _TOKEN.findall(line.split(";", 1)[0])
    ]


def _read_sexprs(text: str, path: str) -> tuple[list[_Node], int]:
    """Top-level S-expressions and the last line of the text; checks the parentheses."""
    stack: list[tuple[int, list[_Node]]] = [(0, [])]
    for tok in _tokenize(text):
        if tok.text == "(":
            stack.append((tok.line, []))
        elif tok.text == ")":
            if len(stack) == 1:
                raise SpecificationError("unbalanced ')'", path=path, line=tok.line)
            line, items = stack.pop()
            stack[-1][1].append(_List(tuple(items), line))
        else:
            stack[-1][1].append(tok)
    if len(stack) > 1:
        raise SpecificationError("unclosed '('", path=path, line=stack[-1][0])
    for node in stack[0][1]:
        if isinstance(node, _Atom):
            raise SpecificationError(f"unexpected {node.text!r} outside ( )", path, node.line)
    return stack[0][1], max(len(text.splitlines()), 1)


def _head(node: _Node) -> str | None:
    if isinstance(node, _List) and node.items and isinstance(node.items[0], _Atom):
        return node.items[0].text
    return None


def _declarations(commands: list[_Node], path: str) -> dict[tuple[str, int], int]:
    decls: dict[tuple[str, int], int] = {}
    for cmd in commands:
        head = _head(cmd)
        if head == "declare-const":
            items = cmd.items
            ok = len(items) == 3 and all(isinstance(t, _Atom) for t in items)
            if not ok or items[2].text != "Real":
                raise SpecificationError("expected (declare-const NAME Real)", path, cmd.line)
            match = _VAR.fullmatch(items[1].text)
            if match is None:
                msg = f"variable {items[1].text!r} is not named X_i or Y_j"
                raise SpecificationError(msg, path, items[1].line)
            var = (match.group(1), int(match.group(2)))
            if var in decls:
                raise SpecificationError(f"{items[1].text} declared twice", path, items[1].line)
            decls[var] = items[1].line
        elif head is None:
            raise SpecificationError("expected a command like (assert ...)", path, cmd.line)
        elif head not in ("assert", *_IGNORED):
            raise SpecificationError(f"unknown command {head!r}", path, cmd.items[0].line)
    return decls


def _check_declarations(ctx: _Context, last_line: int) -> tuple[int, int]:
    """Returns ``(n_inputs, n_outputs)``; the indices of each kind must be ``0..n-1``."""
    sizes = []
    for kind in ("X", "Y"):
        indices = sorted(i for k, i in ctx.decls if k == kind)
        if not indices:
            raise ctx.error(f"no {kind}_i variable declared", last_line)
        for expected, i in enumerate(indices):
            if i != expected:
                raise ctx.error(f"missing declaration of {kind}_{expected}", ctx.decls[(kind, i)])
        sizes.append(len(indices))
    return sizes[0], sizes[1]


def _single_arg(ctx: _Context, cmd: _List) -> _Node:
    if len(cmd.items) != 2:
        raise ctx.error("assert takes exactly one formula", cmd.line)
    return cmd.items[1]


def _dnf(ctx: _Context, node: _Node) -> list[list[_Constraint]]:
    """Disjunctive normal form of a formula: a list of terms, each a conjunction of constraints."""
    head = _head(node)
    if head is None:
        raise ctx.error("expected a formula (and/or/comparison)", node.line)
    args = node.items[1:]
    if head in ("and", "or") and not args:
        raise ctx.error(f"'{head}' without arguments", node.items[0].line)
    if head == "and":
        return _conjoin([_dnf(ctx, a) for a in args], ctx, node.items[0].line)
    if head == "or":
        terms = [t for a in args for t in _dnf(ctx, a)]
        if len(terms) > MAX_TERMS:
            raise ctx.error(f"disjunction has {len(terms)} terms (> {MAX_TERMS})", node.line)
        return terms
    if head in _COMPARISONS:
        return [_comparison(ctx, node)]
    raise ctx.error(f"unknown operator {head!r}", node.items[0].line)


def _conjoin(
    parts: list[list[list[_Constraint]]], ctx: _Context, line: int
) -> list[list[_Constraint]]:
    """AND of several DNFs: the cartesian product of their terms (at most ``MAX_TERMS``)."""
    common = [con for p in parts if len(p) == 1 for con in p[0]]  # cheap: no copying
    product: list[list[_Constraint]] = [common]
    count = 1
    for part in (p for p in parts if len(p) != 1):
        count *= len(part)
        if count > MAX_TERMS:
            msg = f"AND of disjunctions expands to more than {MAX_TERMS} terms"
            raise ctx.error(msg, line)
        product = [left + right for left in product for right in part]
    return product


def _comparison(ctx: _Context, node: _List) -> list[_Constraint]:
    """``(op a b ...)``, chained pairwise as in SMT-LIB, as constraints ``coefs . v <= bound``."""
    op, args = node.items[0], node.items[1:]
    if len(args) < 2:
        raise ctx.error(f"'{op.text}' needs at least two arguments", op.line)
    terms = [_linear(ctx, a) for a in args]
    constraints = []
    for left, right in itertools.pairwise(terms):
        diff = _combine(left, right, -1.0)  # left - right
        if op.text in ("<=", "<", "="):
            constraints.append(_to_constraint(ctx, diff, op.line))
        if op.text in (">=", ">", "="):
            constraints.append(_to_constraint(ctx, _scale(diff, -1.0), op.line))
    return constraints


def _to_constraint(ctx: _Context, expr: _Linear, line: int) -> _Constraint:
    """``expr <= 0`` as ``coefs . v <= -const``; a constraint needs a variable."""
    coefs = {v: c for v, c in expr.coefs.items() if c != 0.0}
    if not coefs:
        raise ctx.error("comparison without variables (constant or cancelling terms)", line)
    return _Constraint(coefs, 0.0 - expr.const + 0.0, line)  # + 0.0: no -0.0


def _combine(a: _Linear, b: _Linear, scale: float) -> _Linear:
    """``a + scale * b``."""
    coefs = dict(a.coefs)
    for v, c in b.coefs.items():
        coefs[v] = coefs.get(v, 0.0) + scale * c
    return _Linear(coefs, a.const + scale * b.const)


def _scale(a: _Linear, factor: float) -> _Linear:
    return _Linear({v: factor * c for v, c in a.coefs.items()}, factor * a.const)


def _linear(ctx: _Context, node: _Node) -> _Linear:
    """A linear term: number, declared variable, or ``+``, ``-``, ``*``, ``/`` over terms."""
    if isinstance(node, _Atom):
        return _atom_value(ctx, node)
    head = _head(node)
    if head is None:
        raise ctx.error("expected a term", node.line)
    op, args = node.items[0], [_linear(ctx, a) for a in node.items[1:]]
    if not args:
        raise ctx.error(f"'{head}' without arguments", op.line)
    if head == "+":
        total = _Linear({}, 0.0)
        for a in args:
            total = _combine(total, a, 1.0)
        return total
    if head == "-":
        if len(args) == 1:
            return _scale(args[0], -1.0)
        total = args[0]
        for a in args[1:]:
            total = _combine(total, a, -1.0)
        return total
    if head == "*":
        return _product(ctx, args, op.line)
    if head == "/":
        return _quotient(ctx, args, op.line)
    raise ctx.error(f"unknown operator {head!r}", op.line)


def _product(ctx: _Context, args: list[_Linear], line: int) -> _Linear:
    variable = [a for a in args if a.coefs]
    if len(variable) > 1:
        raise ctx.error("non-linear term: product of variables", line)
    factor = math.prod(a.const for a in args if not a.coefs)
    return _scale(variable[0], factor) if variable else _Linear({}, factor)


def _quotient(ctx: _Context, args: list[_Linear], line: int) -> _Linear:
    if len(args) < 2 or any(a.coefs for a in args[1:]):
        raise ctx.error("'/' needs a term divided by nonzero constants", line)
    divisor = math.prod(a.const for a in args[1:])
    if divisor == 0.0:
        raise ctx.error("division by zero", line)
    return _scale(args[0], 1.0 / divisor)


def _atom_value(ctx: _Context, tok: _Atom) -> _Linear:
    if _NUMBER.fullmatch(tok.text):
        value = float(tok.text)
        if not math.isfinite(value):
            raise ctx.error(f"constant {tok.text!r} overflows float64", tok.line)
        return _Linear({}, value)
    match = _VAR.fullmatch(tok.text)
    if match is not None and (match.group(1), int(match.group(2))) in ctx.decls:
        return _Linear({(match.group(1), int(match.group(2))): 1.0}, 0.0)
    if match is not None or _IDENT.fullmatch(tok.text):
        raise ctx.error(f"undeclared variable {tok.text!r}", tok.line)
    raise ctx.error(f"non-numeric constant {tok.text!r}", tok.line)


def _is_bound(con: _Constraint) -> bool:
    """Whether the constraint bounds a single input by a constant."""
    return len(con.coefs) == 1 and next(iter(con.coefs))[0] == "X"


def _tighten(ctx: _Context, term: list[_Constraint], lower: np.ndarray, upper: np.ndarray) -> None:
    """Intersects the box ``[lower, upper]`` (changed in place) with the bounds in ``term``."""
    for con in filter(_is_bound, term):
        ((_, i), coef) = next(iter(con.coefs.items()))
        value = con.bound / coef
        if coef > 0:
            upper[i] = min(upper[i], value)
        else:
            lower[i] = max(lower[i], value)
        if lower[i] > upper[i]:
            msg = f"empty input box: X_{i} has lower {lower[i]!r} > upper {upper[i]!r}"
            raise ctx.error(msg, con.line)


def _check_box(ctx: _Context, lower: np.ndarray, upper: np.ndarray) -> None:
    """Every input needs a finite lower and upper bound (error at its declaration)."""
    for side, values in (("lower", lower), ("upper", upper)):
        missing = np.flatnonzero(~np.isfinite(values))
        if missing.size:
            i = int(missing[0])
            raise ctx.error(f"input X_{i} has no {side} bound", ctx.decls[("X", i)])


def _polytope(rows: list[_Constraint], n_inputs: int, n_outputs: int) -> Polytope:
    """Constraints (none a single-input bound) as ``A y + A_x x <= b``."""
    A = np.zeros((len(rows), n_outputs))
    A_x = np.zeros((len(rows), n_inputs))
    for r, con in enumerate(rows):
        for (kind, i), coef in con.coefs.items():
            (A if kind == "Y" else A_x)[r, i] += coef
    b = np.array([con.bound for con in rows], dtype=np.float64)
    return Polytope(A, b, A_x if np.any(A_x) else None)


def _group_regions(
    ctx: _Context,
    common: list[_Constraint],
    terms: list[list[_Constraint]],
    sizes: tuple[int, int],
) -> tuple[Region, ...]:
    """Regions of ``common AND (term_1 OR term_2 ...)``, one per distinct input box.

    ``sizes`` is ``(n_inputs, n_outputs)``; regions keep the order of first appearance.
    """
    base_lower, base_upper = np.full(sizes[0], -np.inf), np.full(sizes[0], np.inf)
    _tighten(ctx, common, base_lower, base_upper)
    base_rows = [con for con in common if not _is_bound(con)]
    groups: dict[bytes, tuple[np.ndarray, np.ndarray, list[Polytope]]] = {}
    for term in terms:
        lower, upper = base_lower.copy(), base_upper.copy()
        _tighten(ctx, term, lower, upper)
        _check_box(ctx, lower, upper)
        rows = base_rows + [con for con in term if not _is_bound(con)]
        group = groups.setdefault(lower.tobytes() + upper.tobytes(), (lower, upper, []))
        group[2].append(_polytope(rows, *sizes))
    return tuple(Region(lower, upper, tuple(polys)) for lower, upper, polys in groups.values())


__all__ = ["MAX_TERMS", "Polytope", "Region", "VnnlibProperty", "load_vnnlib", "parse_vnnlib"]
