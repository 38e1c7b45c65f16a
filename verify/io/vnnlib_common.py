"""What the VNN-LIB readers share: the 1.0 reader (`verify.io.vnnlib`, our own parser) and the 2.0
reader (`verify.io.vnnlib2`, on the PyPI package ``vnnlib``) both read files here (gzip, size
limit, UTF-8, byte-order mark), report errors and count work through one :class:`Context`, bring
a formula to disjunctive normal form with the same expansion (:func:`conjoin`, :func:`disjoin`,
:func:`flatten`: same :data:`MAX_TERMS` guard, same order of rows) and group the DNF terms into
regions by their input boxes (:func:`group_regions`). `verify.io.vnnlib_load.load_vnnlib` picks
the reader of a file (:func:`is_vnnlib2`).

The limits against hostile files (:data:`MAX_BYTES`, :data:`MAX_DEPTH`, :data:`MAX_TERMS`,
:data:`MAX_DISJUNCTION`, :data:`MAX_STEPS`, :data:`MAX_ENTRIES`) live here and are read at each use.
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import os
import re
import stat
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from verify.errors import SpecificationError
from verify.property import Polytope, Region

MAX_DISJUNCTION = 250_000
"""Largest number of terms an OR lists (each written in the file: VNN-COMP's nn4sys has
120,000; the file's size bounds it too)."""
MAX_TERMS = MAX_DISJUNCTION
"""Largest number of DNF terms an AND of disjunctions expands to before raising (guards the
cartesian product before it is built): as many as a flat OR may list. What a property may hold
in memory is capped by :data:`MAX_ENTRIES` (constraints over all terms, entries of its boxes and
matrices) and its reading time by :data:`MAX_STEPS` and the verify deadline."""
MAX_BYTES = 128 * 2**20
"""Largest file (and decompressed text) we read, in bytes (characters for :func:`parse_vnnlib`)."""
MAX_STEPS = 10_000_000
"""Largest number of elementary steps (term copies, coefficient updates) spent on the formula."""
MAX_ENTRIES = 2**25
"""Largest expanded result: constraints over all DNF terms, and entries of all boxes and matrices."""
MAX_DEPTH = 100_000
"""Deepest nesting of parentheses we accept (each open one holds memory until it is closed)."""

_GZIP_MAGIC = b"\x1f\x8b"
_V2_FORM = re.compile(r"\(\s*(vnnlib-version|declare-network)\b")


def is_vnnlib2(text: str) -> bool:
    """Whether VNN-LIB text is 2.0: it has a ``(vnnlib-version`` or ``(declare-network`` form
    outside comments (neither is valid 1.0). Cheap: stops at the first one found."""
    return any(_V2_FORM.search(line.split(";", 1)[0]) for line in text.splitlines())


class Constraint(NamedTuple):
    """``sum coefs[v] * v <= bound``, from the token on ``line``."""

    coefs: dict[tuple[str, int], float]
    bound: float
    line: int


# A DNF term (a conjunction) is a tree of tuples whose leaves are Constraint: ``and`` nests its
# parts instead of copying them; `flatten` lists the constraints once, at the end. A DNF is a
# list of terms, owned by the one parent that consumes it (so it may be extended in place).
Term = tuple
Dnf = list


PACE_AFTER = 0.1
"""Share of a stage's items (a file's lines, the terms to group) done before their rate
predicts the rest (`Context.check_pace`); declarations come first and read faster, so early
predictions fall short, not over."""


class ParseDeadlineError(TimeoutError):
    """The deadline given to a reader passed while it read (the file is not at fault)."""


@dataclass
class Context:
    path: str
    decls: dict[tuple[str, int], int] = field(default_factory=dict)  # variable -> its line
    names: dict[str, tuple[str, int]] = field(default_factory=dict)  # "X_3" -> ("X", 3)
    steps: int = 0
    deadline: float | None = None  # time.monotonic(); None: no limit
    started: float = field(default_factory=time.monotonic)  # when reading began

    def check_time(self, line: int | None) -> None:
        """`ParseDeadlineError` once the deadline has passed (callers check every so often:
        a large file can take longer to read than its instance's time limit)."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ParseDeadlineError(f"{self.path}: time limit reached while reading (line {line})")

    def check_pace(
        self,
        done: int,
        total: int,
        what: str = "lines",
        line: int | None = None,
        since: float | None = None,
    ) -> None:
        """`check_time`, and predictive: once `PACE_AFTER` of a stage's `total` items (lines
        read, terms grouped) are `done`, `ParseDeadlineError` as soon as the rest, at the rate
        so far since the stage began (`since`; default: when reading began), would end past
        the deadline. The reader stops then, not at the deadline: dropping what it built takes
        time too, 0.7-1.3 s on a 20-s read of nn4sys cardinality_1_7300. `what` names the
        items in the message, `line` (default `done`) the line it names."""
        line = done if line is None else line
        self.check_time(line)
        if self.deadline is None or done < max(1, PACE_AFTER * total):
            return
        now = time.monotonic()
        spent = now - (self.started if since is None else since)
        if now + spent * (total - done) / done > self.deadline:
            raise ParseDeadlineError(
                f"{self.path}: time limit: reading predicted to end past it (line {line}; "
                f"{done} of {total} {what} after {spent:.1f} s)"
            )

    def error(self, message: str, line: int | None) -> SpecificationError:
        return SpecificationError(message, path=self.path, line=line)

    def spend(self, steps: int, line: int) -> None:
        """Counts work against :data:`MAX_STEPS` (guards quadratic nesting in hostile files)."""
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise self.error(f"formula too large to expand (> {MAX_STEPS} steps)", line)

    def nest(self, depth: int, line: int) -> None:
        """Refuses parentheses nested deeper than :data:`MAX_DEPTH` (each open one holds
        memory until it is closed)."""
        if depth > MAX_DEPTH:
            raise self.error(f"parentheses nested deeper than {MAX_DEPTH}", line)


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


def check_length(text: str, path: str) -> None:
    """Refuses a text longer than :data:`MAX_BYTES` characters."""
    if len(text) > MAX_BYTES:
        raise SpecificationError(f"text is longer than {MAX_BYTES} characters", path=path)


def line_count(text: str) -> int:
    """Number of lines, as in ``str.splitlines`` restricted to ``\\n``, ``\\r\\n``, ``\\r``."""
    breaks = text.count("\n") + text.count("\r") - text.count("\r\n")
    return max(breaks + (0 if text.endswith(("\n", "\r")) else 1), 1)


def conjoin(ctx: Context, parts: list[Dnf], line: int) -> Dnf:
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


def disjoin(ctx: Context, parts: list[Dnf], line: int) -> Dnf:
    """OR of several DNFs: their terms in order (the longest list is extended in place)."""
    total = sum(map(len, parts))
    if total > MAX_DISJUNCTION:
        raise ctx.error(f"disjunction has {total} terms (> {MAX_DISJUNCTION})", line)
    big = max(range(len(parts)), key=lambda k: len(parts[k]))
    terms = parts[big]
    ctx.spend(total - len(terms), line)
    terms[:0] = itertools.chain.from_iterable(parts[:big])
    terms.extend(itertools.chain.from_iterable(parts[big + 1 :]))
    return terms


def flatten(ctx: Context, terms: Dnf, line: int) -> list[list[Constraint]]:
    """The constraints of each term in order; their total is at most :data:`MAX_ENTRIES`."""
    out, total = [], 0
    for term in terms:
        flat: list[Constraint] = []
        stack: list = [term]
        while stack:
            node = stack.pop()
            if isinstance(node, Constraint):
                flat.append(node)
            else:
                stack.extend(reversed(node))
        total += len(flat)
        if total > MAX_ENTRIES:
            raise ctx.error(f"DNF expands to more than {MAX_ENTRIES} constraints", line)
        out.append(flat)
    return out


def dnf_terms(
    ctx: Context, dnfs: list[Dnf], last_line: int
) -> tuple[list[Constraint], list[list[Constraint]]]:
    """The constraints common to every term (the single-term asserts, in order) and the terms of
    the AND of the other asserts' DNFs."""
    common = flatten(ctx, [tuple(dnf[0] for dnf in dnfs if len(dnf) == 1)], last_line)[0]
    terms = conjoin(ctx, [dnf for dnf in dnfs if len(dnf) > 1], last_line)
    return common, flatten(ctx, terms, last_line)


