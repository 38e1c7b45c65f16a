"""Our alpha-CROWN side by side with auto_LiRPA's ("CROWN-Optimized"), same boxes and C matrices.

Design: this script (our python) reads every instance with our readers (`verify.load_onnx`,
`verify.load_vnnlib`, `benchmarks.common`), bounds it with `verify.bounds(method="alpha-crown")`,
and writes the very same `(lower, upper, C)` tensors of each suite to one `torch.save` file that
`benchmarks/peer_worker.py` reads in the peer's own venv (`--peer-python`, default
/tmp/peer/venv/bin/python; install it as ../shared/peers/README.md says). The worker converts the
ONNX net to `torch.nn` (checked against onnxruntime) and runs auto_LiRPA on those tensors.
Both run with 1 torch thread, each warmed up on the suite's first problem before timing.

Proven: every region of the instance has, for every unsafe polytope of the VNN-LIB property, a
row whose lower bound of `C y - b` is positive (`verify.specs.region_proven`); margin: min over
regions and polytopes of max over the rows of that lower bound (`benchmarks.common`). OVAL21 has
no official properties: an eps = 2/255 ball around the first CIFAR-10 test images, as in
benchmarks/bounds_table.py. Time: ours computes both sides (`C` and `-C`); auto_LiRPA optimises
each side separately, so it is timed for the lower side alone (what the margin needs) and for
both sides; ratios are ours / peer.

Usage: python benchmarks/peer_bounds.py [--suite acasxu,mnist_fc,oval21] [--limit N] [--lr 0.1]
       [--decay 0.98] [--tag NAME]
Writes benchmarks/results/peer_bounds[_TAG].json and .txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify
from benchmarks.common import (
    DATA,
    RESULTS,
    cifar_images,
    cifar_problem,
    region_margin,
    vnncomp_instances,
    vnnlib_problems,
    write_json,
)
from bounds.methods.alpha_crown import AlphaCrownConfig
from verify.specs import region_proven

WORKER = Path(__file__).resolve().parent / "peer_worker.py"
OVAL_NETS = ("cifar_base_kw", "cifar_wide_kw", "cifar_deep_kw")


def suite_instances(suite: str, limit: int | None):
    """[(instance id, net path, problems)] with problems as in `benchmarks.common`."""
    if suite in ("acasxu", "mnist_fc"):
        pairs = vnncomp_instances(suite)
        if limit:
            pairs = pairs[:: max(1, len(pairs) // limit)][:limit]
        out = []
        for net_path, prop in pairs:
            net = verify.load_onnx(net_path)
            out.append((f"{net_path.name}:{prop.name}", net_path, vnnlib_problems(net, prop)))
        return out
    if suite == "oval21":
        n = limit or 5
        per_net = max(1, -(-n // len(OVAL_NETS)))
        images, labels = cifar_images(per_net)
        out = []
        for name in OVAL_NETS:
            path = DATA / "vnncomp2022/oval21/onnx" / f"{name}.onnx.gz"
            for i in range(per_net):
                problem = cifar_problem(images[i], int(labels[i]), 2 / 255)
                out.append((f"{name}:img{i}", path, [problem]))
        return out[:n]
    raise SystemExit(f"unknown suite {suite!r}")


def our_options(lr: float, decay: float) -> dict:
    """alpha-CROWN options; the decay only where our config has it (older commits do not)."""
    known = {f.name for f in dataclasses.fields(AlphaCrownConfig)}
    options = {"lr": lr}
    if "lr_decay" in known:
        options["lr_decay"] = decay
    return options


def run_ours(instances, options: dict):
    nets = {}
    first = instances[0]
    lower, upper, C, *_ = first[2][0]
    net = nets.setdefault(first[1], verify.load_onnx(first[1]))
    verify.bounds(net, lower=lower, upper=upper, C=C, method="alpha-crown", **options)  # warm-up
    results = []
    for _, path, problems in instances:
        net = nets.setdefault(path, verify.load_onnx(path))
        out = []
        for lower, upper, C, *_ in problems:
            start = time.perf_counter()
            r = verify.bounds(net, lower=lower, upper=upper, C=C, method="alpha-crown", **options)
            out.append((r.lower.reshape(-1), time.perf_counter() - start))
        results.append(out)
    return results


def run_peer(instances, args) -> list:
    job = {
        "threads": 1, "lr": args.lr, "decay": args.decay, "iterations": args.iterations,
        "instances": [{"net": str(path), "problems": [(lo, up, C) for lo, up, C, *_ in probs]}
                      for _, path, probs in instances],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        job_path, result_path = Path(tmp) / "job.pt", Path(tmp) / "result.pt"
        torch.save(job, job_path)
        cmd = [args.peer_python, str(WORKER), str(job_path), str(result_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"peer worker failed:\n{proc.stderr[-3000:]}")
        return torch.load(result_path)


def verdict(lowers, problems) -> tuple[bool, float]:
    proven = all(
        region_proven(lo, b, owner, n) for lo, (_, _, _, b, owner, n) in zip(lowers, problems)
    )
    margin = min(
        region_margin(lo, b, owner, n) for lo, (_, _, _, b, owner, n) in zip(lowers, problems)
    )
    return proven, margin


def summarise(suite: str, instances, ours, peer) -> dict:
    rows = []
    for (name, _, problems), o, p in zip(instances, ours, peer):
        o_proven, o_margin = verdict([lo for lo, _ in o], problems)
        p_proven, p_margin = verdict([q["lower"] for q in p["problems"]], problems)
        o_rows = torch.cat([lo for lo, _ in o])
        p_rows = torch.cat([q["lower"] for q in p["problems"]])
        rows.append({
            "id": name, "ours_proven": o_proven, "peer_proven": p_proven,
            "ours_margin": o_margin, "peer_margin": p_margin,
            "ours_s": sum(s for _, s in o), "peer_lower_s": sum(q["lower_s"] for q in p["problems"]),
            "peer_both_s": sum(q["both_s"] for q in p["problems"]),
            "rows": int(o_rows.numel()), "rows_looser": int((o_rows < p_rows - 1e-5).sum()),
            "rows_tighter": int((o_rows > p_rows + 1e-5).sum()),
            "conversion_error": p["conversion_error"],
        })  # fmt: skip
    n = len(rows)
    total = {k: sum(r[k] for r in rows) for k in ("ours_s", "peer_lower_s", "peer_both_s")}
    return {
        "suite": suite, "n": n,
        "ours_proven": sum(r["ours_proven"] for r in rows),
        "peer_proven": sum(r["peer_proven"] for r in rows),
        "only_ours": sum(r["ours_proven"] and not r["peer_proven"] for r in rows),
        "only_peer": sum(r["peer_proven"] and not r["ours_proven"] for r in rows),
        "ours_mean_margin": sum(r["ours_margin"] for r in rows) / n,
        "peer_mean_margin": sum(r["peer_margin"] for r in rows) / n,
        "rows": sum(r["rows"] for r in rows),
        "rows_looser": sum(r["rows_looser"] for r in rows),
        "rows_tighter": sum(r["rows_tighter"] for r in rows),
        "ours_s": total["ours_s"], "peer_lower_s": total["peer_lower_s"],
        "peer_both_s": total["peer_both_s"],
        "ratio_vs_lower": total["ours_s"] / total["peer_lower_s"],
        "ratio_vs_both": total["ours_s"] / total["peer_both_s"],
        "max_conversion_error": max(r["conversion_error"] for r in rows),
        "per_instance": rows,
    }  # fmt: skip


HEADER = (
    f"{'suite':<10}{'lr':>5}{'n':>5}{'ours':>6}{'peer':>6}{'only us':>8}{'only peer':>10}"
    f"{'margin us':>12}{'margin peer':>13}{'rows looser':>13}{'t us/lower':>11}{'t us/both':>10}"
)


def line(s: dict, lr: float) -> str:
    looser = f"{s['rows_looser']}/{s['rows']}"
    return (f"{s['suite']:<10}{lr:>5}{s['n']:>5}{s['ours_proven']:>6}{s['peer_proven']:>6}"
            f"{s['only_ours']:>8}{s['only_peer']:>10}{s['ours_mean_margin']:>12.3f}"
            f"{s['peer_mean_margin']:>13.3f}{looser:>13}{s['ratio_vs_lower']:>11.2f}"
            f"{s['ratio_vs_both']:>10.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="acasxu,mnist_fc,oval21")
    parser.add_argument("--limit", type=int, default=None, help="instances per suite")
    parser.add_argument("--lr", type=float, default=0.1, help="both tools' learning rate")
    parser.add_argument(
        "--decay",
        type=float,
        default=0.98,
        help="auto_LiRPA's lr decay (ours too where it has one)",
    )
    parser.add_argument(
        "--iterations", type=int, default=20, help="auto_LiRPA's iterations (ours: its default)"
    )
    parser.add_argument("--peer-python", default="/tmp/peer/venv/bin/python")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = our_options(args.lr, args.decay)
    print(f"ours: alpha-crown {options}; peer: lr_alpha {args.lr}, lr_decay {args.decay}")
    print(HEADER, flush=True)
    summaries, lines = [], []
    for suite in args.suite.split(","):
        instances = suite_instances(suite, args.limit)
        ours = run_ours(instances, options)
        peer = run_peer(instances, args)
        summary = summarise(suite, instances, ours, peer)
        summaries.append(summary)
        lines.append(line(summary, args.lr))
        print(lines[-1], flush=True)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    meta = {"date": stamp, "torch": torch.__version__, "threads": 1, "argv": sys.argv[1:],
            "ours_options": options}  # fmt: skip
    name = "peer_bounds" + (f"_{args.tag}" if args.tag else "")
    write_json(f"{name}.json", {"meta": meta, "suites": summaries})
    text = f"# python benchmarks/peer_bounds.py {' '.join(sys.argv[1:])}  ({stamp}, 1 thread)\n"
    (RESULTS / f"{name}.txt").write_text(text + HEADER + "\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
