"""The pictures of the docs (`docs/img/*.png`), each from committed results or in seconds:

- `cactus`: instances solved against time on mnist_fc at 5% of the timeouts, per splitting
  mode, from `benchmarks/results/vnncomp_mnist_fc_{auto,input,relu}.csv` (`benchmarks.cactus`);
- `anytime`: share of the exact LP's improvement over CROWN against seconds, the dual solvers
  against alpha-CROWN, from `benchmarks/results/ld_vs_lp_quick.json`;
- `crf`: the classic dense-CRF example (`../shared/data/densecrf/im1.png`, `anno1.png`)
  before and after 5 mean-field iterations;
- `monitor`: a monitor's certified ranges of the quickstart's digits MLP (trained here, a few
  seconds) against fault-free and faulty inferences.

    python docs/plots.py [cactus anytime crf monitor] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import crf  # noqa: E402
import verify  # noqa: E402
from benchmarks.cactus import plot as cactus_plot  # noqa: E402
from benchmarks.cactus import read_results  # noqa: E402
from crf.io import read_image  # noqa: E402
from verify.monitor.faults import Fault, inject  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"
DATA = ROOT.parent / "shared" / "data"


def cactus(data: Path) -> Path:
    """Splitting modes on mnist_fc at 5% of the timeouts (the committed results CSVs)."""
    runs = {mode: read_results(RESULTS / f"vnncomp_mnist_fc_{mode}.csv") for mode in
            ("auto", "input", "relu")}  # fmt: skip
    title = "mnist_fc, 90 instances at 5% of the VNN-COMP timeouts, per --splitting mode"
    return cactus_plot(runs, IMG / "cactus_mnist_fc.png", title)


def anytime(data: Path) -> Path:
    """Share of the LP's improvement over CROWN against seconds (ld_vs_lp --quick's curves)."""
    rows = json.loads((RESULTS / "ld_vs_lp_quick.json").read_text())["rows"]
    panels = [r for r in rows if r["suite"] != "acasxu"]
    fig, grid = plt.subplots(2, 2, figsize=(10, 7), sharey=True)
    axes = grid.ravel()
    for axis, row in zip(axes, panels):
        for name in ("prox", "prox(alpha init)", "supergradient"):
            t, share = zip(*row["curves"][name])
            axis.plot(t, share, label=name)
        for its in (20, 200):
            axis.plot(row[f"alpha{its}_seconds"], row[f"alpha{its}_share"], "o",
                      label=f"alpha-CROWN, {its} it")  # fmt: skip
        axis.axvline(row["lp_seconds"], color="grey", linestyle=":", label="exact LP's time")
        name = row["id"].removesuffix(".gz").removesuffix(".vnnlib")
        axis.set(xscale="log", xlabel="seconds", title=f"{row['suite']}, {name}")
        axis.grid(alpha=0.3)
    for axis in grid[:, 0]:
        axis.set_ylabel("share of the LP's improvement over CROWN")
    axes[0].legend(fontsize=8, loc="center left")
    fig.suptitle("Anytime bounds, identical intermediate bounds (ld_vs_lp.py --quick)")
    fig.tight_layout()
    return _save(fig, "anytime.png")


def crf_picture(data: Path) -> Path:
    """The photo, its rough annotation and the mean-field labelling (classic parameters)."""
    folder = data / "densecrf"
    if not folder.is_dir():
        raise SystemExit(f"crf: {folder} is absent (pass --data)")
    image, annotation = read_image(folder / "im1.png"), read_image(folder / "anno1.png")
    labels, colours, unknown = crf.labels_from_annotation(annotation)
    unary = crf.unary_from_labels(labels, len(colours), gt_prob=0.7, zero_unsure=unknown)
    result = crf.DenseCRF(image, unary).map("meanfield", iterations=5)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    pictures = (image, annotation, colours[result.labels])
    names = ("image", "rough annotation (black: unknown)", "dense CRF, 5 mean-field iterations")
    for axis, picture, name in zip(axes, pictures, names):
        axis.imshow(picture)
        axis.set(title=name, xticks=[], yticks=[])
    fig.tight_layout()
    return _save(fig, "crf_before_after.png")


def monitor(data: Path) -> Path:
    """Certified ranges of the first layer of the digits MLP over [0, 1]^64, fault-free values
    of 200 test images, and the values with one weight's exponent bit flipped."""
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples" / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    torch.manual_seed(0)
    net, x_test, _ = quickstart.train_digits_mlp()
    mon = verify.monitor(net, verify.Box(torch.zeros(64), torch.ones(64)))
    low, high = (r[0].numpy() for r in mon.ranges["_0"])  # [1, 32] each: one region
    x = x_test[:200]
    neuron = int(np.argmax(high - low))  # the widest range: a flip there is still visible
    weight = int(net[0].weight[neuron].abs().argmax())
    fault = Fault("weight", "0.weight", index=neuron * 64 + weight, xor=1 << 25)  # x16 or /16
    with torch.no_grad():
        clean = net[0](x).numpy()
        with inject(net, [fault]):
            faulty = net[0](x).numpy()
            flagged = mon.check(net, x).flagged.float().mean().item()
    fig, axis = plt.subplots(figsize=(10, 3.8))
    cols = np.arange(low.size)
    axis.bar(cols, high - low, bottom=low, color="0.85", width=0.8, label="certified range")
    axis.plot(np.repeat(cols, len(x)), clean.T.ravel(), ".", ms=2, color="tab:blue",
              label="fault-free values (200 test images)")  # fmt: skip
    axis.plot(
        np.full(len(x), neuron),
        faulty[:, neuron],
        ".",
        ms=3,
        color="tab:red",
        label=f"one weight's exponent bit flipped: {flagged:.0%} of the images flagged",
    )
    axis.set(xlabel="neuron of the first layer", ylabel="pre-activation",
             title="verify.monitor on the digits MLP, domain [0, 1]^64")  # fmt: skip
    axis.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return _save(fig, "monitor_ranges.png")


def _save(fig, name: str) -> Path:
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / name
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


PICTURES = {"cactus": cactus, "anytime": anytime, "crf": crf_picture, "monitor": monitor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pictures", nargs="*", choices=[*PICTURES, []], help="default: all")
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.pictures or PICTURES:
        print(PICTURES[name](args.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
