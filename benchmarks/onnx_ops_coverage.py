"""Which ONNX op types the loader reads, and which ops the shared VNN-COMP networks use.

Prints the loader's op sets, taken from the code (no list is written here):
  - HANDLERS (`verify.io.onnx_loader`): ops translated when an input is an activation;
  - FOLDERS (`verify.io.onnx_fold`): ops evaluated at load time, on constants only;
  - `relaxations.registry.onnx_ops()`: elementwise activations with a registered relaxation.
Then, for every `.onnx` / `.onnx.gz` under `../shared/data`, the op types its graph uses (with
counts) and whether `verify.load_onnx` reads it (else the typed error's class and first line).
Writes `benchmarks/results/onnx_ops_coverage.md`.

    OMP_NUM_THREADS=1 PYTHONPATH=. python -m benchmarks.onnx_ops_coverage
"""

from __future__ import annotations

import gzip
import time
from collections import Counter
from pathlib import Path

import onnx
import torch

import verify
from bounds.errors import VerificationInputError
from relaxations.registry import onnx_ops
from verify.io.onnx_fold import FOLDERS
from verify.io.onnx_loader import HANDLERS

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results" / "onnx_ops_coverage.md"


def op_sets() -> dict[str, set[str]]:
    """The loader's op sets: read on activations, activations, constants only."""
    handlers, folders, activations = set(HANDLERS), set(FOLDERS), set(onnx_ops())
    return {
        "handlers (read on activations)": handlers,
        "activations (relaxations.registry)": activations,
        "folders (evaluated on constants)": folders,
        "constants only (folders, no handler)": folders - handlers,
    }


def status(op: str) -> str:
    """How the loader treats `op` when it appears in a graph."""
    if op in ("ArgMax", "ArgMin"):  # special-cased in onnx_loader._convert_node / _terminal_arg
        return "last op only (property restated on the logits); constants"
    if op == "Shape":  # onnx_loader._convert_node folds it also on activations (static shape)
        return "folded (static shape, also of activations)"
    if op in onnx_ops():
        return "activation"
    if op in HANDLERS:
        return "read"
    if op in FOLDERS:
        return "constants only"
    return "no"


def network_files(root: Path) -> list[Path]:
    """Every ONNX file under `root`, sorted."""
    return sorted(p for p in root.rglob("*") if p.name.endswith((".onnx", ".onnx.gz")))


def graph_ops(path: Path) -> Counter[str]:
    """Op types (with their node counts) of the file's main graph and any sub-graphs."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    model = onnx.load_model_from_string(data)
    counts: Counter[str] = Counter()
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            domain = "" if node.domain in ("", "ai.onnx") else f"{node.domain}:"
            counts[domain + node.op_type] += 1
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
    return counts


def try_load(path: Path) -> tuple[str, float]:
    """'yes' when `verify.load_onnx` reads the file, else 'ErrorClass: first line'; seconds."""
    start = time.perf_counter()
    try:
        verify.load_onnx(path)
        answer = "yes"
    except VerificationInputError as err:  # SpecificationError and the loader's graph errors
        answer = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    return answer, time.perf_counter() - start


def benchmark_of(path: Path) -> str:
    """'vnncomp2023/cgan' for a file under DATA/vnncomp2023/cgan/..."""
    return "/".join(path.relative_to(DATA).parts[:2])


def report(rows: list[tuple[Path, Counter[str], str, float]], sets: dict[str, set[str]]) -> str:
    """The markdown report: op sets, one row per network, then every op seen with its status."""
    lines = [
        "# ONNX op types: the loader's sets and the shared VNN-COMP networks",
        "",
        "Written by `benchmarks/onnx_ops_coverage.py` (1 thread). Status of an op: "
        "`activation` (registered relaxation), `read` (translated on activations), "
        "`constants only` (folded at load time; refused on an activation), `folded` (Shape), "
        "`last op only` (ArgMax/ArgMin), `no`. Load times are seconds.",
        "",
    ]
    for name, ops in sets.items():
        lines.append(f"- **{name}** ({len(ops)}): {', '.join(sorted(ops))}")
    lines += [
        "",
        "| benchmark | network | op types (nodes) | not translated on activations | loads? | s |",
        "|---|---|---|---|---|---|",
    ]
    for path, counts, answer, seconds in rows:
        ops = ", ".join(f"{op} ({n})" for op, n in sorted(counts.items()))
        weak = [op for op in sorted(counts) if status(op) not in ("activation", "read")]
        lines.append(
            f"| {benchmark_of(path)} | {path.name} | {ops} | "
            f"{', '.join(weak) or '-'} | {answer.replace('|', '/')} | {seconds:.2f} |"
        )
    loaded = sum(answer == "yes" for _, _, answer, _ in rows)
    lines += ["", f"{loaded} of {len(rows)} networks load."]
    seen: dict[str, set[str]] = {}
    for path, counts, _, _ in rows:
        for op in counts:
            seen.setdefault(op, set()).add(benchmark_of(path))
    lines += ["", "| op | status | benchmarks using it |", "|---|---|---|"]
    for op in sorted(seen):
        lines.append(f"| {op} | {status(op)} | {', '.join(sorted(seen[op]))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the sets and one line per network; write the markdown report."""
    torch.set_num_threads(1)
    if not DATA.is_dir():
        raise SystemExit(f"skipped: no shared data folder at {DATA}")
    sets = op_sets()
    for name, ops in sets.items():
        print(f"{name} ({len(ops)}): {' '.join(sorted(ops))}")
    rows = []
    for path in network_files(DATA):
        counts = graph_ops(path)
        answer, seconds = try_load(path)
        rows.append((path, counts, answer, seconds))
        print(f"{path.relative_to(DATA)}: {answer} ({seconds:.2f} s) | {' '.join(sorted(counts))}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(report(rows, sets))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
