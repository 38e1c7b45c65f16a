"""The library's structure, measured from its source: files per room (package), import circles
between modules, imports of our own modules inside functions, the largest files and
functions, and the share of public functions fully annotated.

    python benchmarks/structure.py [--json out.json]

Read with `ast` only (nothing is imported). Imports count at module level, including those
under `if TYPE_CHECKING:` blocks' absence: an import guarded by `TYPE_CHECKING` is not a
runtime edge and is left out."""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("verify", "bounds", "relaxations", "crf", "kernels")
# which package may import which (ARCHITECTURE.md: one direction, top to bottom)
ALLOWED = {
    "verify": {"verify", "bounds", "relaxations", "kernels"},
    "bounds": {"bounds", "relaxations", "kernels"},
    "relaxations": {"relaxations"},
    "crf": {"crf", "kernels"},
    "kernels": {"kernels"},
}


@dataclass
class Structure:
    rooms: dict[str, int] = field(default_factory=dict)  # package -> files directly in it
    circles: list[list[str]] = field(default_factory=list)  # module-level imports
    hidden_circles: list[list[str]] = field(default_factory=list)  # with those in functions
    inner_imports: list[str] = field(default_factory=list)  # "module:line -> imported"
    layer_violations: list[str] = field(default_factory=list)  # "module -> imported"
    largest_files: list[tuple[str, int]] = field(default_factory=list)
    largest_functions: list[tuple[str, int]] = field(default_factory=list)
    files_over_500: list[str] = field(default_factory=list)
    functions_over_80: list[str] = field(default_factory=list)
    public_functions: int = 0
    typed_public_functions: int = 0

    @property
    def typed_share(self) -> float:
        return self.typed_public_functions / max(1, self.public_functions)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def library_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _own(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, module: str, is_package: bool, modules: set[str]):
    """`(top-level targets, [(line, target) inside functions])` among `modules`."""
    top, inner = set(), []

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = _resolve(module, is_package, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]  # fmt: skip
        found = []
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and _own(name):
                found.append(name)
        return found

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in targets(child):
                    if in_function:
                        inner.append((child.lineno, t))
                    else:
                        top.add(t)
            fn = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, in_function or fn)

    visit(tree, False)
    return top, inner


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v: str) -> None:
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def _annotated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = fn.args
    params = args.posonlyargs + args.args + args.kwonlyargs
    if params and params[0].arg in ("self", "cls"):
        params = params[1:]
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return fn.returns is not None and all(a.annotation is not None for a in params + extra)


def _public_functions(tree: ast.Module):
    """Module-level functions and methods of module-level classes, names without `_`
    (dunders other than `__init__`/`__call__` left out)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not node.name.startswith("_"):
                yield node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not item.name.startswith("_") or item.name in ("__init__", "__call__")
                ):
                    yield item


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of the function's docstring (0 without one): documentation, not code, so a
    function's length leaves it out (a public function states its arguments' shapes and what
    it raises there)."""
    first = node.body[0] if node.body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if not is_doc or not isinstance(first.value.value, str):
        return 0
    return first.end_lineno - first.lineno + 1


def measure(root: Path = ROOT) -> Structure:
    files = library_files(root)
    modules = {module_name(p, root): p for p in files}
    names = set(modules)
    s = Structure()
    edges: dict[str, set[str]] = defaultdict(set)
    every: dict[str, set[str]] = defaultdict(set)  # with the imports inside functions
    sizes, functions = [], []
    for module, path in modules.items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        room = module if path.name == "__init__.py" else module.rpartition(".")[0]
        s.rooms[room] = s.rooms.get(room, 0) + 1
        top, inner = _imports(tree, module, path.name == "__init__.py", names)
        edges[module] |= top - {module}
        every[module] |= (top | {t for _, t in inner}) - {module}
        rel = str(path.relative_to(root))
        s.inner_imports += [f"{rel}:{line} -> {t}" for line, t in inner]
        lines = len(text.splitlines())
        sizes.append((rel, lines))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                functions.append((f"{rel}:{node.lineno} {node.name}", length))
        for fn in _public_functions(tree):
            s.public_functions += 1
            s.typed_public_functions += _annotated(fn)
    # edges into a package mean its __init__; a module importing its own package's __init__
    # is not counted (an __init__ that re-exports is a facade, not a dependency)
    for graph in (edges, every):
        for module in list(graph):
            graph[module] = {t for t in graph[module] if not module.startswith(t + ".")}
    s.circles = _circles(edges)
    s.layer_violations = sorted(
        f"{m} -> {t}" for m, ts in every.items() for t in ts
        if t.split(".")[0] not in ALLOWED[m.split(".")[0]]
    )  # fmt: skip
    s.hidden_circles = [c for c in _circles(every) if c not in s.circles]
    s.largest_files = sorted(sizes, key=lambda x: -x[1])[:10]
    s.largest_functions = sorted(functions, key=lambda x: -x[1])[:10]
    s.files_over_500 = [f"{f} ({n})" for f, n in sizes if n > 500]
    s.functions_over_80 = [f"{f} ({n})" for f, n in functions if n > 80]
    return s


def report(s: Structure) -> str:
    out = ["| room | files |", "|---|---|"]
    out += [f"| {room} | {n} |" for room, n in sorted(s.rooms.items())]
    out.append("")
    out.append(f"import circles: {len(s.circles)}")
    out += [f"  - {' <-> '.join(c)}" for c in s.circles]
    out.append(f"circles hidden by imports inside functions: {len(s.hidden_circles)}")
    out += [f"  - {' <-> '.join(c)}" for c in s.hidden_circles]
    out.append(f"imports against the package layers: {len(s.layer_violations)}")
    out += [f"  - {x}" for x in s.layer_violations]
    out.append(f"imports of our own modules inside functions: {len(s.inner_imports)}")
    out += [f"  - {x}" for x in s.inner_imports]
    out.append("largest files: " + ", ".join(f"{f} {n}" for f, n in s.largest_files[:6]))
    out.append("largest functions: " + ", ".join(f"{f} {n}" for f, n in s.largest_functions[:6]))
    out.append(f"files over 500 lines: {len(s.files_over_500)} {s.files_over_500}")
    out.append(f"functions over 80 lines: {len(s.functions_over_80)} {s.functions_over_80}")
    out.append(
        f"typed public functions: {s.typed_public_functions}/{s.public_functions} "
        f"= {100 * s.typed_share:.1f}%"
    )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    s = measure()
    print(report(s))
    if args.json:
        args.json.write_text(json.dumps({**asdict(s), "typed_share": s.typed_share}, indent=1))


if __name__ == "__main__":
    main()