def constrains_outputs(common: list[Constraint], terms: list[list[Constraint]]) -> bool:
    """Whether any constraint involves an output ``Y`` (else the unsafe set is missing)."""
    return any(v[0] == "Y" for term in [common, *terms] for con in term for v in con.coefs)


def _is_bound(con: Constraint) -> bool:
    """Whether the constraint bounds a single input by a constant."""
    return len(con.coefs) == 1 and next(iter(con.coefs))[0] == "X"


def _x_name(i: int) -> str:
    return f"X_{i}"


def _tighten(
    ctx: Context,
    term: list[Constraint],
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
            msg = f"empty input box: {name(i)} has lower {float(lower[i])!r} > upper {float(upper[i])!r}"
            raise ctx.error(msg, con.line)


def _check_box(
    ctx: Context,
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


def _polytope(rows: list[Constraint], n_inputs: int, n_outputs: int) -> Polytope:
    """Constraints (none a single-input bound) as ``A y + A_x x <= b``."""
    mixed = any(kind == "X" for con in rows for kind, _ in con.coefs)
    A = np.zeros((len(rows), n_outputs))
    A_x = np.zeros((len(rows), n_inputs)) if mixed else None
    for r, con in enumerate(rows):
        for (kind, i), coef in con.coefs.items():
            (A if kind == "Y" else A_x)[r, i] += coef
    b = np.array([con.bound for con in rows], dtype=np.float64)
    return Polytope(A, b, A_x)


def group_regions(
    ctx: Context,
    common: list[Constraint],
    terms: list[list[Constraint]],
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
    entries, since = 0, time.monotonic()
    for k, term in enumerate(terms):
        if k % 64 == 0:
            ctx.check_pace(k, len(terms), "terms grouped", last_line, since)
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
