"""Reader for VNN-LIB 1.0 property files (``.vnnlib`` and ``.vnnlib.gz``).

A VNN-LIB file states the *unsafe* set of a network ``y = f(x)``: the property holds (the solver
answers ``unsat``) iff no input ``x`` in the input region reaches an output ``y`` in the unsafe
set. Format: http://www.vnnlib.org (VNN-LIB 1.0, an SMT-LIB 2 subset over the reals).

The formula (the conjunction of all ``assert`` commands) is brought to disjunctive normal form
(DNF); each DNF term is split into the bounds of single inputs (``X_i <= c``, ``c <= X_i``), which
give an input box, and its other linear constraints, which give a polytope ``A y + A_x x <= b``.
Terms with the same box are grouped into one :class:`Region`, so ACAS Xu property 6 (two input
boxes, four output polytopes) becomes two regions of four polytopes each.

Supported: UTF-8 text (a leading byte-order mark is skipped); lines ending in ``\\n``, ``\\r\\n``
or ``\\r``, mixed too (line numbers count each as one break); comments ``;`` to the end of the
line; ``(declare-const X_i Real)`` / ``(declare-const Y_j Real)`` with indices ``0..n-1``, each
before its first use; ``assert`` over ``and``, ``or`` (nested up to :data:`MAX_DEPTH` levels: one
iterative pass, no recursion), ``<=``, ``>=``, ``<``, ``>`` (strict comparisons are read as
non-strict: the closure of the unsafe set is checked, which is sound for verification) and ``=``
(two inequalities); comparisons with more than two arguments chain as in SMT-LIB; linear terms:
finite numbers (``-0.5``, ``1e-3``), ``(- 0.5)``, variables, ``(+ a b ...)``, ``(- a b ...)``,
``(- a)``, ``(* c ... v)`` with at most one non-constant factor, ``(/ a c)``. ``check-sat``,
``get-model``, ``exit``, ``set-logic``, ``set-info`` and ``set-option`` are ignored.

Conventions: a constraint over several inputs and no output is kept in the polytope (zero row of
``A``, the coefficients in ``A_x``); a DNF term with no output constraint gives a polytope with zero
rows (all of ``R^n_outputs``: every input of its box is unsafe); several bounds on one input
intersect; an empty box (lower > upper) is an error even inside a disjunction. Rows keep the order
of the file (common asserts first). Every malformed input raises
:class:`verify.errors.SpecificationError` (never another exception) with the path and the 1-based
line of the offending token (for a missing bound: the declaration of the input; for a missing
unsafe set or a too large expansion: the last line; none for an unreadable or empty file). Limits
against hostile files: :data:`MAX_BYTES`, :data:`MAX_DEPTH`, :data:`MAX_TERMS`, :data:`MAX_STEPS`,
:data:`MAX_ENTRIES`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from typing import NamedTuple

from verify.errors import SpecificationError
from verify.io.vnnlib_common import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_STEPS,
    MAX_TERMS,
    Constraint,
    Context,
    Dnf,
    check_length,
    conjoin,
    constrains_outputs,
    disjoin,
    dnf_terms,
    group_regions,
    line_count,
)
from verify.property import Polytope, Region, VnnlibProperty

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_TOKEN = re.compile(r"\(|\)|[^\s();]+")
_FAST_TOKEN = re.compile(r"\(\s*(<=|>=)\s+([^\s();]+)\s+([^\s();]+)\s*\)|\(|\)|[^\s();]+")
FAST_COMPARISONS = True
"""Read `(<= V c)` and `(>= V c)` in one step (`_bound`); False: token by token (tests)."""
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_NOT_FINITE = ("nan", "inf", "infinity")
_IDENT = re.compile(r"[A-Za-z_][\w.!?$%&*+<=>@^~-]*")
_VAR = re.compile(r"([XY])_(0|[1-9][0-9]{0,8})")
_COMPARISONS = ("<=", ">=", "<", ">", "=")
_CONNECTIVES = ("and", "or")
_ARITHMETIC = ("+", "-", "*", "/")
_IGNORED = ("check-sat", "get-model", "exit", "set-logic", "set-info", "set-option")
_NO_HEAD = {
    "command": "expected a command like (assert ...)",
    "formula": "expected a formula (and/or/comparison)",
    "term": "expected a term",
}
_HEADS = {
    "command": ("assert", "declare-const", *_IGNORED),
    "formula": (*_CONNECTIVES, *_COMPARISONS),
    "term": _ARITHMETIC,
}


class _Atom(NamedTuple):
    text: str
    line: int


class _Linear(NamedTuple):
    """``sum coefs[v] * v + const``; a variable is ``("X", i)`` or ``("Y", j)``."""

    coefs: dict[tuple[str, int], float]
    const: float


class _Frame:
    """An open ``(``: what its items are (``kind``), its first atom and the values of the rest."""

    __slots__ = ("head", "kind", "line", "values")

    def __init__(self, kind: str, line: int) -> None:
        self.kind, self.line, self.head, self.values = kind, line, None, []


def parse_vnnlib(
    text: str, path: str = "<string>", deadline: float | None = None
) -> VnnlibProperty:
    """Parse VNN-LIB 1.0 text; ``path`` is only used in error messages and the result.
    ``deadline`` (``time.monotonic()``): `ParseDeadlineError` once it passes while reading."""
    if not isinstance(text, str):
        raise SpecificationError(f"expected text (str), got {type(text).__name__}", path=path)
    check_length(text, path)
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise SpecificationError("empty specification (no declarations, no assertions)", path)
    ctx, last_line = Context(path, deadline=deadline), line_count(text)
    dnfs = _read_asserts(ctx, text, last_line)
    n_inputs, n_outputs = _check_declarations(ctx, last_line)
    common, terms = dnf_terms(ctx, dnfs, last_line)
    if not constrains_outputs(common, terms):
        raise ctx.error("no constraint on the outputs Y (the unsafe set is missing)", last_line)
    regions = group_regions(ctx, common, terms, (n_inputs, n_outputs), last_line)
    return VnnlibProperty(path, n_inputs, n_outputs, regions)


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text`` without their breaks, comments (``;`` to the line end) cut off."""
    start = 0
    for match in _LINE_BREAK.finditer(text):
        line = text[start : match.start()]
        yield line[: line.find(";")] if ";" in line else line
        start = match.end()
    line = text[start:]
    yield line[: line.find(";")] if ";" in line else line


def _show(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def _read_asserts(ctx: Context, text: str, lines: int) -> list[Dnf]:
    """One pass over the tokens of the `lines` lines: declarations are recorded, each assert
    becomes a DNF; paced against the deadline per line (`Context.check_pace`).

    A stack of open ``(`` replaces recursion; each list is reduced to its value (a DNF for a
    formula, a ``_Linear`` for a term) when its ``)`` is read, so no syntax tree is kept.
    """
    stack = [_Frame("top", 0)]
    pattern = _FAST_TOKEN if FAST_COMPARISONS else _TOKEN
    for number, line in enumerate(_lines(text), start=1):
        ctx.check_pace(number, lines)  # each line (one may hold a whole region)
        for match in pattern.finditer(line):
            if match.lastindex and _bound(ctx, stack, match, number):
                continue
            for tok in _TOKEN.findall(match.group(0)) if match.lastindex else (match.group(0),):
                _token(ctx, stack, tok, number)
    if len(stack) > 1:
        raise ctx.error("unclosed '('", stack[-1].line)
    return stack[0].values


def _token(ctx: Context, stack: list[_Frame], tok: str, number: int) -> None:
    """One token read on line `number`: opens or closes a list, or is an atom of the top one."""
    if tok == "(":
        ctx.nest(len(stack), number)
        stack.append(_open(ctx, stack[-1], number))
    elif tok == ")":
        if len(stack) == 1:
            raise ctx.error("unbalanced ')'", number)
        value = _close(ctx, stack.pop())
        if value is not None:
            stack[-1].values.append(value)
    else:
        _atom(ctx, stack[-1], _Atom(tok, number))


def _bound(ctx: Context, stack: list[_Frame], match: re.Match, number: int) -> bool:
    """The fast path of `(<= V c)` / `(>= V c)`, a declared variable and a finite number, as
    an argument of `and` / `or` / `assert` (most of a large file): its DNF, the same
    `Constraint` the general path builds (`_comparison`), without a frame. False (nothing
    done) for any other form: the general path then reads the same text, with its errors."""
    parent = stack[-1]
    head = parent.head.text if parent.kind == "formula" and parent.head else None
    if head not in ("and", "or") and not (head == "assert" and not parent.values):
        return False
    op, name, number_text = match.group(1), match.group(2), match.group(3)
    var = ctx.names.get(name)
    if var is None or not _NUMBER.fullmatch(number_text):
        return False
    value = float(number_text)
    if not math.isfinite(value):
        return False
    ctx.nest(len(stack), number)
    # `_to_constraint` of left - right, inlined (calling it costs a quarter of reading a large
    # file: 9.2 s against 7.3 s on nn4sys cardinality_1_2260): the same float operations in the
    # same order, and nothing to check (one variable, a finite number).
    const = 0.0 + -1.0 * value
    sign = 1.0 if op == "<=" else -1.0
    parent.values.append([(Constraint({var: sign * 1.0}, 0.0 - sign * const + 0.0, number),)])
    return True


def _open(ctx: Context, parent: _Frame, line: int) -> _Frame:
    """The frame of a ``(`` opened inside ``parent``."""
    if parent.kind in ("top", "skip"):
        return _Frame("command" if parent.kind == "top" else "skip", line)
    if parent.head is None:
        raise ctx.error(_NO_HEAD[parent.kind], parent.line)
    op = parent.head.text
    if op == "declare-const":
        raise ctx.error("expected (declare-const NAME Real)", parent.line)
    if op == "assert" and parent.values:
        raise ctx.error("assert takes exactly one formula", parent.line)
    return _Frame("formula" if op in ("assert", *_CONNECTIVES) else "term", line)


def _atom(ctx: Context, frame: _Frame, tok: _Atom) -> None:
    """Records an atom read inside ``frame``: its head, or the value of an argument."""
    kind = frame.kind
    if kind == "skip":
        return
    if kind == "top":
        raise ctx.error(f"unexpected {_show(tok.text)} outside ( )", tok.line)
    if frame.head is None:
        if tok.text not in _HEADS[kind]:
            what = "command" if kind == "command" else "operator"
            raise ctx.error(f"unknown {what} {_show(tok.text)}", tok.line)
        frame.head = tok
        frame.kind = "skip" if tok.text in _IGNORED else kind
    elif frame.head.text == "declare-const":
        frame.values.append(tok)
    elif frame.head.text == "assert" and frame.values:
        raise ctx.error("assert takes exactly one formula", frame.line)
    elif frame.head.text in ("assert", *_CONNECTIVES):
        raise ctx.error(_NO_HEAD["formula"], tok.line)
    else:
        frame.values.append(_atom_value(ctx, tok))


def _close(ctx: Context, frame: _Frame) -> Dnf | _Linear | None:
    """The value of a closed list: a DNF, a ``_Linear``, or None (a command)."""
    if frame.kind == "skip":
        return None
    if frame.head is None:
        raise ctx.error(_NO_HEAD[frame.kind], frame.line)
    op, args = frame.head, frame.values
    if op.text == "declare-const":
        _declare(ctx, frame)
        return None
    if op.text == "assert":
        if not args:
            raise ctx.error("assert takes exactly one formula", frame.line)
        return args[0]
    if op.text in _CONNECTIVES:
        if not args:
            raise ctx.error(f"'{op.text}' without arguments", op.line)
        if op.text == "and":
            return conjoin(ctx, args, op.line)
        return disjoin(ctx, args, frame.line)
    if op.text in _COMPARISONS:
        return [tuple(_comparison(ctx, op, args))]
    return _arithmetic(ctx, op, args)


def _declare(ctx: Context, frame: _Frame) -> None:
    items = frame.values
    if len(items) != 2 or items[1].text != "Real":
        raise ctx.error("expected (declare-const NAME Real)", frame.line)
    name = items[0]
    match = _VAR.fullmatch(name.text)
    if match is None:
        raise ctx.error(f"variable {_show(name.text)} is not named X_i or Y_j", name.line)
    var = (match.group(1), int(match.group(2)))
    if var in ctx.decls:
        first = ctx.decls[var]
        raise ctx.error(f"{name.text} declared twice (first on line {first})", name.line)
    ctx.decls[var] = name.line
    ctx.names[name.text] = var


def _check_declarations(ctx: Context, last_line: int) -> tuple[int, int]:
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


def _comparison(ctx: Context, op: _Atom, args: list[_Linear]) -> list[Constraint]:
    """``(op a b ...)``, chained pairwise as in SMT-LIB, as constraints ``coefs . v <= bound``."""
    if len(args) < 2:
        raise ctx.error(f"'{op.text}' needs at least two arguments", op.line)
    constraints = []
    for left, right in itertools.pairwise(args):
        coefs = dict(left.coefs)
        for v, c in right.coefs.items():
            coefs[v] = coefs.get(v, 0.0) + -1.0 * c
        diff = _Linear(coefs, left.const + -1.0 * right.const)  # left - right
        if op.text in ("<=", "<", "="):
            constraints.append(_to_constraint(ctx, diff, 1.0, op.line))
        if op.text in (">=", ">", "="):
            constraints.append(_to_constraint(ctx, diff, -1.0, op.line))
    return constraints


def _to_constraint(ctx: Context, expr: _Linear, sign: float, line: int) -> Constraint:
    """``sign * expr <= 0`` as ``coefs . v <= -const``; a constraint needs a variable."""
    coefs = {v: sign * c for v, c in expr.coefs.items() if c != 0.0}
    if not coefs:
        raise ctx.error("comparison without variables (constant or cancelling terms)", line)
    bound = 0.0 - sign * expr.const + 0.0  # + 0.0: no -0.0
    if not (math.isfinite(bound) and all(map(math.isfinite, coefs.values()))):
        raise ctx.error("arithmetic overflow in the comparison (not a finite number)", line)
    return Constraint(coefs, bound, line)


def _arithmetic(ctx: Context, op: _Atom, args: list[_Linear]) -> _Linear:
    """``(+ ...)``, ``(- ...)``, ``(* ...)`` or ``(/ ...)`` of already evaluated arguments."""
    if not args:
        raise ctx.error(f"'{op.text}' without arguments", op.line)
    if op.text == "+":
        result = args[0]
        for a in args[1:]:  # the smaller dict goes into the larger (a + b == b + a exactly)
            big, small = (result, a) if len(result.coefs) >= len(a.coefs) else (a, result)
            ctx.spend(len(small.coefs) + 1, op.line)
            for v, c in small.coefs.items():
                big.coefs[v] = big.coefs.get(v, 0.0) + c
            result = _Linear(big.coefs, result.const + a.const)
    elif op.text == "-" and len(args) == 1:
        result = _scale(ctx, args[0], -1.0, op.line)
    elif op.text == "-":
        result = args[0]
        for a in args[1:]:
            ctx.spend(len(a.coefs) + 1, op.line)
            for v, c in a.coefs.items():
                result.coefs[v] = result.coefs.get(v, 0.0) + -1.0 * c
            result = _Linear(result.coefs, result.const + -1.0 * a.const)
    elif op.text == "*":
        variable = [a for a in args if a.coefs]
        if len(variable) > 1:
            raise ctx.error("non-linear term: product of variables", op.line)
        factor = math.prod(a.const for a in args if not a.coefs)
        result = _scale(ctx, variable[0], factor, op.line) if variable else _Linear({}, factor)
    else:
        if len(args) < 2 or any(a.coefs for a in args[1:]):
            raise ctx.error("'/' needs a term divided by nonzero constants", op.line)
        divisor = math.prod(a.const for a in args[1:])
        if divisor == 0.0:
            raise ctx.error("division by zero", op.line)
        result = _scale(ctx, args[0], 1.0 / divisor, op.line)
    if not (math.isfinite(result.const) and all(map(math.isfinite, result.coefs.values()))):
        raise ctx.error(f"arithmetic overflow in '{op.text}' (not a finite number)", op.line)
    return result


def _scale(ctx: Context, a: _Linear, factor: float, line: int) -> _Linear:
    """``factor * a``, reusing the (owned) dict of ``a``."""
    ctx.spend(len(a.coefs) + 1, line)
    for v, c in a.coefs.items():
        a.coefs[v] = factor * c
    return _Linear(a.coefs, factor * a.const)


def _atom_value(ctx: Context, tok: _Atom) -> _Linear:
    var = ctx.names.get(tok.text)
    if var is not None:
        return _Linear({var: 1.0}, 0.0)
    if _NUMBER.fullmatch(tok.text):
        value = float(tok.text)
        if not math.isfinite(value):
            raise ctx.error(f"constant {_show(tok.text)} overflows float64", tok.line)
        return _Linear({}, value)
    if tok.text.lstrip("+-").lower() in _NOT_FINITE:
        raise ctx.error(f"constant {_show(tok.text)} is not a finite number", tok.line)
    if _VAR.fullmatch(tok.text) or _IDENT.fullmatch(tok.text):
        raise ctx.error(f"undeclared variable {_show(tok.text)}", tok.line)
    raise ctx.error(f"non-numeric constant {_show(tok.text)}", tok.line)


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_STEPS",
    "MAX_TERMS",
    "Polytope",
    "Region",
    "VnnlibProperty",
    "parse_vnnlib",
]
