"""GPU check of the dense-CRF kernels and solver steps (one short run on a CUDA machine).

1. Every kernel of ``kernels/lattice_filter.py`` and ``kernels/crf_updates.py`` against its torch
   reference on the instance's own data (the appearance lattice, the marginals): largest
   absolute and relative errors, pass / fail at float32 tolerances, and both timings.
2. The solver steps of ``benchmarks/compile_cases_crf.py`` (mean-field, Frank-Wolfe, CCCP, the
   proximal LP's dual pass and primal step) timed per step in the modes
   ``eager-reference`` (torch; the lattice through cuSPARSE CSR matrices),
   ``eager-triton`` (our Triton kernels), ``compiled`` (``torch.compile`` of the step, calling
   the Triton kernels as custom ops: what ``DenseCRF.map(compile="auto")`` runs on CUDA) and,
   optionally ``compiled-reference`` (Inductor's own code only). ``first_s`` is the first call
   (the compile, for compiled modes); each step's state after the timed iterations is checked
   against the ``eager-reference`` one.

Instance: 512 x 512 image, 21 labels (``compile_cases_crf.instance``), float32; the whole run is
sized for under 90 s on one H200: compiled rows are skipped once ``budget_s`` (70 s) have
passed, so only a compile already under way can run past it. With
``smoke=True`` it runs a tiny instance, also on CPU (Triton through its interpreter, which
needs ``TRITON_INTERPRET=1`` before the kernels are imported; the ``__main__`` sets it).

Usage: ``python benchmarks/gpu_check_crf.py [--device cuda] [--smoke] [--all-modes]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules are imported

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compile_case import Case
from benchmarks.compile_cases_crf import instance, solver_cases
from crf.model import CRFModel
from kernels import backend, crf_updates, lattice_filter

SIZE, LABELS = 512, 21
SMOKE_SIZE, SMOKE_LABELS = (9, 11), 3
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}  # float32, relative to the reference's scale
STEP_TOLERANCE = 1e-3  # relative, after one step from the same state (float32 sums' order)
# After several steps the states drift apart legitimately where a step quantises (the LP pass
# maps y to levels: one flipped level moves a whole filtered sum), so `max_rel_err_n` after
# `iterations` steps is reported but not judged.
MODES = ("eager-reference", "eager-triton", "compiled")
ALL_MODES = (*MODES, "compiled-reference")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Milliseconds per call, mean of ``repeats`` calls after one warm-up call."""
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return 1e3 * (time.perf_counter() - start) / repeats


def _kernel_inputs(model: CRFModel) -> dict[str, tuple]:
    """Arguments of each kernel from the instance (the last, appearance, lattice term)."""
    lat = model.terms[-1].kernel.lattice
    q = torch.softmax(-model.unary, -1)
    b, n, m = q.shape
    values = q.reshape(b * n, m)
    rows = lat.n_vertices + 1
    splat = lattice_filter.lattice_splat_reference(values, lat.offsets, lat.weights, rows)
    blurred = lattice_filter.lattice_blur_reference(splat, lat.neighbours)
    alpha = torch.rand(b, 1, 1, dtype=torch.float64, device=q.device)
    return {
        "lattice_splat": (values, lat.offsets, lat.weights, rows),
        "lattice_blur": (splat, lat.neighbours),
        "lattice_slice": (blurred, lat.offsets, lat.slice_weights),
        "meanfield_normalise": (3.0 * q, model.unary),
        "frank_wolfe_direction": (model.unary, q),
        "frank_wolfe_update": (q, model.unary, q - 0.5, 2.0 * q, alpha),
        "project_simplex": ((2.0 * q - model.unary) / 4.0,),
    }


def _kernel_function(name: str) -> Callable:
    module = lattice_filter if name.startswith("lattice") else crf_updates
    return getattr(module, name)


def _errors(out, ref) -> tuple[float, float]:
    """Largest absolute error and largest error relative to each reference tensor's scale."""
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    abs_err = rel_err = 0.0
    for o, r in zip(outs, refs):
        err = float((o.double() - r.double()).abs().max()) if r.numel() else 0.0
        abs_err = max(abs_err, err)
        rel_err = max(rel_err, err / max(float(r.abs().max()) if r.numel() else 0.0, 1e-30))
    return abs_err, rel_err


def kernel_checks(model: CRFModel, repeats: int = 3) -> list[dict]:
    """Each kernel's Triton output against its reference, with both timings."""
    device = model.unary.device
    rows = []
    for name, args in _kernel_inputs(model).items():
        fn = _kernel_function(name)
        out, ref = fn(*args, use_triton=True), fn(*args, use_triton=False)
        abs_err, rel_err = _errors(out, ref)
        ok = rel_err <= TOLERANCE["rtol"] or abs_err <= TOLERANCE["atol"]
        rows.append(
            {
                "kind": "kernel",
                "name": name,
                "mode": "triton vs reference",
                "ms": _time(lambda f=fn, a=args: f(*a, use_triton=True), device, repeats),
                "reference_ms": _time(
                    lambda f=fn, a=args: f(*a, use_triton=False), device, repeats
                ),
                "max_abs_err": abs_err,
                "max_rel_err": rel_err,
                "ok": ok,
            }
        )
    return rows


