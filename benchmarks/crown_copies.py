"""CROWN's intervals with copied pre-activations bounded through their source
(`bounds/methods/copies.py`) against bounding every copy, on the VNN-COMP 2023 ViT nets' root
boxes; and the first-call cost of `torch.broadcast_shapes` in a fresh interpreter (what
`relaxations.base.broadcast_shape` avoids).

    python -m benchmarks.crown_copies [--nets pgd_2_3_16 ibp_3_3_8] [--dtype float32]

Per net: the first instance the 2023 winner proved, the whole root box, CROWN bounds on the
property's rows (float32 without the rounding terms, as the search's bounds; `--dtype float64`:
sound), seconds and backward-pass neurons both ways, and the worst margin (> 0: proved). 1 torch
thread. Writes benchmarks/results/crown_copies.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bounds.methods.crown as crown_module
import verify
from benchmarks.common import DATA, RESULTS, write_json
from verify.attack import UnsafeSpec, min_max

VIT = DATA / "vnncomp2023" / "vit"
TRUTH = DATA / "vnncomp2023" / "truth" / "vit.csv"


def first_proved(net: str) -> str:
    """The first property of `net` in the benchmark's instances.csv that the 2023 winner
    answered unsat."""
    unsat = {row[2].split("/")[-1] for row in csv.reader(TRUTH.open())
             if len(row) > 4 and row[1].endswith(f"{net}.onnx") and row[4] == "unsat"}  # fmt: skip
    for row in csv.reader((VIT / "instances.csv").open()):
        if row and row[0].endswith(f"{net}.onnx") and row[1].split("/")[-1] in unsat:
            return row[1].split("/")[-1]
    raise LookupError(f"no unsat instance of {net} in {TRUTH}")


def root_bound(net: str, prop: str, dtype: torch.dtype, copies: bool) -> dict:
    """CROWN on the root box of `prop`, copies through their source or not."""
    model = verify.load_onnx(VIT / "onnx" / f"{net}.onnx.gz")
    spec = verify.load_vnnlib(VIT / "vnnlib" / f"{prop}.gz")
    region = spec.regions[0]
    unsafe = UnsafeSpec.of(region, torch.float64)
    graph = verify.network_graph(model, model.input_shape).to(dtype)
    box = [torch.tensor(np.asarray(b), dtype=dtype).reshape(1, *model.input_shape)
           for b in (region.lower, region.upper)]  # fmt: skip
    neurons: list[int] = []
    original_bound, original_chain = crown_module.bound_neurons, crown_module.copy_chain

    def counting(graph_, name, index, *args, **kwargs):
        neurons.append(index.numel())
        return original_bound(graph_, name, index, *args, **kwargs)

    crown_module.bound_neurons = counting
    if not copies:
        crown_module.copy_chain = lambda graph_, name: None
    try:
        start = time.perf_counter()
        found = verify.bounds(graph, lower=box[0], upper=box[1], C=unsafe.C.to(dtype),
                              method="crown", exact=dtype == torch.float64)  # fmt: skip
        seconds = time.perf_counter() - start
    finally:
        crown_module.bound_neurons, crown_module.copy_chain = original_bound, original_chain
    rows = found.lower.double() - unsafe.b
    margin = float(min_max(rows, unsafe.owner, unsafe.n_polytopes))
    return {"seconds": seconds, "neurons": sum(neurons), "margin": margin}


def first_broadcast_seconds(code: str) -> float:
    """Seconds of `code`'s first broadcast in a fresh interpreter (imports done before)."""
    script = (
        "import time, numpy, torch\nfrom relaxations.base import broadcast_shape\n"
        f"t = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=root, check=True)  # fmt: skip
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", nargs="+", default=["pgd_2_3_16"])
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    rows = []
    for net in args.nets:
        prop = first_proved(net)
        for copies in (True, False):
            found = root_bound(net, prop, dtype, copies)
            rows.append({"net": net, "property": prop, "copies": copies, **found})
            print(rows[-1], flush=True)
    startup = {
        "torch.broadcast_shapes": first_broadcast_seconds("torch.broadcast_shapes((2, 1), (1, 3))"),
        "broadcast_shape": first_broadcast_seconds("broadcast_shape((2, 1), (1, 3))"),
    }
    print(startup)
    lines = [f"# python -m benchmarks.crown_copies --nets {' '.join(args.nets)} --dtype "
             f"{args.dtype} ({time.strftime('%Y-%m-%d %H:%M')}, 1 thread)", "",
             "CROWN on the root box of the first instance the 2023 winner proved per net.", "",
             "| net | property | copies through their source | seconds | backward-pass neurons "
             "| worst margin |", "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['net']} | {r['property']} | {r['copies']} | {r['seconds']:.1f} | "
              f"{r['neurons']} | {r['margin']:.4g} |" for r in rows]  # fmt: skip
    lines += ["", "First broadcast in a fresh interpreter (torch and numpy imported): "
              + ", ".join(f"`{k}` {v:.3f} s" for k, v in startup.items())]  # fmt: skip
    (RESULTS / "crown_copies.md").write_text("\n".join(lines) + "\n")
    write_json("crown_copies.json", {"rows": rows, "startup": startup,
                                               "dtype": args.dtype})  # fmt: skip


if __name__ == "__main__":
    main()
