"""CROWN's root intervals on TinyYOLO (VNN-COMP 2023 `yolo`): per pre-activation layer, the
neurons bounded and the seconds, with the windows (patches) of each neuron's functional

- `chain`: kept along a single path only, dense from the first residual sum or where the
  windows fill their node (the code before, `WINDOW_SHARE` 1);
- `dag`: carried through residual sums, each node's windows the union of its consumers'
  (`bounds.methods.windows.window_walk`);
- `dag+cone`: and only the neurons the property's rows depend on (`bounds.graph.cone`).

Float64 with the rounding tracked (sound: what the ReLU search's root computes), 1 torch
thread, the property's rows bounded at the end (> -1 on one row: unsat). `chain` takes
minutes per layer, so each configuration times at most `--sample` neurons per layer (the first
of the layer's targets) and scales to the layer's count ("s est."); `--sample 0` times every
neuron (the bounds then come from the configuration's own intervals).

    python -m benchmarks.yolo_crown [--prop 000411] [--sample 512] [--configs chain,dag,dag+cone]
        [--window-share 0.25]

`--window-share` sets `bounds.methods.windows.WINDOW_SHARE` for `dag` and `dag+cone` (the
share of a node's area past which the windows go dense).

Writes benchmarks/results/yolo_crown_CONFIGS_shareS[_full].{json,md}. A sampled run scales each
layer's sample, and the neurons left out keep IBP intervals, so the later layers' counts are
those of a looser run than the real one: compare configurations within one sampled run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bounds.methods.crown as crown
import bounds.methods.windows as windows
import verify
from benchmarks.common import DATA, RESULTS, write_json
from bounds.graph.cone import spec_cone
from bounds.types import Interval
from verify.specs import region_spec

YOLO = DATA / "vnncomp2023" / "yolo"


def problem(prop: str):
    net = verify.load_onnx(YOLO / "onnx" / "TinyYOLO.onnx.gz")
    spec = verify.load_vnnlib(YOLO / "vnnlib" / f"TinyYOLO_prop_{prop}_eps_1_255.vnnlib.gz")
    region = spec.regions[0]
    C, b, _ = region_spec(region, torch.float64)
    shape = tuple(net.input_shape)
    box = Interval(*(torch.tensor(np.asarray(t), dtype=torch.float64).reshape(1, *shape)
                     for t in (region.lower, region.upper)))  # fmt: skip
    return verify.network_graph(net, shape).float64, box, C, b


def run(config: str, graph, box, C, sample: int, share: float) -> dict:
    """Per layer: neurons, neurons timed, seconds, seconds scaled to all; and the rows' bounds."""
    layers: dict[str, dict] = {}
    original = crown._crown_neurons, windows._sum_step, windows.WINDOW_SHARE

    def timed(*args):
        name, index = args[-2], args[-1]
        part = index if sample <= 0 else index[:sample]
        tick = time.perf_counter()
        low, up = original[0](*args[:-1], part)
        seconds = time.perf_counter() - tick
        layers[name] = {"neurons": index.numel(), "timed": part.numel(), "seconds": seconds,
                        "estimated": seconds * index.numel() / max(1, part.numel())}  # fmt: skip
        if part.numel() < index.numel():  # the others keep their IBP intervals
            inf = torch.full(
                (low.shape[0], index.numel() - part.numel()), torch.inf, dtype=low.dtype
            )
            low, up = torch.cat([low, -inf], 1), torch.cat([up, inf], 1)
        return low, up

    crown._crown_neurons, windows.WINDOW_SHARE = timed, share
    if config == "chain":
        windows._sum_step, windows.WINDOW_SHARE = (lambda node, w: False), 1.0
    try:
        cone = spec_cone(graph, C) if config == "dag+cone" else None
        tick = time.perf_counter()
        intervals = crown.crown_intervals(graph, box, cone=cone)
        seconds = time.perf_counter() - tick
        low, _ = crown.output_bounds(graph, box, C, intervals, True)
    finally:
        crown._crown_neurons, windows._sum_step, windows.WINDOW_SHARE = original
    return {"layers": layers, "seconds": seconds, "rows_lower": low[0].tolist()}


def table(results: dict, prop: str, sample: int, share: float, b: list[float]) -> str:
    configs = list(results)
    names = list(next(iter(results.values()))["layers"])
    lines = [f"# TinyYOLO root CROWN intervals, prop {prop}, float64 sound, 1 thread",
             f"(`python -m benchmarks.yolo_crown --prop {prop} --sample {sample} "
             f"--configs {','.join(results)} --window-share {share:g}`)", "",
             "| layer | " + " | ".join(f"{c} neurons | {c} s est." for c in configs) + " |",
             "|---" * (1 + 2 * len(configs)) + "|"]  # fmt: skip
    for name in names:
        cells = []
        for c in configs:
            layer = results[c]["layers"].get(name, {"neurons": 0, "estimated": 0.0})
            cells += [str(layer["neurons"]), f"{layer['estimated']:.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = [f"{sum(v['estimated'] for v in results[c]['layers'].values()):.1f}" for c in configs]
    lines.append("| total | " + " | ".join(f" | {t}" for t in totals) + " |")
    lines.append("")
    for c in configs:
        if sample <= 0:
            best = max(lo - bb for lo, bb in zip(results[c]["rows_lower"], b))
            lines.append(f"- {c}: {results[c]['seconds']:.1f} s, best row lower - b = {best:.3f}"
                         f" ({'unsat' if best > 0 else 'not proven'})")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prop", default="000411")
    parser.add_argument("--sample", type=int, default=512, help="neurons timed per layer (0: all)")
    parser.add_argument("--configs", default="chain,dag,dag+cone")
    parser.add_argument("--window-share", type=float, default=windows.WINDOW_SHARE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    graph, box, C, b = problem(args.prop)
    results = {}
    for config in args.configs.split(","):
        results[config] = run(config, graph, box, C, args.sample, args.window_share)
        print(config, f"{results[config]['seconds']:.1f} s", flush=True)
    text = table(results, args.prop, args.sample, args.window_share, b.tolist())
    print(text)
    tag = f"_{args.configs.replace(',', '_').replace('+', '_')}_share{args.window_share:g}"
    tag += "" if args.sample > 0 else "_full"
    write_json(f"yolo_crown{tag}.json", {"prop": args.prop, "sample": args.sample, **results})
    (RESULTS / f"yolo_crown{tag}.md").write_text(text)


if __name__ == "__main__":
    main()
