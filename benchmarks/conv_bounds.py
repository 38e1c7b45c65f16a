"""Seconds per CROWN and per alpha-CROWN call on the OVAL21 conv nets: this checkout, another
checkout of ours (`--before`, e.g. the main branch), and auto_LiRPA, side by side in one run.

Design: the driver (this checkout) builds the instances (eps = 2/255 around the first CIFAR-10
test images, as benchmarks/peer_bounds.py) and writes them to one `torch.save` job. Each side
runs it in its own process: ours with `PYTHONPATH=<checkout>` (this script in `--worker` mode,
importing only `verify` from that path), auto_LiRPA with the peer's venv python
(benchmarks/peer_worker.py, `"kind": "timing"`; install it as ../shared/peers/README.md
says). One torch thread each; each process warms up on every instance before timing it;
`--rounds` rounds alternate the sides (before, after, peer) so that load from other processes
hits all of them, and every figure is the minimum over repeats and rounds.

Times: ours is `verify.bounds(graph, method=...)` on the `Graph` built once, as auto_LiRPA's
`BoundedModule` is ("crown(net)": `verify.bounds(net)`, which builds the graph per call),
both sides (`C` and `-C`) in one call; auto_LiRPA's `compute_bounds` lower side alone and both
sides (its alpha-CROWN optimises each side separately); ratios are ours / theirs (both sides:
like for like). Bounds: max |difference| of
the lower bounds of `C y` against the other checkout and against auto_LiRPA.

Usage: python benchmarks/conv_bounds.py [--before ../main] [--images 2] [--rounds 3] [--tag T]
Writes benchmarks/results/conv_bounds[_T].json and .txt.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
NETS = ("cifar_base_kw", "cifar_wide_kw", "cifar_deep_kw")
METHODS = {"crown": "CROWN", "alpha-crown": "CROWN-Optimized"}  # ours -> auto_LiRPA's name


def ours_worker(job_path: str, result_path: str) -> None:
    """Time `verify.bounds` (from whatever `verify` the PYTHONPATH gives) on every instance:
    on the network's `Graph`, built once as auto_LiRPA's `BoundedModule` is, and for CROWN also
    on the module (`crown_module_s`: a graph build per call, as `verify.bounds(net)` does)."""
    import verify
    from verify.api import network_graph

    job = torch.load(job_path)
    torch.set_num_threads(job["threads"])
    options = {"alpha-crown": {"lr": job["lr"], "lr_decay": job["decay"]}, "crown": {}}
    nets, results = {}, []
    for inst in job["instances"]:
        net = nets.setdefault(inst["net"], verify.load_onnx(inst["net"]))
        lower, upper, C = inst["problem"]
        graph = network_graph(net, tuple(lower.shape[1:]))
        out = {}
        for method, target in [*((m, graph) for m in METHODS), ("crown_module", net)]:
            name = method.removesuffix("_module")

            def run(name=name, target=target, lower=lower, upper=upper, C=C):
                opts = options[name]
                return verify.bounds(target, lower=lower, upper=upper, C=C, method=name, **opts)

            run()  # warm-up
            seconds = []
            for _ in range(job["repeats"][name]):
                start = time.perf_counter()
                r = run()
                seconds.append(time.perf_counter() - start)
            out[method] = {"lower": r.lower.reshape(-1), "s": min(seconds)}
        results.append(out)
    torch.save(results, result_path)


def _run(cmd: list[str], env: dict | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:2]} failed:\n{proc.stderr[-3000:]}")


def run_side(side: str, checkout: Path | None, job: dict, peer_python: str) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        job_path, result_path = Path(tmp) / "job.pt", Path(tmp) / "result.pt"
        torch.save(job, job_path)
        if side == "peer":
            _run(
                [peer_python, str(HERE.parent / "peer_worker.py"), str(job_path), str(result_path)]
            )
        else:
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            cmd = [sys.executable, str(HERE), "--worker", str(job_path), str(result_path)]
            _run(cmd, env)
        return torch.load(result_path)


def instances(images: int) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import DATA, cifar_images, cifar_problem

    pictures, labels = cifar_images(images)
    out = []
    for name in NETS:
        path = DATA / "vnncomp2022/oval21/onnx" / f"{name}.onnx.gz"
        for i in range(images):
            lower, upper, C, *_ = cifar_problem(pictures[i], int(labels[i]), 2 / 255)
            out.append({"id": f"{name}:img{i}", "name": name, "net": str(path),
                        "problem": (lower, upper, C)})  # fmt: skip
    return out


def _best(rounds: list[list], key) -> list:
    """Per instance, the round with the smallest `key(entry)` (entries: one per instance)."""
    return [min(entries, key=key) for entries in zip(*rounds)]


def summarise(insts, sides: dict[str, list[list]]) -> list[dict]:
    rows = []
    for name in NETS:
        picks = [i for i, inst in enumerate(insts) if inst["name"] == name]
        row = {"net": name, "images": len(picks)}
        for side in ("after", "before"):
            if side in sides:
                best = _best(sides[side], lambda e: e["crown_module"]["s"])
                row[f"{side}_crown_module_s"] = sum(
                    best[i]["crown_module"]["s"] for i in picks
                ) / len(picks)
        for method, peer_name in METHODS.items():
            for side in ("after", "before"):
                if side not in sides:
                    continue
                best = _best(sides[side], lambda e, m=method: e[m]["s"])
                row[f"{side}_{method}_s"] = sum(best[i][method]["s"] for i in picks) / len(picks)
            if "peer" in sides:
                for part in ("lower_s", "both_s"):
                    best = _best(sides["peer"], lambda e, p=peer_name, q=part: e[p][q])
                    value = sum(best[i][peer_name][part] for i in picks) / len(picks)
                    row[f"peer_{method}_{part}"] = value
                after = sides["after"][0]
                peer = sides["peer"][0]
                row[f"{method}_diff_peer"] = max(
                    float((after[i][method]["lower"] - peer[i][peer_name]["lower"]).abs().max())
                    for i in picks
                )
            if "before" in sides:
                after, before = sides["after"][0], sides["before"][0]
                row[f"{method}_diff_before"] = max(
                    float((after[i][method]["lower"] - before[i][method]["lower"]).abs().max())
                    for i in picks
                )
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = []
    for method in METHODS:
        lines.append(
            f"{method:<13}{'net':<15}{'ours s':>9}{'before s':>10}{'peer lo s':>11}"
            f"{'peer both s':>12}{'us/peer both':>13}{'us/peer lo':>11}{'us/before':>10}"
            f"{'|dlb| before':>13}{'|dlb| peer':>11}"
        )
        for r in rows:
            ours = r[f"after_{method}_s"]
            before = r.get(f"before_{method}_s", float("nan"))
            lo = r.get(f"peer_{method}_lower_s", float("nan"))
            both = r.get(f"peer_{method}_both_s", float("nan"))
            lines.append(
                f"{'':<13}{r['net']:<15}{ours:>9.4f}{before:>10.4f}{lo:>11.4f}{both:>12.4f}"
                f"{ours / both:>13.2f}{ours / lo:>11.2f}{ours / before:>10.2f}"
                f"{r.get(f'{method}_diff_before', float('nan')):>13.1e}"
                f"{r.get(f'{method}_diff_peer', float('nan')):>11.1e}"
            )
    lines.append(f"{'crown(net)':<13}{'net':<15}{'ours s':>9}{'before s':>10}")
    for r in rows:
        before = r.get("before_crown_module_s", float("nan"))
        lines.append(f"{'':<13}{r['net']:<15}{r['after_crown_module_s']:>9.4f}{before:>10.4f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, default=None, help="another checkout of ours")
    parser.add_argument("--images", type=int, default=2, help="CIFAR-10 test images per net")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--crown-repeats", type=int, default=10)
    parser.add_argument("--alpha-repeats", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1, help="both tools' alpha learning rate")
    parser.add_argument("--decay", type=float, default=0.98, help="both tools' lr decay")
    parser.add_argument("--iterations", type=int, default=20, help="auto_LiRPA's (ours: default)")
    parser.add_argument("--peer-python", default="/tmp/peer/venv/bin/python")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if args.worker:
        ours_worker(*args.worker)
        return
    torch.set_num_threads(1)
    insts = instances(args.images)
    repeats = {"crown": args.crown_repeats, "alpha-crown": args.alpha_repeats}
    job = {"threads": 1, "lr": args.lr, "decay": args.decay, "iterations": args.iterations,
           "repeats": {**repeats, **{METHODS[k]: v for k, v in repeats.items()}},
           "kind": "timing", "methods": list(METHODS.values()),
           "instances": [{"net": i["net"], "problem": i["problem"]} for i in insts]}  # fmt: skip
    order = ([("before", args.before)] if args.before else []) + [("after", ROOT)]
    if not args.no_peer:
        order.append(("peer", None))
    sides: dict[str, list[list]] = {}
    for r in range(args.rounds):
        for side, checkout in order:
            sides.setdefault(side, []).append(run_side(side, checkout, job, args.peer_python))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = summarise(insts, sides)
    lines = table(rows)
    print("\n".join(lines))
    stamp = time.strftime("%Y-%m-%d %H:%M")
    meta = {"date": stamp, "torch": torch.__version__, "threads": 1, "argv": sys.argv[1:],
            "before": str(args.before), "images": args.images, "rounds": args.rounds}  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import RESULTS, write_json

    name = "conv_bounds" + (f"_{args.tag}" if args.tag else "")
    write_json(f"{name}.json", {"meta": meta, "nets": rows})
    text = f"# python benchmarks/conv_bounds.py {' '.join(sys.argv[1:])}  ({stamp}, 1 thread)\n"
    (RESULTS / f"{name}.txt").write_text(text + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
