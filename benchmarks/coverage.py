"""Coverage of the VNN-COMP 2022 and 2023 networks (issue 12): which load, how closely the
loaded module follows onnxruntime, and whether CROWN's bounds contain sampled outputs.

For every `.onnx` / `.onnx.gz` under `../shared/data/vnncomp2022` and `vnncomp2023`:
  - load it (`verify.load_onnx`) and build the bound graph; a refusal is recorded with the
    operation and node it names;
  - max |ours - onnxruntime| over 8 random inputs in [-1, 1] and [0, 1] (float32 both);
  - CROWN bounds (float64 graph; intermediate bounds under a per-network deadline, after which
    the remaining neurons keep their IBP intervals, still sound) on the input box of the first
    property listed for the network in `instances.csv` (else an L-inf ball of radius 0.01 around
    a random input in [0, 1]), for up to 10 output functionals (the outputs themselves when
    there are at most 10, else random directions), checked against `--samples` uniform samples
    of the box (plus corners) evaluated in float64: sound when no sampled value leaves the
    bounds by more than 1e-7 (1 + |value|);
  - seconds per network (load to check).
  - alpha-CROWN (ALPHA_ITERATIONS Adam steps on the output's relaxation parameters, from the
    CROWN intervals) checked against the same samples;
`verify run-all` against the winner's answers is `benchmarks/runall_truth.py`; its last results
fill the last column.

    python -m benchmarks.coverage                 # both folders, writes results/coverage.*
    python -m benchmarks.coverage --only test --samples 1000 --no-write
    python -m benchmarks.coverage --only traffic_signs --out coverage_traffic_signs  # one file
"""

from __future__ import annotations

import argparse
import copy
import csv
import gzip
import json
import time
from pathlib import Path

import numpy as np
import torch

from bounds.errors import VerificationInputError
from bounds.graph.graph import build_graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.backward import backward_bound
from bounds.methods.crown import (
    crown_intervals,
    default_lines,
    interval_bound,
    output_functional,
    split_output,
)
from bounds.types import Interval
from verify import load_onnx, load_vnnlib
from verify.errors import SpecificationError
from verify.specs import region_box

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
FOLDERS = ("vnncomp2022", "vnncomp2023")
MAX_SPECS = 10
EPS = 0.01
TOL = 1e-7
ALPHA_ITERATIONS = 5


def networks(data: Path = DATA) -> list[tuple[str, Path]]:
    """(benchmark label, path) of every network file, sorted."""
    out = []
    for folder in FOLDERS:
        for path in sorted((data / folder).rglob("*")):
            if path.name.endswith((".onnx", ".onnx.gz")) and path.is_file():
                bench = path.relative_to(data / folder).parts[0]
                out.append((f"{folder[-4:]}/{bench}", path))
    return out


def first_property(path: Path) -> Path | None:
    """The first VNN-LIB file `instances.csv` lists for the network at `path`, if any."""
    for folder in [path.parent, *path.parents]:
        table = folder / "instances.csv"
        if table.exists():
            with open(table, newline="") as f:
                for row in csv.reader(f):
                    if row and Path(row[0]).name.removesuffix(".gz") == path.name.removesuffix(
                        ".gz"
                    ):
                        prop = folder / row[1]
                        return prop if prop.exists() else prop.with_name(prop.name + ".gz")
            return None
    return None


