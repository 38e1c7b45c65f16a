"""The `forward` bound method against CROWN, side by side on the same boxes: seconds per box
and the worst spec's lower bound, in the search's float32 pass (`exact=False`) and in the
float64 pass with its rounding (`exact=True`, as closing bounds are rechecked).

    python -m benchmarks.forward_bounds

Networks: the bias-field stand-in (`benchmarks.biasfield`: 16 inputs in front of OVAL's
cifar_deep_kw, 6,756 ReLUs) at two box sizes, and ACAS Xu 1_1 (5 inputs, 300 ReLUs) on the
boxes of prop_1 and of a quarter of it. The spec is the margins `y_j - y_label` (bias field)
or `y_0 - y_j` (ACAS Xu). Writes `benchmarks/results/forward_bounds.{md,json}`; 1 thread.
"""

from __future__ import annotations

import gzip
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DATA, RESULTS, write_json
from bounds.graph.graph import build_graph
from bounds.methods.crown import crown
from bounds.methods.forward import forward_crown
from bounds.types import Interval
from verify.io.onnx_loader import load_onnx

REPEATS = 3


def _time(fn) -> tuple[float, float]:
    """Median seconds of `REPEATS` calls, and the worst lower bound."""
    times, worst = [], None
    for _ in range(REPEATS):
        tick = time.perf_counter()
        lower = fn()[0]
        times.append(time.perf_counter() - tick)
        worst = float(lower.min())
    return statistics.median(times), worst


def cases() -> list[tuple[str, torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`(name, net, lower, upper, C)` per row."""
    out = []
    net_path = DATA / "vnncomp2022" / "oval21" / "onnx" / "cifar_deep_kw.onnx.gz"
    if net_path.is_file():
        from benchmarks.biasfield import biasfield_model
        from benchmarks.common import cifar_images

        images, labels = cifar_images(1)
        model = biasfield_model(images[0].numpy().astype("float64"))
        path = Path(tempfile.mkdtemp()) / "biasfield.onnx"
        onnx.save(model, str(path))
        net, label = load_onnx(path), int(labels[0])
        C = (torch.eye(10) - torch.eye(10)[label])[None]
        centre = torch.zeros(1, 16)
        centre[0, 0] = 1.0
        for eps in (0.04, 0.01):
            out.append((f"bias field, eps {eps}", net, centre - eps, centre + eps, C))
    acas = DATA / "vnncomp2022" / "acasxu" / "onnx" / "ACASXU_run2a_1_1_batch_2000.onnx.gz"
    if acas.is_file():
        with gzip.open(acas) as f:
            path = Path(tempfile.mkdtemp()) / "acas.onnx"
            path.write_bytes(f.read())
        net = load_onnx(path)
        lower = torch.tensor([[0.6, -0.5, -0.5, 0.45, -0.5]])
        upper = torch.tensor([[0.6799, 0.5, 0.5, 0.5, -0.45]])
        C = torch.zeros(1, 4, 5)
        for j in range(4):
            C[0, j, 0], C[0, j, j + 1] = 1.0, -1.0
        out.append(("ACAS Xu 1_1, prop_1 box", net, lower, upper, C))
        out.append(("ACAS Xu 1_1, a quarter", net, lower, lower + (upper - lower) / 4, C))
    return out


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for name, net, lower, upper, C in cases():
        shape = tuple(getattr(net, "input_shape", None) or (lower.shape[1],))
        graph = build_graph(net, shape)
        box = Interval(lower.reshape(1, *shape), upper.reshape(1, *shape))
        for exact in (False, True):
            row = {"case": name, "exact": exact}
            for method, fn in (("crown", crown), ("forward", forward_crown)):
                seconds, worst = _time(partial(fn, graph, box, C, exact=exact))
                row[f"{method}_seconds"], row[f"{method}_lower"] = seconds, worst
            rows.append(row)
    if not rows:
        sys.exit(f"the shared data folder {DATA} has none of the networks")
    lines = [
        "| boxes | pass | CROWN s | forward s | CROWN / forward | CROWN worst lower | forward worst lower |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kind = "float64, rounding tracked" if r["exact"] else "float32 (search)"
        ratio = r["crown_seconds"] / r["forward_seconds"]
        lines.append(
            f"| {r['case']} | {kind} | {r['crown_seconds']:.3f} | {r['forward_seconds']:.3f} | "
            f"{ratio:.1f}x | {r['crown_lower']:.4f} | {r['forward_lower']:.4f} |"
        )
    table = "\n".join(lines)
    print(table)
    (RESULTS / "forward_bounds.md").write_text(
        "# forward against CROWN, one box each, 1 thread\n\n`python -m benchmarks.forward_bounds`"
        f" (median of {REPEATS})\n\n{table}\n"
    )
    write_json("forward_bounds.json", {"repeats": REPEATS, "threads": 1, "rows": rows})


if __name__ == "__main__":
    main()
