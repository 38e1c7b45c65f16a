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

import gzip
import io
import itertools
import math
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from verify.errors import SpecificationError
from verify.property import Polytope, Region, VnnlibProperty

MAX_TERMS = 10_000
"""Largest number of DNF terms we expand to before raising (guards the cartesian product)."""
MAX_BYTES = 128 * 2**20
"""Largest file (and decompressed text) we read, in bytes (characters for :func:`parse_vnnlib`)."""
MAX_STEPS = 10_000_000
"""Largest number of elementary steps (term copies, coefficient updates) spent on the formula."""
MAX_ENTRIES = 2**25
"""Largest expanded result: constraints over all DNF terms, and entries of all boxes and matrices."""
MAX_DEPTH = 100_000
"""Deepest nesting of parentheses we accept (each open one holds memory until it is closed)."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_TOKEN = re.compile(r"\(|\)|[^\s();]+")
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
_GZIP_MAGIC = b"\x1f\x8b"
_V2_FORM = re.compile(r"\(\s*(vnnlib-version|declare-network)\b")


def is_vnnlib2(text: str) -> bool:
    """Whether VNN-LIB text is 2.0: it has a ``(vnnlib-version`` or ``(declare-network`` form
    outside comments (neither is valid 1.0). Cheap: stops at the first one found."""
    return any(_V2_FORM.search(line.split(";", 1)[0]) for line in text.splitlines())


class _Atom(NamedTuple):
    text: str
    line: int


class _Linear(NamedTuple):
    """``sum coefs[v] * v + const``; a variable is ``("X", i)`` or ``("Y", j)``."""

    coefs: dict[tuple[str, int], float]
    const: float


class _Constraint(NamedTuple):
    """``sum coefs[v] * v <= bound``, from the token on ``line``."""

    coefs: dict[tuple[str, int], float]
    bound: float
    line: int


# A DNF term (a conjunction) is a tree of tuples whose leaves are _Constraint: ``and`` nests its
# parts instead of copying them; `_flatten` lists the constraints once, at the end. A DNF is a
# list of terms, owned by the one parent that consumes it (so it may be extended in place).
_Term = tuple
_Dnf = list


class _Frame:
    """An open ``(``: what its items are (``kind``), its first atom and the values of the rest."""

    __slots__ = ("head", "kind", "line", "values")

    def __init__(self, kind: str, line: int) -> None:
        self.kind, self.line, self.head, self.values = kind, line, None, []


@dataclass
class _Context:
    path: str
    decls: dict[tuple[str, int], int] = field(default_factory=dict)  # variable -> its line
    names: dict[str, tuple[str, int]] = field(default_factory=dict)  # "X_3" -> ("X", 3)
    steps: int = 0

    def error(self, message: str, line: int | None) -> SpecificationError:
        return SpecificationError(message, path=self.path, line=line)

    def spend(self, steps: int, line: int) -> None:
        """Counts work against :data:`MAX_STEPS` (guards quadratic nesting in hostile files)."""
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise self.error(f"formula too large to expand (> {MAX_STEPS} steps)", line)


def read_text(path: str | os.PathLike) -> tuple[str, str]:
    """``(name, text)`` of a VNN-LIB file, gzip-compressed or not (by magic bytes or ``.gz``);
    unreadable, oversized, corrupt or non-UTF-8 files raise SpecificationError."""
    try:
        name = os.fsdecode(path)
    except TypeError as exc:
        raise SpecificationError(f"expected a file path, got {type(path).__name__}") from exc
    raw = _read_file(name)
    if raw[:2] == _GZIP_MAGIC or name.endswith(".gz"):
        raw = _gunzip(raw, name)
    return name, _decode(raw, name)


def load_vnnlib(path: str | os.PathLike) -> VnnlibProperty:
    """Read a ``.vnnlib`` file, gzip-compressed or not (detected by magic bytes or ``.gz``)."""
    name, text = read_text(path)
    if is_vnnlib2(text):
        from verify.io.vnnlib2 import parse_vnnlib2  # lazy: verify.io.vnnlib2 imports this module

        return parse_vnnlib2(text, path=name)
    return parse_vnnlib(text, path=name)


def _read_file(name: str) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_BYTES` (never blocks on a FIFO)."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError as exc:
        raise SpecificationError("no such file", path=name) from exc
    except (OSError, ValueError) as exc:  # permissions, bad names (NUL byte), ...
        is_dir = isinstance(exc, IsADirectoryError)
        msg = "is a directory, not a VNN-LIB file" if is_dir else f"cannot read the file ({exc})"
        raise SpecificationError(msg, path=name) from exc
    _check_regular(fd, name)
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_BYTES + 1)
        except OSError as exc:
            raise SpecificationError(f"cannot read the file ({exc})", path=name) from exc
    if len(raw) > MAX_BYTES:
        raise SpecificationError(f"file is larger than {MAX_BYTES} bytes", path=name)
    if not raw:
        raise SpecificationError("file is empty", path=name)
    return raw


def _check_regular(fd: int, name: str) -> None:
    """Closes ``fd`` and raises unless it is a regular file (not a directory, FIFO, device)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return
    os.close(fd)
    what = "is a directory, not a VNN-LIB file" if stat.S_ISDIR(mode) else "not a regular file"
    raise SpecificationError(what, path=name)


def _gunzip(raw: bytes, name: str) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            data = f.read(MAX_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise SpecificationError(f"not a valid gzip file ({exc})", path=name) from exc
    if len(data) > MAX_BYTES:
        raise SpecificationError(f"decompresses to more than {MAX_BYTES} bytes", path=name)
    return data


def _decode(raw: bytes, name: str) -> str:
    """UTF-8 text; on a bad byte, the error names its line (same line breaks as the parser)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        byte = raw[exc.start]
        msg = f"not UTF-8 text: byte 0x{byte:02x} ({exc.reason})"
        raise SpecificationError(msg, path=name, line=line) from exc


def parse_vnnlib(text: str, path: str = "<string>") -> VnnlibProperty:
    """Parse VNN-LIB text; ``path`` is only used in error messages and the result."""
    if not isinstance(text, str):
        raise SpecificationError(f"expected text (str), got {type(text).__name__}", path=path)
    if len(text) > MAX_BYTES:
        raise SpecificationError(f"text is longer than {MAX_BYTES} characters", path=path)
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise SpecificationError("empty specification (no declarations, no assertions)", path)
    ctx, last_line = _Context(path), _line_count(text)
    dnfs = _read_asserts(ctx, text)
    n_inputs, n_outputs = _check_declarations(ctx, last_line)
    common = _flatten(ctx, [tuple(dnf[0] for dnf in dnfs if len(dnf) == 1)], last_line)[0]
    terms = _conjoin(ctx, [dnf for dnf in dnfs if len(dnf) > 1], last_line)
    terms = _flatten(ctx, terms, last_line)
    if not any(v[0] == "Y" for term in [common, *terms] for con in term for v in con.coefs):
        raise ctx.error("no constraint on the outputs Y (the unsafe set is missing)", last_line)
    regions = _group_regions(ctx, common, terms, (n_inputs, n_outputs), last_line)
    return VnnlibProperty(path, n_inputs, n_outputs, regions)


def _line_count(text: str) -> int:
    """Number of lines, as in ``str.splitlines`` restricted to ``\\n``, ``\\r\\n``, ``\\r``."""
    breaks = text.count("\n") + text.count("\r") - text.count("\r\n")
    return max(breaks + (0 if text.endswith(("\n", "\r")) else 1), 1)


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


def _read_asserts(ctx: _Context, text: str) -> list[_Dnf]:
    """One pass over the tokens: declarations are recorded, each assert becomes a DNF.

    A stack of open ``(`` replaces recursion; each list is reduced to its value (a DNF for a
    formula, a ``_Linear`` for a term) when its ``)`` is read, so no syntax tree is kept.
    """
    stack = [_Frame("top", 0)]
    for number, line in enumerate(_lines(text), start=1):
        for tok in _TOKEN.findall(line):
            if tok == "(":
                if len(stack) > MAX_DEPTH:
                    raise ctx.error(f"parentheses nested deeper than {MAX_DEPTH}", number)
                stack.append(_open(ctx, stack[-1], number))
            elif tok == ")":
                if len(stack) == 1:
                    raise ctx.error("unbalanced ')'", number)
                value = _close(ctx, stack.pop())
                if value is not None:
                    stack[-1].values.append(value)
            else:
                _atom(ctx, stack[-1], _Atom(tok, number))
    if len(stack) > 1:
        raise ctx.error("unclosed '('", stack[-1].line)
    return stack[0].values


def _open(ctx: _Context, parent: _Frame, line: int) -> _Frame:
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


def _atom(ctx: _Context, frame: _Frame, tok: _Atom) -> None:
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


def _close(ctx: _Context, frame: _Frame) -> _Dnf | _Linear | None:
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
            return _conjoin(ctx, args, op.line)
        return _disjoin(ctx, args, frame.line)
    if op.text in _COMPARISONS:
        return [tuple(_comparison(ctx, op, args))]
    return _arithmetic(ctx, op, args)


def _declare(ctx: _Context, frame: _Frame) -> None:
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


def _conjoin(ctx: _Context, parts: list[_Dnf], line: int) -> _Dnf:
    """AND of several DNFs: the cartesian product of their terms (at most ``MAX_TERMS``).

    Single-term parts come first in every term, then one term of each other part, in order.
    """
    singles = tuple(p[0] for p in parts if len(p) == 1)
    multi = [p for p in parts if len(p) != 1]
    if not singles and len(multi) == 1:
        return multi[0]
    count = 1
    for part in multi:
        count *= len(part)
        if count > MAX_TERMS:
            raise ctx.error(f"AND of disjunctions expands to more than {MAX_TERMS} terms", line)
    ctx.spend(count * (len(multi) + 1), line)
    return [(singles, *combo) for combo in itertools.product(*multi)]


def _disjoin(ctx: _Context, parts: list[_Dnf], line: int) -> _Dnf:
    """OR of several DNFs: their terms in order (the longest list is extended in place)."""
    total = sum(map(len, parts))
    if total > MAX_TERMS:
        raise ctx.error(f"disjunction has {total} terms (> {MAX_TERMS})", line)
    big = max(range(len(parts)), key=lambda k: len(parts[k]))
    terms = parts[big]
    ctx.spend(total - len(terms), line)
    terms[:0] = itertools.chain.from_iterable(parts[:big])
    terms.extend(itertools.chain.from_iterable(parts[big + 1 :]))
    return terms


def _flatten(ctx: _Context, terms: _Dnf, line: int) -> list[list[_Constraint]]:
    """The constraints of each term in order; their total is at most :data:`MAX_ENTRIES`."""
    out, total = [], 0
    for term in terms:
        flat: list[_Constraint] = []
        stack: list = [term]
        while stack:
            node = stack.pop()
            if isinstance(node, _Constraint):
                flat.append(node)
            else:
                stack.extend(reversed(node))
        total += len(flat)
        if total > MAX_ENTRIES:
            raise ctx.error(f"DNF expands to more than {MAX_ENTRIES} constraints", line)
        out.append(flat)
    return out


def _comparison(ctx: _Context, op: _Atom, args: list[_Linear]) -> list[_Constraint]:
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


def _to_constraint(ctx: _Context, expr: _Linear, sign: float, line: int) -> _Constraint:
    """``sign * expr <= 0`` as ``coefs . v <= -const``; a constraint needs a variable."""
    coefs = {v: sign * c for v, c in expr.coefs.items() if c != 0.0}
    if not coefs:
        raise ctx.error("comparison without variables (constant or cancelling terms)", line)
    bound = 0.0 - sign * expr.const + 0.0  # + 0.0: no -0.0
    if not (math.isfinite(bound) and all(map(math.isfinite, coefs.values()))):
        raise ctx.error("arithmetic overflow in the comparison (not a finite number)", line)
    return _Constraint(coefs, bound, line)


def _arithmetic(ctx: _Context, op: _Atom, args: list[_Linear]) -> _Linear:
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


def _scale(ctx: _Context, a: _Linear, factor: float, line: int) -> _Linear:
    """``factor * a``, reusing the (owned) dict of ``a``."""
    ctx.spend(len(a.coefs) + 1, line)
    for v, c in a.coefs.items():
        a.coefs[v] = factor * c
    return _Linear(a.coefs, factor * a.const)


def _atom_value(ctx: _Context, tok: _Atom) -> _Linear:
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


def _is_bound(con: _Constraint) -> bool:
    """Whether the constraint bounds a single input by a constant."""
    return len(con.coefs) == 1 and next(iter(con.coefs))[0] == "X"


def _x_name(i: int) -> str:
    return f"X_{i}"


def _tighten(
    ctx: _Context,
    term: list[_Constraint],
    lower: np.ndarray,
    upper: np.ndarray,
    name: Callable[[int], str] = _x_name,
) -> None:
    """Intersects the box ``[lower, upper]`` (changed in place) with the bounds in ``term``;
    ``name(i)`` spells input ``i`` in messages."""
    for con in filter(_is_bound, term):
        ((_, i), coef) = next(iter(con.coefs.items()))
        value = con.bound / coef
        if not math.isfinite(value):
            raise ctx.error(f"bound on {name(i)} overflows float64", con.line)
        if coef > 0:
            upper[i] = min(upper[i], value)
        else:
            lower[i] = max(lower[i], value)
        if lower[i] > upper[i]:
            msg = f"empty input box: {name(i)} has lower {lower[i]!r} > upper {upper[i]!r}"
            raise ctx.error(msg, con.line)


def _check_box(
    ctx: _Context,
    lower: np.ndarray,
    upper: np.ndarray,
    name: Callable[[int], str],
    line: Callable[[int], int],
) -> None:
    """Every input needs a finite lower and upper bound (the error at ``line(i)``)."""
    for side, values in (("lower", lower), ("upper", upper)):
        missing = np.flatnonzero(~np.isfinite(values))
        if missing.size:
            i = int(missing[0])
            raise ctx.error(f"input {name(i)} has no {side} bound", line(i))


def _polytope(rows: list[_Constraint], n_inputs: int, n_outputs: int) -> Polytope:
    """Constraints (none a single-input bound) as ``A y + A_x x <= b``."""
    mixed = any(kind == "X" for con in rows for kind, _ in con.coefs)
    A = np.zeros((len(rows), n_outputs))
    A_x = np.zeros((len(rows), n_inputs)) if mixed else None
    for r, con in enumerate(rows):
        for (kind, i), coef in con.coefs.items():
            (A if kind == "Y" else A_x)[r, i] += coef
    b = np.array([con.bound for con in rows], dtype=np.float64)
    return Polytope(A, b, A_x)


def _group_regions(
    ctx: _Context,
    common: list[_Constraint],
    terms: list[list[_Constraint]],
    sizes: tuple[int, int],
    last_line: int,
    name: Callable[[int], str] = _x_name,
    missing_line: Callable[[int], int] | None = None,
) -> tuple[Region, ...]:
    """Regions of ``common AND (term_1 OR term_2 ...)``, one per distinct input box.

    ``sizes`` is ``(n_inputs, n_outputs)``; regions keep the order of first appearance. The
    boxes and matrices hold at most :data:`MAX_ENTRIES` numbers in all. ``name(i)`` spells input
    ``i`` in messages; a missing bound is reported at ``missing_line(i)`` (default: the line
    that declared the input).
    """
    if missing_line is None:
        missing_line = lambda i: ctx.decls[("X", i)]  # noqa: E731
    base_lower, base_upper = np.full(sizes[0], -np.inf), np.full(sizes[0], np.inf)
    _tighten(ctx, common, base_lower, base_upper, name)
    base_rows = [con for con in common if not _is_bound(con)]
    groups: dict[bytes, tuple[np.ndarray, np.ndarray, list[Polytope]]] = {}
    entries = 0
    for term in terms:
        lower, upper = base_lower.copy(), base_upper.copy()
        _tighten(ctx, term, lower, upper, name)
        _check_box(ctx, lower, upper, name, missing_line)
        rows = base_rows + [con for con in term if not _is_bound(con)]
        entries += 2 * sizes[0] + len(rows) * (sizes[1] + 1)
        if entries > MAX_ENTRIES:
            raise ctx.error(f"regions would hold more than {MAX_ENTRIES} numbers", last_line)
        group = groups.setdefault(lower.tobytes() + upper.tobytes(), (lower, upper, []))
        group[2].append(_polytope(rows, *sizes))
    return tuple(Region(lower, upper, tuple(polys)) for lower, upper, polys in groups.values())


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_STEPS",
    "MAX_TERMS",
    "Polytope",
    "Region",
    "VnnlibProperty",
    "load_vnnlib",
    "parse_vnnlib",
]
