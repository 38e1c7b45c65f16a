"""CPU eager vs ``torch.compile`` per solver step, with cold and warm compile times.

Each case (:class:`benchmarks.compile_case.Case`, collected from ``compile_cases_crf.py`` and,
when present, ``compile_cases_bounds.py``) is a pure ``step(state) -> state``. Per case:

- eager: seconds per step, best of ``--repeats`` runs of ``case.iterations`` steps;
- cold compile: the first call of ``torch.compile(step, fullgraph=True)`` after
  ``torch._dynamo.reset()`` with an empty Inductor cache directory (a fresh temporary one; the
  precompiled C++ header, kept in the default cache directory, is reused), so it includes
  Dynamo tracing, Inductor lowering and the C++ build; minus nothing (it includes one step);
- warm compile: the same after another reset, now hitting the on-disk FX-graph cache (what a
  new process pays once the cache is populated);
- compiled: seconds per step of the warm-compiled function, measured like eager; recompiles
  during those runs (Dynamo's ``unique_graphs`` counter; must be 0) and the largest relative
  difference (``|a - b| / max(1, |b|)``) of one compiled step from one eager step, both from
  the case's start state (one step, not a chain: the proximal LP's level quantisation makes
  chained steps discontinuous, so a last-bit difference can flip a level and move a pixel);
- break-even: warm compile seconds / seconds saved per step, against the number of times one
  default solver call runs the step (``Case.default_iterations``).

``startup`` is the first ``torch.compile`` of a trivial function in the process (imports of
Dynamo and Inductor; large where Python cannot write byte-code caches). One torch thread.

Usage: ``python benchmarks/compile_bench.py [--quick] [--only SUBSTRING] [--out DIR]``; writes
``compile_bench[_quick].json`` and ``.txt`` under ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compile_case import Case

RESULTS = Path(__file__).resolve().parent / "results"
CASE_MODULES = ("benchmarks.compile_cases_crf", "benchmarks.compile_cases_bounds")
COLUMNS = (  # header, format of the value (the case column is as wide as the longest name)
    ("case", "{:<24}"),
    ("eager_ms", "{:>9.2f}"),
    ("compiled_ms", "{:>11.2f}"),
    ("speedup", "{:>7.2f}"),
    ("cold_s", "{:>6.1f}"),
    ("warm_s", "{:>6.1f}"),
    ("recompiles", "{:>10d}"),
    ("max_rel_diff", "{:>12.1e}"),
    ("break_even", "{:>10}"),
    ("per_call", "{:>8}"),
    ("cpu_default", "{:>11}"),
)


def collect_cases(quick: bool) -> list[Case]:
    """Cases of every case module that exists (a missing module is skipped, not an error)."""
    found = []
    for name in CASE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        found.extend(module.cases(quick))
    return found


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, tuple | list):
        for item in tree:
            yield from _tensors(item)


def _sync(state: Any) -> None:
    if any(t.is_cuda for t in _tensors(state)):
        torch.cuda.synchronize()


def run_steps(step: Callable, state: Any, n: int) -> Any:
    """``n`` steps from ``state``; returns the final state."""
    for _ in range(n):
        state = step(state)
    _sync(state)
    return state


def seconds_per_step(step: Callable, state: Any, n: int, repeats: int) -> float:
    """Best of ``repeats`` timed runs of ``n`` steps (after one untimed warm-up run)."""
    run_steps(step, state, n)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run_steps(step, state, n)
        best = min(best, (time.perf_counter() - start) / n)
    return best


def first_call_seconds(step: Callable, state: Any) -> tuple[Callable, float]:
    """A fresh ``torch.compile(step, fullgraph=True)`` and the seconds of its first call."""
    torch._dynamo.reset()
    fn = torch.compile(step, fullgraph=True)
    start = time.perf_counter()
    run_steps(fn, state, 1)
    return fn, time.perf_counter() - start


@contextmanager
def fresh_inductor_cache() -> Iterator[None]:
    """An empty temporary Inductor cache directory for the duration (in-memory caches cleared)."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with (
        tempfile.TemporaryDirectory(prefix="compile_bench_") as folder,
        temporary_cache_dir(folder),
    ):
        yield


