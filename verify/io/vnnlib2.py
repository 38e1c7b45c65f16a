"""Reader for VNN-LIB 2.0 property files, built on the PyPI package ``vnnlib`` (>= 1.0.2).

VNN-LIB 2.0 declares the network and its tensors (``(vnnlib-version <2.0>)``,
``(declare-network N (declare-input X float32 [2,3]) (declare-output Y float32 [5]))``) and names
tensor elements by index (``X[0,1]``). The package parses and type-checks the file; this module
translates its syntax tree to the same :class:`verify.property.VnnlibProperty` as the 1.0 reader:
the input ``x`` and output ``y`` are the declared tensors flattened in row-major order (``X[i,j]``
of shape ``[m, n]`` is ``x[i * n + j]``), the formula is brought to DNF with the 1.0 reader's
code (same :data:`verify.io.vnnlib_common.MAX_TERMS` guard, same order of rows, strict comparisons read as
non-strict, ``==`` as two inequalities), single-input bounds give the boxes and the other linear
constraints the polytopes, and terms with the same box are grouped into one region.

Supported: exactly one ``declare-network`` with exactly one input and one output tensor of a
floating-point type (read as reals), no hidden tensors, no ``equal-to`` / ``isometric-to``;
assertions over ``and``, ``or``, ``<=``, ``>=``, ``<``, ``>``, ``==`` and linear terms (the
package's ``+``, ``-``, ``*`` by constants). Anything else (several networks, several inputs or
outputs, hidden tensors, integer tensors, ``!=``, products of variables, nesting deeper than
:data:`MAX_DEPTH`) raises :class:`verify.errors.SpecificationError` with "not supported". Every
error is a ``SpecificationError`` with the path and, where one is known, the line: the package's
own errors keep its message and line; a constraint's line is that of its first number or
variable. Files are read as by the 1.0 reader (gzip, size limit, UTF-8, byte-order mark); line
breaks ``\\r\\n`` and ``\\r`` are turned into ``\\n`` first, so lines count as in the 1.0 reader.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from verify.errors import SpecificationError
from verify.io.vnnlib_common import (
    MAX_ENTRIES,
    Constraint,
    Context,
    conjoin,
    constrains_outputs,
    disjoin,
    dnf_terms,
    group_regions,
    is_vnnlib2,
    line_count,
    read_text,
)
from verify.property import VnnlibProperty

try:  # optional dependency: `load_vnnlib2` says so when it is missing
    import vnnlib as _pkg
except ImportError:  # pragma: no cover - exercised only without the package
    _pkg = None

MAX_DEPTH = 1000
"""Deepest nesting of parentheses passed to the package (its C++ parser recurses: a file nested
100 000 deep crashes the interpreter)."""

_LINE_BREAK = re.compile(r"\r\n|\r")
_REAL_TYPE = re.compile(r"(\(\s*declare-(?:input|output|hidden)\s+[^\s()]+\s+)Real\b")
_INITIALIZED = re.compile(r"\(\s*declare-input\s+[^\s()]+\s+\S+\s+\[[^\]]*\]\s+initialized\b")
_LINE_IN_TEXT = re.compile(r"\bline (\d+)")
_FLOAT_TYPES = ("F16", "F32", "F64", "BF16", "F8E4M3FN", "F8E5M2", "F8E4M3FNUZ", "F8E5M2FNUZ")
_FLOAT_TYPES += ("F4E2M1", "Real")
_COMPARISONS = {
    "LessEqual": ("<=",),
    "LessThan": ("<=",),
    "GreaterEqual": (">=",),
    "GreaterThan": (">=",),
    "Equal": ("<=", ">="),
}


def load_vnnlib2(path: str | os.PathLike) -> VnnlibProperty:
    """Read a VNN-LIB 2.0 file (gzip-compressed or not) as a :class:`VnnlibProperty`."""
    name, text = read_text(path)
    return parse_vnnlib2(text, path=name)


def parse_vnnlib2(text: str, path: str = "<string>") -> VnnlibProperty:
    """Parse VNN-LIB 2.0 text; ``path`` is only used in error messages and the result."""
    if not isinstance(text, str):
        raise SpecificationError(f"expected text (str), got {type(text).__name__}", path=path)
    if _pkg is None:
        raise SpecificationError("reading VNN-LIB 2.0 needs the package vnnlib>=1.0.2", path=path)
    text = _LINE_BREAK.sub("\n", text.removeprefix("\ufeff"))
    if not text.strip():
        raise SpecificationError("empty specification", path=path)
    ctx, last_line = Context(path), line_count(text)
    if "\x00" in text:  # the C++ parser would silently stop there (dropping what follows)
        raise ctx.error("NUL character in the text", text.count("\n", 0, text.index("\x00")) + 1)
    _check_depth(ctx, text)
    text = _declarations(ctx, text)
    query = _parse(ctx, text)
    network = _single_network(ctx, query, text)
    x_def, y_def = network.inputs[0], network.outputs[0]
    sizes = (_size(x_def.shape), _size(y_def.shape))
    if sizes[0] * sizes[1] > MAX_ENTRIES or sizes[0] + sizes[1] > MAX_ENTRIES:
        raise ctx.error(f"tensors too large (> {MAX_ENTRIES} entries)", last_line)
    tensors = {(x_def.name, "Input"): ("X", x_def), (y_def.name, "Output"): ("Y", y_def)}
    dnfs = [_formula(ctx, tensors, a.expr) for a in query.assertions]
    if not dnfs:
        raise ctx.error("no assertion (the unsafe set is missing)", last_line)
    if any(not dnf for dnf in dnfs):  # an assertion that never holds: the unsafe set is empty
        return VnnlibProperty(path, sizes[0], sizes[1], ())
    common, terms = dnf_terms(ctx, dnfs, last_line)
    if not constrains_outputs(common, terms):
        raise ctx.error(f"no constraint on the output {y_def.name} (unsafe set missing)", last_line)
    names = (x_def, y_def)
    regions = group_regions(
        ctx, common, terms, sizes, last_line,
        name=lambda i: _element(names[0], i), missing_line=lambda i: last_line,
    )  # fmt: skip
    return VnnlibProperty(path, sizes[0], sizes[1], regions)


def _declarations(ctx: Context, text: str) -> str:
    """The element type `Real` of the standard's own examples read as the package's `real`
    (vnnlib 1.0.2 knows only the lower-case name: 'Real' makes every variable's type
    'Unknown'); an `initialized` input (VNN-LIB 2.1) refused, naming its line."""
    found = _INITIALIZED.search(text)
    if found:
        line = text.count("\n", 0, found.start()) + 1
        raise ctx.error("not supported: an 'initialized' input (VNN-LIB 2.1)", line)
    return _REAL_TYPE.sub(lambda m: m.group(1) + "real", text)


def _check_depth(ctx: Context, text: str) -> None:
    """Parentheses (outside comments) nest at most :data:`MAX_DEPTH` deep."""
    depth = 0
    for number, line in enumerate(text.split("\n"), start=1):
        code = line.split(";", 1)[0]
        if "(" not in code:
            continue
        for char in code:
            if char == "(":
                depth += 1
                if depth > MAX_DEPTH:
                    msg = f"not supported: parentheses nested deeper than {MAX_DEPTH}"
                    raise ctx.error(msg, number)
            elif char == ")":
                depth -= 1


def _parse(ctx: Context, text: str):
    """The package's syntax tree; its errors become ``SpecificationError`` (message and line)."""
    try:
        return _pkg.parse_query_string(text)
    except _pkg.VNNLibException as exc:
        raise _package_error(ctx, str(exc)) from exc
    except Exception as exc:  # a binding may raise anything; never leak it
        hint = " (a number outside the float64 range?)" if "sto" in str(exc) else ""
        msg = f"VNN-LIB 2.0 parser failed ({type(exc).__name__}: {exc}){hint}"
        raise ctx.error(msg, None) from exc


