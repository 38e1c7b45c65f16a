"""Bounds table: for ACAS Xu, mnist_fc and the OVAL CIFAR nets, the mean bound margin, the
number of instances proven by bounds alone, and seconds per instance, per method (1 torch thread).

Margin of an instance: min over unsafe polytopes of max over their rows of (lower bound - rhs);
positive means the property is proven. For OVAL: an eps = 2/255 L-inf ball around the first
images of CIFAR-10 (margins of the true label against the others; a misclassified image has a
negative margin by construction).

Usage: python benchmarks/bounds_table.py [--quick] [--methods ibp,crown,alpha-crown,lp]
Writes benchmarks/results/bounds_table.json and .txt.
"""

from __future__ import annotations

import argparse
import sys
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


def suites(quick: bool):
    """(suite name, list of (instance id, net, problems))."""
    acas = vnncomp_instances("acasxu")
    mnist = vnncomp_instances("mnist_fc")
    if quick:
        acas, mnist = acas[::15], mnist[::10]
    nets: dict[Path, torch.nn.Module] = {}

    def load(path):
        if path not in nets:
            nets[path] = verify.load_onnx(path)
        return nets[path]

    yield "acasxu", [(f"{n.name}:{p.name}", load(n), vnnlib_problems(load(n), p)) for n, p in acas]
    for size in ("256x2", "256x4", "256x6"):
        chosen = [(n, p) for n, p in mnist if size in n.name]
        rows = [(f"{n.name}:{p.name}", load(n), vnnlib_problems(load(n), p)) for n, p in chosen]
        yield f"mnist_fc_{size}", rows
    images, labels = cifar_images(2 if quick else 5)
    for name in ("cifar_base_kw", "cifar_wide_kw", "cifar_deep_kw"):
        net = load(DATA / "vnncomp2022/oval21/onnx" / f"{name}.onnx.gz")
        rows = [(f"{name}:img{i}", net, [cifar_problem(images[i], int(labels[i]), 2 / 255)])
                for i in range(len(labels))]  # fmt: skip
        yield f"oval_{name}", rows


def run_instance(net, problems, method: str) -> tuple[float, float]:
    """(margin, seconds) of one instance: all its regions must be proven."""
    margins, seconds = [], 0.0
    for lower, upper, C, b, owner, n_poly in problems:
        start = time.perf_counter()
        result = verify.bounds(net, lower=lower, upper=upper, C=C, method=method)
        seconds += time.perf_counter() - start
        margins.append(region_margin(result.lower, b, owner, n_poly))
    return min(margins), seconds


LP_LIMIT = {"acasxu": 20, "mnist_fc_256x2": 2}  # the LP runs on the smaller nets only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a subset of the instances")
    parser.add_argument("--methods", default="ibp,crown,alpha-crown,lp")
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = args.methods.split(",")
    table, rows_out = [], []
    header = (
        f"{'suite':<22}{'method':<13}{'n':>5}{'proven':>8}{'mean margin':>14}{'s/instance':>12}"
    )
    print(header)
    for suite, instances in suites(args.quick):
        for method in methods:
            subset = instances
            if method == "lp":
                if suite not in LP_LIMIT:
                    continue
                subset = instances[: LP_LIMIT[suite]]
            results = [run_instance(net, probs, method) for _, net, probs in subset]
            margins = [m for m, _ in results]
            seconds = [s for _, s in results]
            row = {
                "suite": suite,
                "method": method,
                "n": len(subset),
                "proven": sum(m > 0 for m in margins),
                "mean_margin": sum(margins) / len(margins),
                "seconds_per_instance": sum(seconds) / len(seconds),
                "per_instance": [
                    {"id": i, "margin": m, "seconds": s}
                    for (i, _, _), (m, s) in zip(subset, results)
                ],
            }
            rows_out.append(row)
            line = (f"{suite:<22}{method:<13}{row['n']:>5}{row['proven']:>8}"
                    f"{row['mean_margin']:>14.4f}{row['seconds_per_instance']:>12.4f}")  # fmt: skip
            print(line, flush=True)
            table.append(line)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    meta = {"date": stamp, "torch": torch.__version__, "threads": 1, "quick": args.quick}
    write_json("bounds_table.json", {"meta": meta, "rows": rows_out})
    text = f"# python benchmarks/bounds_table.py{' --quick' if args.quick else ''}  ({stamp}, 1 thread)\n"
    (RESULTS / "bounds_table.txt").write_text(text + header + "\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