def max_rel_diff(a: Any, b: Any) -> float:
    """Largest ``|a - b| / max(1, |b|)`` over the tensors of two states."""
    worst = 0.0
    for x, y in zip(_tensors(a), _tensors(b)):
        diff = (x.double() - y.double()).abs() / y.double().abs().clamp_min(1.0)
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst


def measure(case: Case, repeats: int) -> dict:
    """All the figures of one case (see the module docstring)."""
    eager = seconds_per_step(case.step, case.state, case.iterations, repeats)
    with fresh_inductor_cache():
        _, cold = first_call_seconds(case.step, case.state)
        from torch._inductor.utils import clear_caches

        clear_caches()
        fn, warm = first_call_seconds(case.step, case.state)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        compiled = seconds_per_step(fn, case.state, case.iterations, repeats)
        recompiles = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    diff = max_rel_diff(run_steps(fn, case.state, 1), run_steps(case.step, case.state, 1))
    saved = eager - compiled
    break_even = warm / saved if saved > 0 else math.inf
    per_call = None
    if case.default_iterations is not None:
        per_call = bool(break_even <= case.default_iterations)
    return {
        "case": case.name,
        "eager_ms": 1e3 * eager,
        "compiled_ms": 1e3 * compiled,
        "speedup": eager / compiled,
        "cold_s": cold,
        "warm_s": warm,
        "recompiles": int(recompiles),
        "max_rel_diff": diff,
        "break_even_steps": break_even,
        "default_iterations": case.default_iterations,
        "compile_pays_in_one_call": per_call,
        "cpu_default": case.cpu_default,
    }


def startup_seconds() -> float:
    """First compile of a trivial function in this process (Dynamo / Inductor imports)."""
    start = time.perf_counter()
    torch.compile(lambda x: x * 2.0 + 1.0, fullgraph=True)(torch.ones(3))
    return time.perf_counter() - start


def _cell(row: dict, key: str, fmt: str) -> str:
    if key == "break_even":
        value = row["break_even_steps"]
        return fmt.format("inf" if math.isinf(value) else f"{value:.0f}")
    if key == "per_call":
        value = row["compile_pays_in_one_call"]
        return fmt.format("-" if value is None else ("yes" if value else "no"))
    if key == "cpu_default":
        return fmt.format("-" if row[key] is None else str(row[key]))
    return fmt.format(row[key])


def table_line(row: dict, name_width: int = 24) -> str:
    """One case as a table line."""
    cells = [_cell(row, key, fmt) for key, fmt in COLUMNS[1:]]
    return "  ".join([row["case"].ljust(name_width), *cells])


def table(rows: list[dict], meta: dict) -> str:
    """The text table: a header, one line per case, then the run's settings."""
    name_width = max([24, *(len(row["case"]) for row in rows)])
    widths = [len(_cell(rows[0], key, fmt)) if rows else len(key) for key, fmt in COLUMNS[1:]]
    head = "  ".join(
        ["case".ljust(name_width), *(key.rjust(w) for (key, _), w in zip(COLUMNS[1:], widths))]
    )
    lines = [head, *(table_line(row, name_width) for row in rows), ""]
    lines.extend(f"{key}: {value}" for key, value in meta.items())
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller instances")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    startup = startup_seconds()
    rows = []
    for case in collect_cases(args.quick):
        if args.only in case.name:
            rows.append(measure(case, args.repeats))
            print(table_line(rows[-1]), flush=True)
    meta = {
        "startup_s": round(startup, 2),
        "quick": args.quick,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
    }
    text = table(rows, meta)
    print(text)
    stem = "compile_bench_quick" if args.quick else "compile_bench"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.txt").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
