"""BaBSR / FSB scores from each activation's own slopes (`verify.bab.relu.branching.side_slopes`) vs
ReLU's slopes (0 below, 1 above: the scores before they read the activation), side by side on
the same LeakyReLU nets and properties: ReLU splitting's answer, domains and seconds.

Nets: 5-32-32-2 MLPs (seeded) with LeakyReLU slopes per layer (convex < 1, concave > 1); the
property `y_0 - y_1 <= b` on [-1, 1]^5 with `b` 10% under the least of 50,000 samples (unsat
when proven). For one slope in every layer below 1, both scores rank the neurons alike (every
term scales by `1 - a`); they differ on concave activations (the chord is the lower line) and
on layers of different slopes.

    python benchmarks/branching_slopes.py [--timeout 20] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

import verify
import verify.bab.relu.brancher as relu_bab
from verify.bab import BabConfig
from verify.property import Polytope, Region, VnnlibProperty

SLOPES = [(0.1, 0.1), (2.0, 2.0), (0.1, 2.0), (0.5, 0.05)]
RESULTS = Path(__file__).parent / "results"


def instance(slopes: tuple[float, float], seed: int) -> tuple[nn.Module, VnnlibProperty]:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(5, 32), nn.LeakyReLU(slopes[0]), nn.Linear(32, 32), nn.LeakyReLU(slopes[1]),
        nn.Linear(32, 2),
    ).eval()  # fmt: skip
    x = torch.rand(50_000, 5, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    with torch.no_grad():
        y = net(x)
    least = float((y[:, 0] - y[:, 1]).min())
    b = least - 0.1 * (1 + abs(least))
    poly = Polytope(np.array([[1.0, -1.0]]), np.array([b]))
    return net, VnnlibProperty("<leaky>", 5, 2, (Region(-np.ones(5), np.ones(5), (poly,)),))


def relu_slopes(graph, layout, like):
    return like.new_zeros(layout.total), like.new_ones(layout.total)


def run(net, prop, branching: str, timeout: float, scores: str) -> dict:
    own = relu_bab.side_slopes
    if scores == "relu":
        relu_bab.side_slopes = relu_slopes
    try:
        config = BabConfig(splitting="relu")
        config = replace(config, relu=replace(config.relu, branching=branching))
        start = time.monotonic()
        result = verify.verify(net, prop, timeout=timeout, config=config)
        seconds = time.monotonic() - start
    finally:
        relu_bab.side_slopes = own
    regions = result.stats["regions"]
    domains = regions[0]["domains"] if regions else 0
    return {"status": result.status, "domains": domains, "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{'slopes':<12} {'seed':>4} {'branching':<9} {'own slopes':>28} {'ReLU slopes':>28}")
    for slopes in SLOPES:
        for seed in range(args.seeds):
            net, prop = instance(slopes, seed)
            for branching in ("babsr", "fsb"):
                row = {"slopes": slopes, "seed": seed, "branching": branching}
                for scores in ("own", "relu"):
                    row[scores] = run(net, prop, branching, args.timeout, scores)
                rows.append(row)
                cells = [f"{r['status']:>7} {r['domains']:>9} {r['seconds']:>6.1f}s"
                         for r in (row["own"], row["relu"])]  # fmt: skip
                print(f"{slopes!s:<12} {seed:>4} {branching:<9} {cells[0]:>28} {cells[1]:>28}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "branching_slopes.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {RESULTS / 'branching_slopes.json'}")


if __name__ == "__main__":
    main()
