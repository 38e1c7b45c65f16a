"""Bounds under floating-point rounding (issue 24): samples outside each method's bounds on the
networks of `../shared/data` and the float-trap zoo, and the cost of sound rounding, for this
checkout and a baseline revision side by side in one run (same inputs, same samples).

Per network (its first property's box, as `benchmarks/coverage.py` picks it; the first 10
outputs), per method (ibp, crown, alpha-crown with 5 iterations; 30 s budget per call): the
count of sampled outputs outside the bounds, compared with no tolerance, and the worst excess.
Samples: the box's centre, up to 64 corners and `--samples` uniform points, evaluated by the
network in float64 (for the float32 networks of the data, float64 evaluation errs by about 1e-16
of the values' magnitudes, far below float32 rounding; the zoo's float64 nets are checked
exactly in `tests/test_rounding.py`). Timing: seconds per `verify.bounds` call (median of 5,
1 thread; also prox and big-m, 20 iterations, whose values are certified since) on ACAS Xu 1_1,
mnist 256x6 and OVAL cifar_base, eps 0.01 around a fixed input, and the mean relative width
added (|new - old| / |old| of the final bounds).

    python -m benchmarks.float_soundness [--baseline REV] [--samples 300] [--only acas,...]

The baseline runs from a `git worktree` of REV (default: the commit before `bounds/rounding.py`
existed), made by `benchmarks/side_by_side.base_tree`; each network runs in its own worker
process per checkout (a network too large for the memory left costs its row only). Writes
results/NAME.{json,md} (the JSON after every network).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.side_by_side import base_tree

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ibp", "crown", "alpha-crown")
TIMED_METHODS = (*METHODS, "prox", "big-m")  # the dual methods' values are certified too
TIMED = {
    "acas_1_1": "vnncomp2022/acasxu/onnx/ACASXU_run2a_1_1_batch_2000.onnx.gz",
    "mnist_256x6": "vnncomp2022/mnist_fc/onnx/mnist-net_256x6.onnx.gz",
    "oval_base": "vnncomp2022/oval21/onnx/cifar_base_kw.onnx.gz",
}


def _options(method: str) -> dict:
    if method == "alpha-crown":
        return {"iterations": 5}
    return {"iterations": 20} if method in ("prox", "big-m") else {}


def _samples(low: torch.Tensor, high: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """`[k, *shape]` points of the box: centre, up to 64 corners, `count` uniform points."""
    gen = torch.Generator().manual_seed(seed)
    flat_l, flat_h = low.reshape(-1), high.reshape(-1)
    n = flat_l.numel()
    bits = (
        torch.randint(0, 2, (64, n), generator=gen, dtype=torch.bool)
        if n > 6
        else torch.tensor([[(k >> j) & 1 for j in range(n)] for k in range(2**n)], dtype=torch.bool)
    )
    corners = torch.where(bits, flat_h, flat_l)
    t = torch.rand(count, n, generator=gen, dtype=torch.float64).to(low.dtype)
    uniform = torch.minimum(torch.maximum(flat_l + t * (flat_h - flat_l), flat_l), flat_h)
    centre = ((flat_l.double() + flat_h.double()) / 2).to(low.dtype)[None]
    return torch.cat([centre, corners, uniform]).reshape(-1, *low.shape[1:])


def check_network(path: Path, samples: int) -> dict:
    """One network's rows: per method the outside count and worst excess, and seconds."""
    import verify
    from benchmarks.coverage import first_property, input_box

    net = verify.load_onnx(path)
    shape = tuple(net.input_shape)
    low64, high64, where = input_box(net, first_property(path))
    dtype = next((p.dtype for p in net.parameters()), torch.float32)
    low, high = low64.to(dtype), high64.to(dtype)
    with torch.no_grad():
        out_dim = int(net(low).reshape(1, -1).shape[1])
    k = min(10, out_dim)
    C = torch.eye(out_dim, dtype=dtype)[:k][None]
    points = _samples(low, high, samples, seed=0)
    twin = copy.deepcopy(net).double()
    with torch.no_grad():
        values = torch.cat([twin(p[None].double()).reshape(1, -1)[:, :k] for p in points])
    row = {"net": str(path.relative_to(path.parents[3])), "box": where, "points": len(points)}
    for method in METHODS:
        start = time.perf_counter()
        try:
            b = verify.bounds(net, lower=low, upper=high, C=C, input_shape=shape, method=method,
                              budget=30.0, **_options(method))  # fmt: skip
        except Exception as err:
            row[method] = {"error": f"{type(err).__name__}: {err}"[:200]}
            continue
        lower, upper = b.lower.double()[0], b.upper.double()[0]
        excess = torch.maximum(lower - values, values - upper)
        row[method] = {
            "outside": int((excess > 0).sum()),
            "worst": float(excess.max()),
            "seconds": round(time.perf_counter() - start, 3),
            "lower": lower.tolist(),
            "upper": upper.tolist(),
        }
    return row


def time_calls(name: str, repeats: int = 5) -> dict:
    import verify

    data = ROOT.parent / "shared" / "data"
    net = verify.load_onnx(data / TIMED[name])
    shape = tuple(net.input_shape)
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(1, *shape, generator=gen)
    row = {"net": name}
    for method in TIMED_METHODS:
        verify.bounds(net, 0.01, x=x, method=method, **_options(method))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            b = verify.bounds(net, 0.01, x=x, method=method, **_options(method))
            times.append(time.perf_counter() - start)
        row[method] = {"seconds": statistics.median(times), "lower": b.lower[0].tolist(),
                       "upper": b.upper[0].tolist()}  # fmt: skip
    return row


