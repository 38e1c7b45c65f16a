"""Monitor latency on CUDA: a CIFAR ResNet-18-sized model and the mnist 256x6-shaped MLP (random
weights), batch 256, plain vs clip vs detect (eager and compiled), median of blocks of calls.

Ranges: IBP over an L-inf ball (eps 2/255 for the ResNet, 0.02 for the MLP) around a random
centre, built on the CPU; the wrapped copies run on the device. Checks, per row: the monitored
outputs equal the plain ones on in-domain samples (eager, to the bit for detect; clip moves
nothing fault-free) and no fault-free sample is flagged. With TF32 allowed, float32 ranges are
refused (the monitor says so); the "tf32" rows build the monitor with precision="tf32".

    python -m benchmarks.gpu_monitor [--smoke] [--out DIR]   (writes gpu_monitor.{txt,json})
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

import verify

RESULTS = Path(__file__).resolve().parent / "results"


class Block(nn.Module):
    """ResNet basic block (He et al. 2016), batch norm in eval mode."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(h)) + self.skip(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18 (11M parameters), global pooling written as a mean."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        chans, layers, cin = [w, 2 * w, 4 * w, 8 * w], [], w
        for i, c in enumerate(chans):
            layers += [Block(cin, c, 1 if i == 0 else 2), Block(c, c, 1)]
            cin = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean(dim=(2, 3)))


def mlp(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    sizes = [784] + [width] * depth
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _median_ms(fn, device: torch.device, blocks: int, calls: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(blocks):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def _set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def one_row(name: str, net: nn.Module, shape, eps: float, batch: int, device, precision, size):
    torch.manual_seed(1)
    centre = torch.rand(1, *shape) * (1 - 2 * eps) + eps
    start = time.perf_counter()
    mon = verify.monitor(net, (centre - eps, centre + eps), method="ibp", precision=precision,
                         input_shape=tuple(shape))
    build_s = time.perf_counter() - start
    _set_tf32(precision == "tf32")
    dev = copy.deepcopy(net).to(device)
    x = (centre + eps * (2 * torch.rand(batch, *shape) - 1)).to(device)
    row = {"model": name, "precision": precision or "float32", "batch": batch,
           "device": str(device), "build_s": round(build_s, 2)}  # fmt: skip
    with torch.no_grad():
        plain = dev(x)
        variants = {"plain": lambda: dev(x)}
        clip = mon.wrap(dev, "clip")
        detect = mon.wrap(dev, "detect")
        y_clip, y_det = clip(x), detect(x)
        row["clip_equal"] = bool(torch.equal(y_clip, plain))
        row["detect_equal"] = bool(torch.equal(y_det, plain))
        row["false_positives"] = int(detect.report.flagged.sum())
        variants["clip"] = lambda: clip(x)
        variants["detect"] = lambda: detect(x)
        try:
            comp = mon.wrap(dev, "detect", compile=True)
            start = time.perf_counter()
            y_comp = comp(x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            row["compile_s"] = round(time.perf_counter() - start, 1)
            row["compiled_max_diff"] = float((y_comp - plain).abs().max())
            row["compiled_false_positives"] = int(comp.report.flagged.sum())
            variants["detect_compiled"] = lambda: comp(x)
        except Exception as err:
            row["compiled_error"] = f"{type(err).__name__}: {err}"[:300]
        for key, fn in variants.items():
            row[f"{key}_ms"] = round(_median_ms(fn, device, size["blocks"], size["calls"]), 3)
    for key in ("clip", "detect", "detect_compiled"):
        if f"{key}_ms" in row:
            row[f"{key}_overhead_pct"] = round(100 * (row[f"{key}_ms"] / row["plain_ms"] - 1), 1)
    _set_tf32(False)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    size = {"blocks": 2, "calls": 2, "batch": 4, "width": 8} if args.smoke else \
        {"blocks": 5, "calls": 20, "batch": 256, "width": 64}  # fmt: skip
    torch.manual_seed(0)
    resnet = ResNet18(size["width"]).eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        for m in resnet.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    cases = [("mnist_mlp_256x6", mlp(256, 6).eval(), (1, 28, 28), 0.02),
             ("cifar_resnet18", resnet, (3, 32, 32), 2 / 255)]  # fmt: skip
    precisions = [None, "tf32"] if device.type == "cuda" else [None]
    rows = []
    for name, net, shape, eps in cases:
        for precision in precisions:
            try:
                rows.append(one_row(name, net, shape, eps, size["batch"], device, precision, size))
            except Exception as err:
                traceback.print_exc()
                rows.append({"model": name, "precision": precision or "float32",
                             "error": f"{type(err).__name__}: {err}"[:300]})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "gpu_monitor_smoke" if args.smoke else "gpu_monitor"
    (args.out / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    cols = ["model", "precision", "plain_ms", "clip_overhead_pct", "detect_overhead_pct",
            "detect_compiled_overhead_pct", "false_positives", "clip_equal", "detect_equal"]  # fmt: skip
    lines = [" | ".join(cols)] + [" | ".join(str(r.get(c, r.get("error", "-"))) for c in cols) for r in rows]
    (args.out / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
