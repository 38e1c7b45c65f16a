"""Warm starts of the active-set hard bounder, on a fixed set of children: the same domains
bounded cold (from their slopes) and from their parent's duals and cuts, with several numbers
of new cut rounds (`verify.bab.relu.hard_bounder.WARM_ROUNDS`).

    python benchmarks/warm_children.py onnx/mnist-net_256x6.onnx vnnlib/prop_1_0.03.vnnlib 24

The ReLU-splitting search's root (first region), then alpha-beta-CROWN branching until `n`
domains are open; those `n` parents are bounded by the hard bounder (their duals stored), split
on the brancher's choice and bounded by alpha-beta-CROWN; the open children are then bounded by
the active set (`--iterations`) each way. Prints seconds, the mean bound of the first row, the
domains closed and the cuts per domain kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify.bab.relu.hard_bounder as split_domains
from benchmarks.common import DATA, resolve
from bounds.types import Interval
from verify.bab import BabConfig, ReluBab, ReluDomains, ReluSplitConfig
from verify.cli.options import load_network
from verify.io.vnnlib_load import load_vnnlib


def grow(runner: ReluBab, n: int) -> ReluDomains:
    """The `n` open domains of smallest margin after alpha-beta-CROWN branching from the root."""
    open_, found = runner.begin()
    if found is not None:
        sys.exit("the root found a counterexample")
    easy, brancher = runner.bounder.easy, runner.brancher
    while 0 < len(open_) < n:
        parents, rest = open_.pop(n)
        choice, lam = brancher.choose(parents, easy)
        children, _ = easy.bound(brancher.split(parents, choice, lam))
        open_ = type(open_).cat([rest, children.open()])
    return open_.pop(n)[0]


def children_of(runner: ReluBab, parents: ReluDomains) -> ReluDomains:
    """`parents` hard-bounded (duals stored), split and bounded by alpha-beta-CROWN: the open."""
    easy, hard = runner.bounder.easy, runner.bounder.hard
    parents = hard.bound(parents).open()
    choice, lam = runner.brancher.choose(parents, easy)
    children, _ = easy.bound(runner.brancher.split(parents, choice, lam))
    return children.open()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("network")
    parser.add_argument("property")
    parser.add_argument("n", type=int, help="parents")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--rounds", type=int, nargs="+", default=[4, 2, 1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = DATA / "vnncomp2022" / "mnist_fc"
    net = load_network(resolve(root, args.network), "cpu")
    prop = load_vnnlib(resolve(root, args.property))
    relu = ReluSplitConfig(prox_iterations=args.iterations, hard_bounder="active-set")
    runner = ReluBab(net, prop.regions[0], BabConfig(splitting="relu", relu=relu))
    runner.deadline = float("inf")
    children = children_of(runner, grow(runner, args.n))
    t, hard, easy = runner.target, runner.bounder.hard, runner.bounder.easy
    N = len(children)
    rows = t.rows_of[children.poly]
    box = Interval(*(x.expand(N, *x.shape[1:]) for x in (t.box.lower, t.box.upper)))
    c = t.spec.C[rows].reshape(N, rows.shape[1], *t.graph.output.shape)
    views = t.layout.views(children.alpha, t.layout.acts)
    slopes = tuple(views[a] for a in t.layout.acts)
    inputs = (hard.layers, box, easy.intervals(children.splits), c, slopes, args.iterations)
    start = hard.starts.get(children.warm)
    print(f"{args.network} {args.property}: {N} open children, {args.iterations} iterations")
    print("| start | seconds | mean bound | closed | cuts per domain |\n|---|---|---|---|---|")
    cold = None
    for name, warm, rounds in [("cold", None, None)] + [
        (f"warm, {r} new rounds", start, r) for r in args.rounds
    ]:  # fmt: skip
        if rounds is not None:
            split_domains.WARM_ROUNDS = rounds
        tick = time.perf_counter()
        result = split_domains.anderson_split_bounds(*inputs, warm=warm)
        seconds = time.perf_counter() - tick
        lower = result.lower[:, 0] - t.spec.b[rows[:, 0]]
        cold = lower if cold is None else cold
        cuts = sum(int(k.active.sum()) for k in result.start.cuts) / N
        above = int((lower >= cold - 1e-6).sum())
        print(
            f"| {name} | {seconds:.2f} | {float(lower.mean()):+.4f} | {int((lower > 0).sum())}"
            f" | {cuts:.0f} |" + ("" if warm is None else f" (>= cold on {above}/{N})")
        )


if __name__ == "__main__":
    main()
