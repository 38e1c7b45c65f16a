"""One GPU session's checks and timings, written to `benchmarks/results/gpu_check.{txt,json}`.

1. Bounds on CUDA equal bounds on CPU (ibp, crown, alpha-crown, prox; a random conv net), and
   are sound on sampled points.
2. The proximal block-step kernels against their reference, and their bandwidth against a
   device copy (`benchmarks/gpu_check_prox.py`).
3. Solver steps eager vs `torch.compile` (Inductor -> Triton), compile time included, on an
   OVAL cifar_wide-shaped net (conv 3->16 4x4/2, conv 16->32 4x4/2, fc 2048->100->10; random
   weights) with a batch of 1,024 domains x 9 specs: prox sweep, supergradient step,
   alpha-CROWN step (final-layer slopes); steps not started within 150 s are skipped.
4. The dense-CRF kernels and steps on a 512x512 image with 21 labels
   (`benchmarks/gpu_check_crf.py`).
5. The Anderson-relaxation solvers (active set, sp-fw) on the cifar_wide-shaped net with
   1,024 domains x 9 specs (halved until it fits the device's memory; the batch that ran is
   reported): seconds per iteration on the device, the same per domain on the CPU (at 16
   domains), and the device's bounds against the CPU's on 2 domains.

Designed to finish in under 5 minutes on an H200 (`benchmarks/gpu_check.sh`); `--smoke` runs
tiny sizes on CPU (Triton through its interpreter) so that the script itself is tested here.

    python -m benchmarks.gpu_check [--smoke] [--skip crf,prox,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

if not torch.cuda.is_available():  # the interpreter must be chosen before kernels are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify
from bounds.compile import compiled
from bounds.dual import decompose, initial_duals, problem_from_intervals, proximal, supergradient
from bounds.methods import alpha_crown as ac
from bounds.methods.crown import crown_intervals, output_functional
from bounds.types import Interval

RESULTS = Path(__file__).resolve().parent / "results"
FULL = {"batch": 1024, "specs": 9, "side": 32, "iters": 20, "steps_s": 150, "cpu_batch": 16}
SMOKE = {"batch": 2, "specs": 2, "side": 8, "iters": 2, "steps_s": 600, "cpu_batch": 2}


def cifar_wide_like(side: int) -> nn.Sequential:
    """The layer shapes of OVAL's cifar_wide_kw (random weights)."""
    torch.manual_seed(0)
    flat = 32 * (side // 4) ** 2
    return nn.Sequential(
        nn.Conv2d(3, 16, 4, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(flat, 100), nn.ReLU(), nn.Linear(100, 10),
    ).eval()  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _ms(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters * 1e3


def check_bounds(device: torch.device, size: dict) -> list[dict]:
    """Part 1: CUDA bounds == CPU bounds (float64 nets), sound on samples."""
    net = cifar_wide_like(size["side"]).double()
    x = torch.rand(2, 3, size["side"], size["side"], dtype=torch.float64)
    rows = []
    for method, options in (("ibp", {}), ("crown", {}), ("alpha-crown", {"iterations": 5}),
                            ("prox", {"iterations": 10, "init_iterations": 5})):  # fmt: skip
        cpu = verify.bounds(net, 0.01, x=x, method=method, compile=False, **options)
        dev = verify.bounds(net, 0.01, x=x.to(device), method=method, **options)
        samples = x + 0.01 * (2 * torch.rand(64, *x.shape, dtype=x.dtype) - 1)
        outputs = net(samples.flatten(0, 1)).reshape(64, *cpu.lower.shape)
        sound = bool((outputs >= dev.lower.cpu() - 1e-9).all() & (outputs <= dev.upper.cpu() + 1e-9).all())
        diff = float((dev.lower.cpu() - cpu.lower).abs().max())
        rows.append({"part": "bounds", "case": method, "max_abs_diff": diff, "sound": sound,
                     "ok": sound and diff <= 1e-6 * (1 + float(cpu.lower.abs().max()))})  # fmt: skip
    return rows


def _problem(device: torch.device, size: dict):
    net = cifar_wide_like(size["side"])
    graph = verify.network_graph(net, (3, size["side"], size["side"])).to(torch.float32, device)
    x = torch.rand(size["batch"], 3, size["side"], size["side"], device=device)
    box = Interval(x - 2 / 255, x + 2 / 255)
    C = torch.randn(size["batch"], size["specs"], 10, device=device)
    intervals = crown_intervals(graph, box)
    c = output_functional(graph, C)
    return graph, box, C, intervals, problem_from_intervals(decompose(graph), box, intervals, c)


def solver_steps(device: torch.device, size: dict) -> list[dict]:
    """Part 3: eager vs compiled solver steps (first compiled call = compile time)."""
    graph, box, C, intervals, problem = _problem(device, size)
    state, scale = proximal.initial_state(problem, initial_duals(problem))
    factor = torch.ones((), device=device)
    sg_state = supergradient.initial_state(problem, initial_duals(problem))
    step = torch.full((), 1e-3, device=device)
    ap = ac._Problem(graph, box, C, intervals, {}, (), {})
    alphas = ac._init_alphas(ap)
    ap = ac._Problem(graph, box, C, intervals, {}, tuple(alphas), {})
    a_state, lr = ac._initial_state(ap, alphas), torch.full((), 0.1, device=device)
    cases = {
        "prox sweep": (proximal.sweep_step, (problem, state, factor, scale)),
        "supergradient": (supergradient.ascent_step, (problem, sg_state, step)),
        "alpha-crown final": (ac.alpha_step, (ap, a_state, lr)),
    }
    rows, start_part = [], time.perf_counter()
    for name, (fn, args) in cases.items():
        if time.perf_counter() - start_part > size["steps_s"]:
            rows.append({"part": "steps", "case": name, "skipped": "time budget of the part"})
            continue
        eager = _ms(lambda fn=fn, args=args: fn(*args), size["iters"], device)
        fused = compiled(fn)
        start = time.perf_counter()
        out = fused(*args)
        _sync(device)
        compile_s = time.perf_counter() - start
        ms = _ms(lambda fused=fused, args=args: fused(*args), size["iters"], device)
        diff = output_difference(out, fn(*args))
        rows.append({"part": "steps", "case": name, "eager_ms": eager, "compiled_ms": ms,
                     "speedup": eager / ms, "compile_s": compile_s, "max_rel_diff": diff,
                     "ok": diff <= 1e-3})  # fmt: skip
    return rows


def output_difference(compiled_out: object, eager_out: object) -> float:
    """Largest `|a - b| / (1 + |b|)` over the tensors of a compiled step's output and the
    eager step's; inf when their structures differ. A timing of a compiled step is only worth
    its output: on 2026-11-30 the compiled prox sweep returned states that had lost items
    (`NamedTuple._replace` under torch 2.11's Dynamo) and timed 0.143 ms, below what a whole
    sweep's reads and writes take at the H200's bandwidth."""
    a, b = _flat(compiled_out), _flat(eager_out)
    if a is None or b is None or len(a) != len(b):
        return float("inf")
    diffs = [_relative(x, y) for x, y in zip(a, b) if y.numel()]
    return max(diffs, default=0.0)


def _relative(x: torch.Tensor, y: torch.Tensor) -> float:
    """Largest `|x - y| / (1 + |y|)`, equal entries (infinities included) counting 0."""
    if x.shape != y.shape:
        return float("inf")
    return float(torch.where(x == y, 0.0, (x - y).abs() / (1 + y.abs())).max())


def _flat(tree: object) -> list[torch.Tensor] | None:
    """The tensors of nested tuples / lists in order (None for anything else, or a
    NamedTuple with fewer items than fields)."""
    if isinstance(tree, torch.Tensor):
        return [tree.detach()]
    if not isinstance(tree, (tuple, list)):
        return None
    fields = getattr(type(tree), "_fields", None)
    if fields is not None and tuple.__len__(tree) != len(fields):
        return None
    out: list[torch.Tensor] = []
    for item in tuple.__iter__(tree) if isinstance(tree, tuple) else tree:
        flat = _flat(item)
        if flat is None:
            return None
        out += flat
    return out


def _anderson_run(device: torch.device, size: dict, batch: int, method: str, seed: int = 0):
    """`method`'s bound on `batch` domains x `size['specs']` specs of the cifar_wide-shaped net
    (float32, CROWN intermediate bounds and start), `size['iters']` iterations; returns the
    bound and the solver's seconds (synchronised)."""
    from bounds.dual import active_set, sp_fw
    from bounds.dual.anderson.problem import anderson_layers, anderson_slopes, problem_from_graph

    net = cifar_wide_like(size["side"])
    graph = verify.network_graph(net, (3, size["side"], size["side"])).to(torch.float32, device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, 3, size["side"], size["side"], generator=gen).to(device)
    C = torch.randn(batch, size["specs"], 10, generator=gen).to(device)
    box = Interval(x - 2 / 255, x + 2 / 255)
    intervals = crown_intervals(graph, box)
    problem = problem_from_graph(graph, box, intervals, output_functional(graph, C),
                                 anderson_layers(graph))  # fmt: skip
    init = active_set.big_m_from_slopes(problem, anderson_slopes(problem, None))
    iters = size["iters"]
    solve, config = {
        "active-set": (active_set.solve, active_set.ActiveSetConfig(
            iterations=iters, big_m_iterations=iters // 4, cut_frequency=max(1, iters // 4))),
        "sp-fw": (sp_fw.solve, sp_fw.SpFwConfig(iterations=iters, big_m_iterations=iters // 4)),
    }[method]  # fmt: skip
    _sync(device)
    start = time.perf_counter()
    result = solve(problem, config, init)
    _sync(device)
    return result.lower, time.perf_counter() - start


def _fitting_run(device: torch.device, size: dict, batch: int, method: str) -> tuple[int, float]:
    """`_anderson_run` at `batch` domains, halved after each out-of-memory error (the dense cut
    terms grow with domains x specs x cuts x inputs: 1,024 x 9 asked for 18 GiB at once on the
    H200 with 127 GiB in use); returns the batch that ran and its seconds. Raises the error at
    batch 1."""
    while True:
        try:
            return batch, _anderson_run(device, size, batch, method)[1]
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
        # outside the handler: the failed attempt's tensors (held by the traceback) are freed
        batch //= 2
        if device.type == "cuda":
            torch.cuda.empty_cache()  # its blocks back, unfragmented, for the smaller batch


def anderson_steps(device: torch.device, size: dict) -> list[dict]:
    """Part 5: the Anderson solvers, device vs CPU (see the module docstring); the device's
    batch is halved until it fits its memory (`batch`: the one that ran; `batch_asked`)."""
    rows, start_part = [], time.perf_counter()
    cpu = torch.device("cpu")
    for method in ("active-set", "sp-fw"):
        if time.perf_counter() - start_part > size["steps_s"]:
            rows.append({"part": "anderson", "case": method, "skipped": "time budget of the part"})
            continue
        batch, dev_s = _fitting_run(device, size, size["batch"], method)
        _, cpu_s = _anderson_run(cpu, size, size["cpu_batch"], method)
        on_dev, _ = _anderson_run(device, size, 2, method, seed=1)
        on_cpu, _ = _anderson_run(cpu, size, 2, method, seed=1)
        diff = float((on_dev.cpu() - on_cpu).abs().max())
        scale = 1 + float(on_cpu.abs().max())
        per_iter = dev_s / size["iters"]
        cpu_per_domain = cpu_s / size["iters"] / size["cpu_batch"]
        rows.append({"part": "anderson", "case": method, "batch": batch,
                     "batch_asked": size["batch"], "specs": size["specs"],
                     "device_s_per_iter": per_iter,
                     "cpu_s_per_iter_per_domain": cpu_per_domain,
                     "speedup_per_domain": cpu_per_domain * batch / per_iter,
                     "max_abs_diff": diff, "ok": diff <= 1e-3 * scale})  # fmt: skip
    return rows


def run(
    device: torch.device, smoke: bool, skip: set[str], save: Callable[[list[dict]], None] = lambda rows: None
) -> list[dict]:
    """All parts in turn; `save` gets the rows after each part (a run cut short keeps what it did)."""
    size = SMOKE if smoke else FULL
    rows: list[dict] = []
    parts = {
        "bounds": lambda: check_bounds(device, size),
        "prox": lambda: _tagged("prox-kernels", _prox_kernels(device, smoke)),
        "steps": lambda: solver_steps(device, size),
        "crf": lambda: _tagged("crf", _crf(device, smoke)),
        "anderson": lambda: anderson_steps(device, size),
    }
    for name, part in parts.items():
        if name in skip:
            continue
        start = time.perf_counter()
        try:
            rows += part()
        except Exception as error:  # a failing part must not hide the others' results
            where = traceback.format_exc(limit=-4).replace("\n", " | ")[-1200:]
            rows.append({"part": name, "case": "ERROR", "error": repr(error)[:300], "where": where,
                         "ok": False})  # fmt: skip
        print(f"[{name}: {time.perf_counter() - start:.1f} s]", flush=True)
        save(rows)
    return rows


def _prox_kernels(device: torch.device, smoke: bool) -> list[dict]:
    from benchmarks import gpu_check_prox

    return gpu_check_prox.run(device, smoke=smoke)


def _crf(device: torch.device, smoke: bool) -> list[dict]:
    from benchmarks import gpu_check_crf

    return gpu_check_crf.run(str(device), smoke=smoke)


def _tagged(part: str, rows: list[dict]) -> list[dict]:
    return [{"part": part, **row} for row in rows]


def format_rows(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        cells = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (runs on CPU)")
    parser.add_argument("--skip", default="", help="comma-separated parts: bounds,prox,steps,crf,anderson")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.smoke:
        parser.error("no CUDA device: use --smoke for the CPU self-test")
    name = "gpu_check_smoke" if args.smoke else "gpu_check"
    header = (f"# python -m benchmarks.gpu_check{' --smoke' if args.smoke else ''} "
              f"({time.strftime('%Y-%m-%d %H:%M')}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
              f"torch {torch.__version__})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)

    def save(rows: list[dict]) -> None:
        (args.out / f"{name}.txt").write_text(header + "\n" + format_rows(rows) + "\n")
        (args.out / f"{name}.json").write_text(json.dumps(rows, indent=1, default=str))

    rows = run(device, args.smoke, set(filter(None, args.skip.split(","))), save)
    print(header + "\n" + format_rows(rows))
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