def worker(args: argparse.Namespace) -> None:
    """Runs in the checkout on sys.path; prints one JSON document: one network's row
    (`--net`), or the timing rows (`--timing`)."""
    torch.set_num_threads(1)
    if args.timing:
        print(json.dumps([time_calls(name) for name in TIMED]))
        return
    path = Path(args.net)
    try:
        row = check_network(path, args.samples)
    except Exception as err:
        row = {
            "net": str(path.relative_to(path.parents[3])),
            "error": f"{type(err).__name__}: {err}"[:200],
        }
    print(json.dumps(row))


def _run_worker(code: Path, extra: list[str], samples: int):
    """This file as a script in `code`'s checkout (the baseline may not have it; `verify`,
    `bounds` and `benchmarks.coverage` then import from `code`): its JSON, or None when the
    worker died (a network too large for the memory left, killed)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--samples", str(samples),
           *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"worker exited with {done.returncode}: {done.stderr.strip()[-160:]}"
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def run_both(base: Path, args: argparse.Namespace, out: Path) -> tuple[dict, dict]:
    """Every network in its own worker per checkout (memory is returned between networks;
    a worker that dies costs its row only), the partial results saved after each."""
    from benchmarks.coverage import networks

    only = [s for s in args.only.split(",") if s]
    nets = [p for _, p in networks() if not only or any(s in str(p) for s in only)]
    old, new = {"rows": [], "timing": []}, {"rows": [], "timing": []}
    for i, path in enumerate(nets):
        for code, result in ((base, old), (ROOT, new)):
            row, error = _run_worker(code, ["--net", str(path)], args.samples)
            if row is None:
                row = {"net": str(path.relative_to(path.parents[3])), "error": error}
            result["rows"].append(row)
        print(f"[{i + 1}/{len(nets)}] {new['rows'][-1]['net']}", file=sys.stderr, flush=True)
        out.write_text(json.dumps({"partial": True, "new": new, "old": old}))
    if not args.no_timing:
        for code, result in ((base, old), (ROOT, new)):
            result["timing"] = _run_worker(code, ["--timing"], args.samples)[0] or []
    return old, new


def baseline_revision() -> str:
    """The commit before `bounds/rounding.py` was added."""
    first = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "bounds/rounding.py"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    return f"{first[-1]}~1" if first else "HEAD"


def summary(new: dict, old: dict) -> str:
    lines = ["| network | box | " + " | ".join(f"{m} outside (before -> after)" for m in METHODS) + " |",
             "|---|---|" + "---|" * len(METHODS)]  # fmt: skip
    old_rows = {r["net"]: r for r in old["rows"]}
    totals = {m: [0, 0] for m in METHODS}
    for r in new["rows"]:
        o = old_rows.get(r["net"], {})
        cells = []
        for m in METHODS:
            a, b = o.get(m, {}), r.get(m, {})
            if "outside" in a:
                totals[m][0] += a["outside"]
            if "outside" in b:
                totals[m][1] += b["outside"]
            fa = a.get("outside", a.get("error", o.get("error", "-")[:60]))
            fb = b.get("outside", b.get("error", r.get("error", "-")[:60]))
            cells.append(f"{fa} -> {fb}")
        lines.append(f"| {r['net']} | {r.get('box', '')} | " + " | ".join(cells) + " |")
    lines.append("| **total** | | " + " | ".join(f"{a} -> {b}" for a, b in totals.values()) + " |")
    if new["timing"] and old["timing"]:
        lines += ["", "| network | method | seconds before | after | ratio | "
                  "width added / abs(bound): mean, max (negative: tighter) |", "|---|---|---|---|---|---|"]  # fmt: skip
        for tn, to in zip(new["timing"], old["timing"]):
            for m in TIMED_METHODS:
                a, b = to[m], tn[m]
                old_l, old_u = (torch.tensor(a[k], dtype=torch.float64) for k in ("lower", "upper"))
                new_l, new_u = (torch.tensor(b[k], dtype=torch.float64) for k in ("lower", "upper"))
                added = torch.cat([(old_l - new_l) / old_l.abs().clamp(min=1e-12),
                                   (new_u - old_u) / old_u.abs().clamp(min=1e-12)])  # fmt: skip
                lines.append(f"| {tn['net']} | {m} | {a['seconds']:.4f} | {b['seconds']:.4f} | "
                             f"{b['seconds'] / a['seconds']:.2f} | {float(added.mean()):.2e}, "
                             f"{float(added.max()):.2e} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="revision to compare (default: before)")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--only", default="", help="comma-separated substrings of network paths")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--net", default="", help=argparse.SUPPRESS)
    parser.add_argument("--timing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="float_soundness")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rev = args.baseline or baseline_revision()
    out = ROOT / "benchmarks" / "results"
    old, new = run_both(base_tree(rev), args, out / f"{args.name}.json")
    text = f"# python -m benchmarks.float_soundness --samples {args.samples} (baseline {rev})\n\n"
    text += summary(new, old) + "\n"
    print(text)
    (out / f"{args.name}.md").write_text(text)
    (out / f"{args.name}.json").write_text(json.dumps({"baseline": rev, "new": new, "old": old}))


if __name__ == "__main__":
    main()
