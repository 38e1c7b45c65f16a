"""How far bounds by the Anderson relaxation can go on instances they leave open (issue 13).

Per instance (ACAS Xu by default: the prop 3 / 4 ones that active-set with Anderson intermediate
bounds leaves open by less than 0.01), per region, three margins (> 0: proven):
- `active-set`: `verify.bounds(method="active-set", intermediate="active-set")` with the
  settings of `beyond_planet_proven_acas_i300.md` (300 iterations, 12 cut rounds, 200
  intermediate iterations a layer);
- `hull LP, same intervals`: the exact optimum of the Anderson relaxation for the last layer
  (`bounds.lp.anderson_lp.hull_lp`, cutting planes until no cut is violated) with the
  active-set's intermediate bounds: what any final-layer solver of this relaxation can reach;
- `hull LP, LP intervals`: the same after every ambiguous neuron's bounds are tightened layer
  by layer by the exact Anderson LP (its min and max over the relaxation of the layers before,
  intersected with the active set's): the single-neuron convex hull used exactly everywhere.
If the last margin is negative, no method that bounds the Anderson relaxation proves the
instance (a multi-neuron relaxation or branching is needed). Float64 LP values (HiGHS): an
analysis, not a proof.

Usage: python benchmarks/anderson_limit.py [--instances NET:PROP ...] [--tag T]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify
from benchmarks.common import DATA, RESULTS, region_margin, vnnlib_problems, write_json
from bounds.dual.anderson.problem import problem_from_graph
from bounds.lp.anderson_lp import hull_lp
from bounds.methods.crown import output_functional
from bounds.types import Interval

ACAS = DATA / "vnncomp2022" / "acasxu"
SETTINGS = {"iterations": 300, "max_cuts": 12, "intermediate": "active-set",
            "intermediate_iterations": 200}  # fmt: skip
DEFAULT = [
    "ACASXU_run2a_1_9_batch_2000.onnx.gz:prop_3.vnnlib.gz",
    "ACASXU_run2a_2_3_batch_2000.onnx.gz:prop_4.vnnlib.gz",
    "ACASXU_run2a_1_6_batch_2000.onnx.gz:prop_4.vnnlib.gz",
    "ACASXU_run2a_1_5_batch_2000.onnx.gz:prop_4.vnnlib.gz",
    "ACASXU_run2a_3_6_batch_2000.onnx.gz:prop_3.vnnlib.gz",
    "ACASXU_run2a_3_8_batch_2000.onnx.gz:prop_4.vnnlib.gz",
]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def tightened(W, b, lb, ub, lo, up) -> tuple[list, list, list, list, int]:
    """Every ambiguous neuron's pre-activation bounds by the exact Anderson LP over the layers
    before it, layer by layer (each layer's new bounds feed the next); returns the new
    `lb, ub, lo, up` and the number of LPs."""
    lb, ub, lo, up = list(lb), list(ub), [v.copy() for v in lo], [v.copy() for v in up]
    solved = 0
    for k in range(1, len(lo)):  # layer 0's bounds are exact already (affine in the input)
        neurons = np.flatnonzero((lo[k] < 0) & (up[k] > 0))
        if neurons.size == 0:
            continue
        eye = np.eye(W[k].shape[0])
        objectives = [eye[j] for j in neurons] + [-eye[j] for j in neurons]
        values, _, _ = hull_lp(W[: k + 1], b[: k + 1], lb[: k + 1], ub[: k + 1], lo[:k], up[:k],
                               objectives)  # fmt: skip
        solved += len(objectives)
        lo[k][neurons] = np.maximum(lo[k][neurons], values[: neurons.size])
        up[k][neurons] = np.minimum(up[k][neurons], -values[neurons.size :])
        lb[k + 1], ub[k + 1] = np.maximum(lo[k], 0), np.maximum(up[k], 0)
    return lb, ub, lo, up, solved


def analyse(ident: str) -> list[dict]:
    net_name, prop = ident.split(":")
    net = verify.load_onnx(ACAS / "onnx" / net_name)
    rows = []
    for region, (lower, upper, C, b, owner, n_poly) in enumerate(
        vnnlib_problems(net, ACAS / "vnnlib" / prop)
    ):
        start = time.perf_counter()
        result = verify.bounds(net, lower=lower, upper=upper, C=C, method="active-set", **SETTINGS)
        seconds = time.perf_counter() - start
        graph = verify.network_graph(net, tuple(lower.shape[1:])).to(torch.float64,
                                                                     torch.device("cpu"))
        box = Interval(lower.double(), upper.double())
        intervals = {k: Interval(v.lower.double(), v.upper.double())
                     for k, v in result.intermediate.items()}  # fmt: skip
        C64 = C.double() if C.dim() == 3 else C.double().unsqueeze(0)
        S = C64.shape[1]
        p = problem_from_graph(graph, box, intervals, output_functional(graph, C64))
        W = [_np(p.layers.dense(k)) for k in range(p.layers.hidden + 1)]
        bias = [_np(v) for v in p.layers.biases]
        lb, ub = [_np(t[0]) for t in p.x_lower], [_np(t[0]) for t in p.x_upper]
        lo, up = [_np(t[0]) for t in p.pre_lower], [_np(t[0]) for t in p.pre_upper]
        c = [_np(p.c[0, s]) for s in range(S)]
        start = time.perf_counter()
        same, _, _ = hull_lp(W, bias, lb, ub, lo, up, c)
        lb2, ub2, lo2, up2, solved = tightened(W, bias, lb, ub, lo, up)
        exact, _, _ = hull_lp(W, bias, lb2, ub2, lo2, up2, c)
        lp_seconds = time.perf_counter() - start
        ambiguous = (int(sum(((a < 0) & (z > 0)).sum() for a, z in zip(lo, up))),
                     int(sum(((a < 0) & (z > 0)).sum() for a, z in zip(lo2, up2))))  # fmt: skip

        def margin(values, b=b, owner=owner, n_poly=n_poly) -> float:
            return region_margin(torch.as_tensor(values, dtype=torch.float64), b.double(), owner,
                                 n_poly)  # fmt: skip

        row = {
            "id": ident, "region": region, "active_set": region_margin(result.lower, b, owner,
                                                                       n_poly),
            "hull_same": margin(same), "hull_lp_intervals": margin(exact),
            "active_set_seconds": seconds, "lp_seconds": lp_seconds, "lps": solved,
            "ambiguous": ambiguous,
        }  # fmt: skip
        print(f"{ident} r{region}: active-set {row['active_set']:.6f} ({seconds:.1f} s) | hull "
              f"LP same intervals {row['hull_same']:.6f} | hull LP, LP intervals "
              f"{row['hull_lp_intervals']:.6f} ({lp_seconds:.1f} s, {solved} LPs, ambiguous "
              f"{ambiguous[0]} -> {ambiguous[1]})", flush=True)  # fmt: skip
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", nargs="*", default=DEFAULT, help="ACAS Xu NET:PROP")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    command = "python benchmarks/anderson_limit.py " + " ".join(sys.argv[1:])
    rows: list[dict] = []
    for ident in args.instances:
        rows += analyse(ident)
        write_json(f"anderson_limit{args.tag}.json", {"command": command, "rows": rows})
    lines = [f"# Anderson relaxation: how far it goes\n\n`{command}` ({args.threads} thread)\n",
             "| instance | region | active-set margin | hull LP, same intervals | hull LP, LP "
             "intervals | ambiguous neurons (active-set -> LP intervals) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['id']} | {r['region']} | {r['active_set']:.6f} | {r['hull_same']:.6f}"
                     f" | {r['hull_lp_intervals']:.6f} | {r['ambiguous'][0]} -> "
                     f"{r['ambiguous'][1]} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / f"anderson_limit{args.tag}.md").write_text(text)


if __name__ == "__main__":
    main()