def _package_error(ctx: Context, message: str) -> SpecificationError:
    """The package reports either JSON (type errors) or ``Parse error: ... at line N, ...``."""
    try:
        report = json.loads(message)
        errors = report["errors"]
        first = errors[0]
    except (ValueError, KeyError, IndexError, TypeError):
        match = _LINE_IN_TEXT.search(message)
        return ctx.error(message.strip(), int(match.group(1)) if match else None)
    parts = [str(first.get("message", "error"))]
    if first.get("offendingSymbol"):
        parts.append(f"'{first['offendingSymbol']}'")
    if first.get("hint"):
        parts.append(f"({first['hint']})")
    if len(errors) > 1:
        parts.append(f"and {len(errors) - 1} more error(s)")
    line = first.get("line")
    return ctx.error(" ".join(parts), line if isinstance(line, int) and line > 0 else None)


def _line_of(text: str, pattern: str, nth: int = 0) -> int | None:
    """The line of the `nth` match of `pattern` in `text` (None: no such match)."""
    matches = list(re.finditer(pattern, text))
    return text.count("\n", 0, matches[nth].start()) + 1 if len(matches) > nth else None


def _single_network(ctx: Context, query, text: str):
    """The one network, with one floating-point input and output tensor and nothing else."""
    networks = query.networks
    if len(networks) != 1:
        msg = f"not supported: {len(networks)} networks declared (exactly one is supported)"
        line = _line_of(text, r"\(\s*declare-network\b", 1) if networks else line_count(text)
        raise ctx.error(msg, line)
    net = networks[0]
    where = f"network {net.name}"
    if len(net.inputs) != 1 or len(net.outputs) != 1:
        msg = f"not supported: {where} has {len(net.inputs)} inputs and {len(net.outputs)} outputs"
        raise ctx.error(msg + " (exactly one of each is supported)", None)
    if net.hidden:
        msg = f"not supported: hidden tensors (declare-hidden) in {where}"
        raise ctx.error(msg, _line_of(text, r"\(\s*declare-hidden\b"))
    if net.equal_to or net.isometric_to:
        line = _line_of(text, r"\((?:equal|isomorphic|isometric)-to\b")
        raise ctx.error(f"not supported: equal-to / isomorphic-to in {where}", line)
    for tensor in (net.inputs[0], net.outputs[0]):
        dtype = str(tensor.dtype).rsplit(".", 1)[-1]
        if dtype not in _FLOAT_TYPES:
            raise ctx.error(f"not supported: tensor {tensor.name} of type {dtype}", None)
    return net


