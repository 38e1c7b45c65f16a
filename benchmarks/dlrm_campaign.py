"""DLRM fault campaign: certified clipping (`verify.monitor`) against fixed clipping at +-6
and +-100, on the DLRM of `examples/dlrm_monitor.py` (synthetic click-through task, 8 tables
of 1,000 x 16, pairwise dot-product interaction) under the random-value and exponent-only
error models of Ma et al. 2023, in the weights (tables included) and in one activation element
of every input.

Per cell (error model / target) and protection: mean AUC over the trials, the share of AUC
loss recovered on the harmful faults (unprotected AUC loss > 0.005), the share of those
brought back within 0.005 of the clean AUC; per protection the false-clip rate on the clean
held-out set (certified: 0 by proof).

Run: python benchmarks/dlrm_campaign.py [--trials 200] [--seed 0] [--name dlrm_campaign]
(1 thread; writes benchmarks/results/NAME.{json,md}).
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, write_json

EXAMPLE = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "dlrm_monitor.py"),
                         run_name="dlrm_example")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="dlrm_campaign")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    net, _, x, y = EXAMPLE["trained_model"](seed=args.seed)
    trained = time.perf_counter() - start
    start = time.perf_counter()
    mon = EXAMPLE["monitor"](net, EXAMPLE["domain"]())
    built = time.perf_counter() - start
    fp = EXAMPLE["false_clip_rates"](net, mon, x)
    start = time.perf_counter()
    result = EXAMPLE["run_campaign"](net, mon, x, y, args.trials, seed=args.seed)
    ran = time.perf_counter() - start
    ranges = {n: [float(mon.ranges[n][0].min()), float(mon.ranges[n][1].max())] for n in mon.nodes}
    payload = {"campaign": result, "false_clips": fp, "ranges": ranges, "seed": args.seed,
               "seconds": {"train": trained, "monitor": built, "campaign": ran},
               "test_points": len(x)}  # fmt: skip
    write_json(f"{args.name}.json", payload)
    text = (f"# DLRM fault campaign (seed {args.seed})\n\n`python benchmarks/dlrm_campaign.py "
            f"--trials {args.trials} --seed {args.seed}`; {len(x)} held-out inputs; monitor "
            f"built in {built:.1f} s, campaign {ran:.0f} s.\n\n"
            + EXAMPLE["table"](result, fp) + "\n")  # fmt: skip
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