def ort_max_error(gm, path: Path, seed: int = 0) -> float:
    """max |gm(x) - onnxruntime(x)| over 8 random inputs (all outputs, flattened in order)."""
    import onnxruntime as ort

    data = path.read_bytes()
    data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    infos = session.get_inputs()
    shapes = [[d if isinstance(d, int) and d > 0 else 1 for d in i.shape] for i in infos]
    rng = np.random.default_rng(seed)
    shape = gm.input_shape
    xs = np.concatenate([rng.uniform(-1, 1, (4, *shape)), rng.uniform(0, 1, (4, *shape))])
    xs = xs.astype(np.float32)
    worst = 0.0
    for x in xs:
        flat, feeds, start = x.reshape(-1), {}, 0
        for info, s in zip(infos, shapes):
            size = int(np.prod(s))
            feeds[info.name] = flat[start : start + size].reshape(s)
            start += size
        expected = np.concatenate(
            [np.asarray(o, np.float32).reshape(-1) for o in session.run(None, feeds)]
        )
        with torch.no_grad():
            got = gm(torch.from_numpy(x[None])).reshape(-1).numpy()
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def input_box(gm, prop: Path | None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """`[1, *input_shape]` float64 bounds: the first property's first region, else an eps ball."""
    if prop is not None:
        try:
            region = load_vnnlib(prop).regions[0]
            lower, upper = region_box(region, gm.input_shape, torch.float64)
            return lower, upper, prop.name
        except (SpecificationError, VerificationInputError, RuntimeError, ValueError):
            pass
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(1, *gm.input_shape, generator=gen, dtype=torch.float64)
    return x - EPS, x + EPS, f"eps={EPS} ball"


def crown_bounds(graph, box: Interval, C: torch.Tensor, seconds: float):
    """CROWN bounds on `C y` with the intermediate bounds under a deadline (sound either way),
    then alpha-CROWN on the output's relaxation parameters from those intervals:
    `(crown lower, crown upper, alpha lower, alpha upper, deadline hit)`."""
    deadline = time.monotonic() + seconds
    intervals = crown_intervals(graph, box, deadline=deadline)
    A = output_functional(graph, C)
    result = backward_bound(graph, graph.output.name, A, box, default_lines(graph, intervals))
    result = torch.maximum(result, interval_bound(C, intervals[graph.output.name]))
    config = AlphaCrownConfig(iterations=ALPHA_ITERATIONS, optimize_intermediate=False)
    a_low, a_up, _, _ = alpha_crown(graph, box, C, config, intervals=intervals)
    return (*split_output(result), a_low, a_up, time.monotonic() > deadline)


def _excess(low, up, values):
    return float((torch.maximum(low - values, values - up) / (1 + values.abs())).max())


def check_bounds(gm, graph, lower, upper, samples: int, seconds: float, seed: int = 0) -> dict:
    """CROWN on the box against `samples` sampled outputs (float64 throughout)."""
    graph64 = graph.to(torch.float64)
    net64 = copy.deepcopy(gm).double()
    n_out = int(np.prod(gm.output_shape))
    gen = torch.Generator().manual_seed(seed)
    if n_out <= MAX_SPECS:
        C = torch.eye(n_out, dtype=torch.float64)[None]
    else:
        C = torch.randn(1, MAX_SPECS, n_out, generator=gen, dtype=torch.float64)
    start = time.perf_counter()
    low, up, a_low, a_up, cut = crown_bounds(graph64, Interval(lower, upper), C, seconds)
    crown_s = time.perf_counter() - start
    worst = worst_alpha = -np.inf
    numel = lower[0].numel()
    chunk = max(1, min(1000, (1 << 24) // max(numel, n_out)))
    done = 0
    with torch.no_grad():
        while done < samples:
            k = min(chunk, samples - done)
            t = torch.rand(k, *lower.shape[1:], generator=gen, dtype=torch.float64)
            if done == 0:  # two corners
                t[:2] = torch.stack([torch.zeros_like(t[0]), torch.ones_like(t[0])])
            x = lower + t * (upper - lower)
            values = net64(x).reshape(k, -1) @ C[0].T
            worst = max(worst, _excess(low, up, values))
            worst_alpha = max(worst_alpha, _excess(a_low, a_up, values))
            done += k
    return {
        "sound": bool(worst <= TOL),
        "alpha_sound": bool(worst_alpha <= TOL),
        "max_relative_excess": worst,
        "alpha_max_relative_excess": worst_alpha,
        "alpha_mean_width": float((a_up - a_low).mean()),
        "mean_width": float((up - low).mean()),
        "crown_seconds": crown_s,
        "deadline_hit": bool(cut),
        "specs": int(C.shape[1]),
    }


def check_network(path: Path, samples: int, seconds: float) -> dict:
    start = time.perf_counter()
    record: dict = {"network": path.name}
    try:
        gm = load_onnx(path)
        graph = build_graph(gm, gm.input_shape)
    except VerificationInputError as err:
        record.update(loaded=False, reason=str(err), operation=getattr(err, "operation", None),
                      node=getattr(err, "node", None))  # fmt: skip
        record["seconds"] = time.perf_counter() - start
        return record
    record.update(loaded=True, input_shape=list(gm.input_shape), output_shape=list(gm.output_shape))
    record["ort_max_error"] = ort_max_error(gm, path)
    lower, upper, source = input_box(gm, first_property(path))
    record["box"] = source
    try:
        record.update(check_bounds(gm, graph, lower, upper, samples, seconds), bounded=True)
    except VerificationInputError as err:  # a typed refusal while bounding (e.g. exp overflow)
        record.update(bounded=False, sound=False, alpha_sound=False, bound_reason=str(err))
    record["seconds"] = time.perf_counter() - start
    return record


def summarise(records: list[dict]) -> list[dict]:
    rows = []
    for bench in dict.fromkeys(r["benchmark"] for r in records):
        mine = [r for r in records if r["benchmark"] == bench]
        loaded = [r for r in mine if r["loaded"]]
        rows.append({
            "benchmark": bench,
            "loaded": len(loaded),
            "total": len(mine),
            "ort_max_error": max((r["ort_max_error"] for r in loaded), default=None),
            "crown_sound": sum(r["sound"] for r in loaded),
            "alpha_sound": sum(r["alpha_sound"] for r in loaded),
            "seconds_per_network": float(np.mean([r["seconds"] for r in mine])),
            "refusals": sorted({f"{r.get('operation') or 'error'} at {r.get('node') or '?'}"
                                for r in mine if not r["loaded"]}),
        })  # fmt: skip
    return rows


def run_all_column() -> dict[str, str]:
    """`correct / winner answered (wrong, unanswered)` per 2023 benchmark from the last
    `benchmarks/runall_truth.py` run (results/runall_truth.json), if any."""
    path = RESULTS / "runall_truth.json"
    if not path.exists():
        return {}
    found = json.loads(path.read_text())
    scale = found["meta"]["scale"]
    return {f"2023/{r['benchmark']}": f"{r['correct']}/{r['winner_answered']} correct, "
            f"{r['wrong']} wrong, {r['unanswered']} unanswered (x{scale:g})"
            for r in found["rows"]}  # fmt: skip


def table(rows: list[dict]) -> str:
    head = ("| benchmark | loaded | max abs(ours - onnxruntime) | CROWN sound (10k samples) "
            "| alpha-CROWN sound | s / network | verify run-all vs truth/ |\n"
            "|---|---|---|---|---|---|---|\n")  # fmt: skip
    lines, run_all = [], run_all_column()
    for r in rows:
        err = "-" if r["ort_max_error"] is None else f"{r['ort_max_error']:.1e}"
        sound = f"{r['crown_sound']}/{r['loaded']}" if r["loaded"] else "-"
        alpha = f"{r['alpha_sound']}/{r['loaded']}" if r["loaded"] else "-"
        lines.append(f"| {r['benchmark']} | {r['loaded']}/{r['total']} | {err} | {sound} "
                     f"| {alpha} | {r['seconds_per_network']:.1f} "
                     f"| {run_all.get(r['benchmark'], 'not run')} |")  # fmt: skip
    loaded, total = sum(r["loaded"] for r in rows), sum(r["total"] for r in rows)
    crown_ok, alpha_ok = sum(r["crown_sound"] for r in rows), sum(r["alpha_sound"] for r in rows)
    lines.append(
        f"| **all** | **{loaded}/{total}** | | {crown_ok}/{loaded} | {alpha_ok}/{loaded} | | |"
    )
    return head + "\n".join(lines)


def refusals(records: list[dict]) -> str:
    lines = [
        f"- {r['benchmark']}/{r['network']}: {r['reason']}" for r in records if not r["loaded"]
    ]
    return "\n".join(lines) or "- none"


def bound_refusals(records: list[dict]) -> str:
    lines = [
        f"- {r['benchmark']}/{r['network']}: {r['bound_reason']}"
        for r in records
        if r["loaded"] and not r.get("bounded", True)
    ]
    return "\n".join(lines) or "- none"


def write(records: list[dict], args: argparse.Namespace) -> str:
    """The table of `records`, written to results/<out>.md and .json (`--out`, default
    `coverage`; after every network: an interrupted run keeps the networks it finished)."""
    rows = summarise(records)
    text = table(rows)
    if args.no_write:
        return text
    RESULTS.mkdir(parents=True, exist_ok=True)
    only = f" --only {args.only} --out {args.out}" if args.only else ""
    md = (f"# Coverage of the VNN-COMP 2022/2023 networks\n\n`python -m benchmarks.coverage "
          f"--samples {args.samples} --seconds {args.seconds}{only}`\n\n{text}\n\n"
          "The last column is from `benchmarks/runall_truth.py` (its last results).\n\n"
          f"## Refusals (loading)\n\n{refusals(records)}\n\n"
          f"## Refusals (bounding: a typed error, counted as not sound)\n\n"
          f"{bound_refusals(records)}\n")  # fmt: skip
    (RESULTS / f"{args.out}.md").write_text(md)
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps({"summary": rows, "networks": records}, indent=1)
    )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="CROWN intermediate deadline")
    parser.add_argument("--only", default=None, help="benchmarks whose label contains this")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--out", default="coverage", help="results/<out>.md and .json")
    args = parser.parse_args()
    if args.only and args.out == "coverage" and not args.no_write:
        parser.error("--only would overwrite results/coverage.*: name another --out")
    torch.set_num_threads(1)
    records = []
    for bench, path in networks():
        if args.only and args.only not in bench:
            continue
        record = {"benchmark": bench, **check_network(path, args.samples, args.seconds)}
        if not record["loaded"]:
            status = "refused"
        elif not record["bounded"]:
            status = "no bound"
        else:
            status = "sound" if record["sound"] and record["alpha_sound"] else "UNSOUND"
        print(f"{bench:22s} {path.name:60s} {status:8s} {record['seconds']:7.1f} s", flush=True)
        records.append(record)
        text = write(records, args)
    print(text)


if __name__ == "__main__":
    main()