def _size(shape) -> int:
    return math.prod(int(d) for d in shape)


def _flat_index(shape, indices) -> int:
    """Row-major position of ``indices`` in a tensor of ``shape``."""
    flat = 0
    for dim, index in zip(shape, indices, strict=True):
        flat = flat * int(dim) + int(index)
    return flat


def _first_line(node) -> int | None:
    """The line of the first number or variable under ``node`` (depth first, iterative)."""
    stack = [node]
    while stack:
        item = stack.pop()
        line = getattr(item, "line", None)
        if isinstance(line, int) and line > 0:
            return line
        stack.extend(reversed(item.children()))
    return None


def _formula(ctx: Context, tensors: dict, expr) -> list:
    """The DNF of a formula: a list of terms, each a tuple tree of ``Constraint``.

    Iterative post-order walk (no recursion); ``and`` / ``or`` use the 1.0 reader's expansion.
    """
    stack: list = [(expr, False)]
    values: list[list] = []
    while stack:
        node, done = stack.pop()
        kind = type(node).__name__
        if kind in ("And", "Or"):
            args = node.args
            if not done:
                stack.append((node, True))
                stack.extend((arg, False) for arg in reversed(args))
                continue
            line = _first_line(node)
            parts = values[len(values) - len(args) :] if args else []
            del values[len(values) - len(args) :]
            if not parts:
                raise ctx.error(f"'{kind.lower()}' without arguments", line)
            merge = conjoin if kind == "And" else disjoin
            values.append(merge(ctx, parts, line))
        elif kind in _COMPARISONS:
            constraints = _comparison(ctx, tensors, node, _COMPARISONS[kind])
            values.append([] if constraints is None else [tuple(constraints)])
        else:
            what = "'!='" if kind == "NotEqual" else f"formula {kind}"
            raise ctx.error(f"not supported: {what}", _first_line(node))
    return values[0]


def _comparison(ctx: Context, tensors: dict, node, ops: tuple[str, ...]) -> list[Constraint] | None:
    """``lhs op rhs`` as constraints ``coefs . v <= bound`` over ``("X", i)`` / ``("Y", j)``;
    a comparison of constants (or of cancelling terms) is none when it holds, ``None`` (false)
    when it does not."""
    line = _first_line(node)
    coefs: dict[tuple[str, int], float] = {}
    const = 0.0
    for side, sign in ((node.lhs, 1.0), (node.rhs, -1.0)):
        try:
            linear = side.to_linear_expr()
        except _pkg.VNNLibException as exc:
            raise ctx.error(f"not supported: {str(exc).strip()}", line) from exc
        except Exception as exc:  # a binding may raise anything; never leak it
            raise ctx.error(f"not supported: term {side} ({exc})", line) from exc
        const += sign * float(linear.constant)
        for term in linear.terms:
            var = _variable(ctx, tensors, term.var, line)
            coefs[var] = coefs.get(var, 0.0) + sign * float(term.coeff)
    out = []
    for op in ops:  # lhs - rhs <= 0, or rhs - lhs <= 0
        s = 1.0 if op == "<=" else -1.0
        row = {v: s * c for v, c in coefs.items() if c != 0.0}
        bound = 0.0 - s * const + 0.0  # + 0.0: no -0.0
        if not row:  # 0 <= bound: true (dropped) or false (the whole term)
            if not math.isfinite(bound):
                raise ctx.error("arithmetic overflow in the comparison (not a finite number)", line)
            if bound < 0:
                return None
            continue
        if not (math.isfinite(bound) and all(map(math.isfinite, row.values()))):
            raise ctx.error("arithmetic overflow in the comparison (not a finite number)", line)
        out.append(Constraint(row, bound, line))
    return out


def _variable(ctx: Context, tensors: dict, var, line: int | None) -> tuple[str, int]:
    """``("X", flat index)`` for an element of the input, ``("Y", ...)`` for the output."""
    kind = str(var.kind).rsplit(".", 1)[-1]
    entry = tensors.get((var.name, kind))
    if entry is None:
        raise ctx.error(f"not supported: variable {var.name} ({kind.lower()})", line)
    letter, definition = entry
    shape, indices = list(definition.shape), list(var.indices)
    if len(indices) != len(shape) or any(not 0 <= i < d for i, d in zip(indices, shape)):
        raise ctx.error(f"index {indices} out of the shape {shape} of {var.name}", line)
    return letter, _flat_index(shape, indices)


def _element(definition, flat: int) -> str:
    """``X[1,2]`` for the flat index of an element of ``definition`` (a tensor declaration)."""
    shape = [int(d) for d in definition.shape]
    if not shape:
        return definition.name
    index = np.unravel_index(flat, shape)
    return f"{definition.name}[{','.join(str(int(i)) for i in index)}]"


__all__ = ["MAX_DEPTH", "is_vnnlib2", "load_vnnlib2", "parse_vnnlib2"]