def _step_row(
    case: Case, mode: str, device: torch.device, iterations: int
) -> tuple[dict, tuple[torch.Tensor, ...]]:
    """Time ``case.step`` in one mode: the first call, then ms per step; also returns the
    states after one and after ``iterations`` steps from the case's start."""
    step = case.step
    if mode.startswith("compiled"):
        torch._dynamo.reset()
        step = torch.compile(case.step, fullgraph=True)
    start = time.perf_counter()
    state = step(case.state)
    _sync(device)
    first = time.perf_counter() - start
    one = tuple(state) if isinstance(state, tuple) else (state,)
    for _ in range(iterations - 1):
        state = step(state)

    def run_all() -> None:
        s = case.state
        for _ in range(iterations):
            s = step(s)

    ms = _time(run_all, device, 1) / iterations
    row = {"kind": "step", "name": case.name, "mode": mode, "ms": ms, "first_s": first}
    return row, one, tuple(state) if isinstance(state, tuple) else (state,)


def _backend_for(mode: str, device: torch.device) -> str:
    if mode.endswith("reference"):
        return "reference"
    return "auto" if device.type == "cuda" else "triton"


def step_timings(
    model: CRFModel, modes: tuple[str, ...], iterations: int, deadline: float
) -> list[dict]:
    """Every solver step in every mode, each checked against the first mode's state after
    ``iterations`` steps; compiled modes are skipped once past ``deadline``."""
    device = model.unary.device
    rows = []
    for case in solver_cases(model):
        reference = None
        for mode in modes:
            if mode.startswith("compiled") and time.perf_counter() > deadline:
                rows.append({"kind": "step", "name": case.name, "mode": mode, "note": "budget"})
                continue
            with backend.kernel_backend(_backend_for(mode, device)):
                row, one, state = _step_row(case, mode, device, iterations)
            reference = (one, state) if reference is None else reference
            abs_err, rel_err = _errors(one, reference[0])
            rows.append(
                {
                    **row,
                    "max_abs_err": abs_err,
                    "max_rel_err": rel_err,
                    "max_rel_err_n": _errors(state, reference[1])[1],
                    "ok": rel_err <= STEP_TOLERANCE,
                }
            )
    return rows


def run(
    device: str | torch.device = "cuda",
    *,
    smoke: bool = False,
    iterations: int = 5,
    modes: tuple[str, ...] = MODES,
    budget_s: float = 70.0,
) -> list[dict]:
    """Kernel checks and step timings on ``device`` (see the module docstring); rows of dicts
    with ``kind`` ("setup" / "kernel" / "step"), ``name``, ``mode``, ``ms``, ``first_s`` and,
    for checks, ``max_abs_err``, ``max_rel_err`` and ``ok``."""
    start = time.perf_counter()
    device = torch.device(device)
    if not set(modes) <= set(ALL_MODES):
        raise ValueError(f"modes must be among {ALL_MODES}, got {modes}")
    if not backend.HAS_TRITON or not (device.type == "cuda" or backend.INTERPRET):
        raise RuntimeError("no Triton path here: use a CUDA device or set TRITON_INTERPRET=1")
    (h, w), m = (SMOKE_SIZE, SMOKE_LABELS) if smoke else ((SIZE, SIZE), LABELS)
    model = instance(h, w, m, device=str(device))
    build = time.perf_counter() - start
    rows = [{"kind": "setup", "name": f"instance {h}x{w}x{m}", "mode": "build", "first_s": build}]
    rows += kernel_checks(model, repeats=iterations)
    rows += step_timings(model, modes, iterations, deadline=start + budget_s)
    total = time.perf_counter() - start
    rows.append({"kind": "setup", "name": "total", "mode": "", "first_s": total})
    return rows


def format_table(rows: list[dict]) -> str:
    """One line per row: kind, name, mode, ms, first call / reference ms, check."""
    lines = [f"{'kind':<7}{'name':<24}{'mode':<21}{'ms':>10}{'first_s':>9}{'ref_ms':>9}  check"]
    for r in rows:
        ms = f"{r['ms']:.3f}" if "ms" in r else "-"
        first = f"{r['first_s']:.2f}" if "first_s" in r else "-"
        ref = f"{r['reference_ms']:.3f}" if "reference_ms" in r else "-"
        check = r.get("note", "")
        if "ok" in r:
            verdict = "ok" if r["ok"] else "FAIL"
            check = f"{verdict} abs {r['max_abs_err']:.1e} rel {r['max_rel_err']:.1e}"
        lines.append(
            f"{r['kind']:<7}{r['name']:<24}{r['mode']:<21}{ms:>10}{first:>9}{ref:>9}  {check}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny instance (runs on CPU)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--all-modes", action="store_true", help="also compiled-reference")
    args = parser.parse_args(argv)
    modes = ALL_MODES if args.all_modes else MODES
    rows = run(args.device, smoke=args.smoke, iterations=args.iterations, modes=modes)
    print(format_table(rows))
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
