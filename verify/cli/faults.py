"""Fault-injection campaigns: `python -m verify faults NET --domain D --data CSV --trials N`.

One trial: one fault (or `--flips` bit flips) in the weights or in one activation of one
held-out input; the network runs with the verified monitor (`verify.monitor`) and with the
baselines: ranges profiled on the profiling rows of the data (min/max per neuron, as Ranger
does; Chen et al., DSN 2021) and fixed clipping at +-6 and +-100 (the activation clipping of
Ma et al. 2023). A row per trial goes to `trials.csv` (fault, layer, bit, output changed?,
detected?, recovered by clipping? for each method); `summary.json` / `summary.md` hold the
rates, `bits.png` the detection rate per bit position. The same seed gives the same rows.

"Output changed": the top-1 class differs from the fault-free one on that input (an SDC);
"recovered": the clipped network's top-1 equals the fault-free one. False positives are
counted on fault-free held-out inputs (the data rows left after profiling; for ball domains
random points of their balls too).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import Tensor, nn

from bounds.errors import InvalidLimitError, VerificationInputError
from verify.cli.options import count_option
from verify.io.onnx_loader import load_onnx
from verify.monitor import Box, Monitor, monitor
from verify.monitor.faults import (
    MODELS,
    TARGETS,
    activation_sites,
    inject,
    sample_faults,
    weight_sites,
)

FIXED_CLIPS = (6.0, 100.0)
BIT_CLASSES = ("any", "sign", "exponent", "mantissa")


@dataclass(frozen=True)
class Campaign:
    """What to inject: `trials` trials of `target` faults under `model` (see verify.monitor.faults)."""

    trials: int
    target: str = "weight"
    model: str = "bitflip"
    bits: str = "any"
    flips: int = 1
    seed: int = 0
    batch: int = 256  # activation trials per forward pass

    def __post_init__(self) -> None:
        if self.target not in TARGETS or self.model not in MODELS or self.bits not in BIT_CLASSES:
            raise InvalidLimitError(f"bad campaign: target={self.target!r} model="
                                    f"{self.model!r} bits={self.bits!r}")  # fmt: skip
        for name in ("trials", "flips", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidLimitError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass
class Bench:
    """A network with its monitor and the data of a campaign: `inputs [N, *shape]` (network
    units), `labels [N]`, `region [N]` (each input's region, or None: one region for all)."""

    net: nn.Module
    monitor: Monitor
    inputs: Tensor
    labels: Tensor
    region: Tensor | None = None


def profile_ranges(bench: Bench, inputs: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Per monitored node, the min and max of its values over `inputs` (one range per layer,
    as Ranger profiles them: per-neuron ranges from a few hundred inputs flag most new ones)."""
    wrapped = bench.monitor.wrap(bench.net, "detect", keep_values=True)
    with torch.no_grad():
        values = wrapped.run(inputs)[1].values
    return {name: (v.amin(), v.amax()) for name, v in values.items()}


class Methods:
    """The wrapped networks of one campaign: ours (detect with the raw values kept, clip),
    profiled ranges (clip) and fixed clipping (clip)."""

    def __init__(self, bench: Bench, profiled: dict) -> None:
        mon, net = bench.monitor, bench.net
        self.detect = mon.wrap(net, "detect", keep_values=True)
        self.clips = {"ours": mon.wrap(net, "clip")}
        self.ranges = {"profiled": profiled}
        self.clips["profiled"] = mon.wrap(net, "clip", ranges=profiled)
        for c in FIXED_CLIPS:
            fixed = {n: (torch.tensor(-c), torch.tensor(c)) for n in mon.affine}
            self.ranges[f"fixed{c:g}"] = fixed
            self.clips[f"fixed{c:g}"] = mon.wrap(net, "clip", ranges=fixed)

    def evaluate(self, x: Tensor, region: Tensor | None) -> dict[str, Tensor]:
        """Per method `[batch]`: detected, and top-1 of its clipped run (plus the raw top-1)."""
        with torch.no_grad():
            raw, report = self.detect.run(x, region)
            out = {"top1": _top1(raw), "detected_ours": report.flagged}
            for name, ranges in self.ranges.items():
                out[f"detected_{name}"] = _outside(report.values, ranges)
            for name, clip in self.clips.items():
                flagged = out[f"detected_{name}"]
                top = out["top1"]
                if bool(flagged.any()):  # unflagged samples: clipping changes nothing
                    mine = region if name == "ours" else None  # the baselines: one range
                    top = torch.where(flagged, _top1(clip.run(x, mine)[0]), top)
                out[f"clip_{name}"] = top
        out["first_node"] = report.first_node
        return out


def _top1(y: Tensor) -> Tensor:
    """Top-1 class per row; -1 where the output is not finite (NaN or Inf: never correct)."""
    flat = y.reshape(y.shape[0], -1)
    return torch.where(torch.isfinite(flat).all(1), flat.argmax(1), -1)


def _outside(values: dict[str, Tensor], ranges: dict) -> Tensor:
    """`[batch]`: some value outside its range (NaN counts as outside)."""
    flags = None
    for name, v in values.items():
        lo, hi = ranges[name]
        inside = (v >= lo) & (v <= hi)
        bad = ~inside.reshape(v.shape[0], -1).all(1)
        flags = bad if flags is None else flags | bad
    return flags


def _sites(bench: Bench, target: str) -> dict:
    if target == "weight":
        return weight_sites(bench.net)
    return activation_sites(bench.net, bench.inputs[:1])


def run_campaign(bench: Bench, held_out: Tensor, profiled: dict, campaign: Campaign,
                 progress: Callable[[int, int], None] | None = None) -> list[dict]:  # fmt: skip
    """The rows of `campaign` on the held-out input indices `held_out` (see the module
    docstring); the clean network is restored after every trial."""
    methods = Methods(bench, profiled)
    faults = sample_faults(_sites(bench, campaign.target), campaign.trials, target=campaign.target,
                           model=campaign.model, bits=campaign.bits, flips=campaign.flips,
                           seed=campaign.seed)  # fmt: skip
    rng = np.random.default_rng(campaign.seed + 1)
    picks = torch.as_tensor(rng.choice(held_out.numpy(), size=campaign.trials))
    with torch.no_grad():
        clean = _top1(bench.net(bench.inputs[held_out]))
    clean_of = dict(zip(held_out.tolist(), clean.tolist()))
    step = 1 if campaign.target == "weight" else campaign.batch
    rows: list[dict] = []
    for start in range(0, campaign.trials, step):
        chunk = list(range(start, min(start + step, campaign.trials)))
        index = picks[chunk]
        trial_faults = [_for_sample(faults[t], j) for j, t in enumerate(chunk)]
        with inject(bench.net, [f for fs in trial_faults for f in fs]):
            result = methods.evaluate(bench.inputs[index], _take_index(bench.region, index))
        rows.extend(_rows(chunk, trial_faults, index, bench, clean_of, result, campaign))
        if progress is not None:
            progress(len(rows), campaign.trials)
    return rows


def _take_index(region: Tensor | None, index: Tensor) -> Tensor | None:
    return None if region is None else region[index]


def _for_sample(faults, sample: int):
    """Activation faults of one trial bound to its row of the batch."""
    return tuple(f if f.target == "weight" else replace(f, sample=sample) for f in faults)


def _rows(chunk, trial_faults, index, bench, clean_of, result, campaign) -> list[dict]:
    rows = []
    for j, t in enumerate(chunk):
        sample = int(index[j])
        clean, label = clean_of[sample], int(bench.labels[sample])
        faulty = int(result["top1"][j])
        row = {
            "trial": t, "target": campaign.target, "model": campaign.model,
            "layer": ";".join(f.site for f in trial_faults[j]),
            "element": ";".join(str(f.index) for f in trial_faults[j]),
            "bit": ";".join(str(b) for f in trial_faults[j] for b in f.bits),
            "value": ";".join("" if f.value is None else f"{f.value:.6g}" for f in trial_faults[j]),
            "input": sample, "label": label, "clean": clean, "faulty": faulty,
            "changed": int(faulty != clean), "first_node": result["first_node"][j] or "",
        }  # fmt: skip
        for name in ("ours", "profiled", *(f"fixed{c:g}" for c in FIXED_CLIPS)):
            clipped = int(result[f"clip_{name}"][j])
            row[f"detected_{name}"] = int(bool(result[f"detected_{name}"][j]))
            row[f"recovered_{name}"] = int(clipped == clean)
            row[f"correct_{name}"] = int(clipped == label)
        rows.append(row)
    return rows


def false_positives(
    bench: Bench, profiled: dict, inputs: Tensor, region: Tensor | None
) -> dict[str, float]:
    """Fraction of the fault-free `inputs` each method flags, and the clean accuracy of each
    clipped network on them (fixed clipping changes fault-free outputs)."""
    methods = Methods(bench, profiled)
    out = methods.evaluate(inputs, region)
    rates = {k[9:]: float(v.float().mean()) for k, v in out.items() if k.startswith("detected_")}
    return {"count": int(inputs.shape[0]), "rate": rates}


def summarise(rows: list[dict]) -> dict:
    """Rates over the trials: SDC, detection (on SDCs and on all faults), recovery, accuracy."""
    n = len(rows)
    sdc = [r for r in rows if r["changed"]]
    names = ("ours", "profiled", *(f"fixed{c:g}" for c in FIXED_CLIPS))
    clean_acc = sum(r["clean"] == r["label"] for r in rows) / max(n, 1)
    faulty_acc = sum(r["faulty"] == r["label"] for r in rows) / max(n, 1)

    def rate(items, key):
        return sum(r[key] for r in items) / len(items) if items else float("nan")

    per = {
        m: {
            "detected_sdc": rate(sdc, f"detected_{m}"),
            "detected_all": rate(rows, f"detected_{m}"),
            "recovered_sdc": rate(sdc, f"recovered_{m}"),
            "accuracy": rate(rows, f"correct_{m}"),
            "accuracy_recovered": rate(rows, f"correct_{m}") / clean_acc if clean_acc else 0.0,
        }
        for m in names
    }
    return {"trials": n, "sdc": len(sdc), "sdc_rate": len(sdc) / max(n, 1),
            "clean_accuracy": clean_acc, "faulty_accuracy": faulty_acc, "methods": per}  # fmt: skip


def by_bit(rows: list[dict]) -> dict[int, dict[str, float]]:
    """Single-bit trials per bit position: trials, SDC rate, detection rate on SDCs (ours and
    the baselines)."""
    out: dict[int, dict[str, float]] = {}
    for bit in sorted({int(r["bit"]) for r in rows if r["bit"] and ";" not in r["bit"]}):
        mine = [r for r in rows if r["bit"] == str(bit)]
        sdc = [r for r in mine if r["changed"]]
        entry = {"trials": len(mine), "sdc_rate": len(sdc) / len(mine)}
        for m in ("ours", "profiled", *(f"fixed{c:g}" for c in FIXED_CLIPS)):
            entry[m] = sum(r[f"detected_{m}"] for r in sdc) / len(sdc) if sdc else float("nan")
        out[bit] = entry
    return out


def plot_by_bit(curves: dict[str, dict[int, dict]], path: Path) -> None:
    """`curves`: label -> `by_bit` result; one panel per label (detection rate and SDC rate)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # optional: the bench extra
        raise ImportError("the plot needs matplotlib: pip install matplotlib") from err
    cols = 2 if len(curves) > 2 else 1
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat[len(curves) :]:
        ax.set_visible(False)
    for ax, (label, bits) in zip(axes.flat, curves.items()):
        xs = sorted(bits)
        for m, style in (("ours", "o-"), ("profiled", "s--"), ("fixed6", "^:"), ("fixed100", "v:")):
            ax.plot(xs, [bits[b][m] for b in xs], style, label=f"detected ({m})", markersize=3)
        ax.bar(xs, [bits[b]["sdc_rate"] for b in xs], color="0.85", label="SDC rate")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("bit position (0 = mantissa LSB)", fontsize=8)
    axes[0, 0].legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Progress:
    """A one-line progress bar on a stream (updated at most every 0.2 s)."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label, self.stream, self.start, self.last = label, stream or sys.stderr, 0.0, 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        self.start = self.start or now
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        bar = "#" * int(30 * done / total)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r{self.label} [{bar:<30}] {done}/{total} {now - self.start:.1f} s"
                          + end)  # fmt: skip
        self.stream.flush()


def write_csv(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def markdown(summary: dict, fp: dict) -> str:
    """A markdown table of one campaign's summary and false-positive rates."""
    lines = [f"trials {summary['trials']}, SDC rate {summary['sdc_rate']:.4f}, clean accuracy "
             f"{summary['clean_accuracy']:.3f}, faulty {summary['faulty_accuracy']:.3f}", "",
             "| method | detected (SDC) | detected (all) | recovered (SDC) | accuracy recovered "
             "| false positives |", "|---|---|---|---|---|---|"]  # fmt: skip
    for m, v in summary["methods"].items():
        lines.append(f"| {m} | {v['detected_sdc']:.4f} | {v['detected_all']:.4f} | "
                     f"{v['recovered_sdc']:.4f} | {v['accuracy_recovered']:.4f} | "
                     f"{fp['rate'][m]:.4f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# --- the command line ----------------------------------------------------------------------------


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None


def domain_option(text: str) -> tuple[str, list[float]]:
    """`box:LOW,HIGH` (every input in [LOW, HIGH]) or `ball:EPS` (the L-inf balls of radius EPS
    around the held-out inputs, within the --range box)."""
    kind, _, rest = text.partition(":")
    values = _floats(rest) if rest else []
    if kind == "box" and len(values) == 2 and values[0] <= values[1]:
        return kind, values
    if kind == "ball" and len(values) == 1 and values[0] >= 0:
        return kind, values
    raise argparse.ArgumentTypeError(f"{text!r}: expected box:LOW,HIGH or ball:EPS (EPS >= 0)")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `faults` subcommand of `python -m verify`."""
    p = subparsers.add_parser("faults", help="fault-injection campaign with verified monitors")
    p.add_argument("network", type=Path, help="ONNX network (.onnx or .onnx.gz)")
    p.add_argument("--domain", type=domain_option, required=True, help="box:LOW,HIGH or ball:EPS")
    p.add_argument("--data", type=Path, required=True, help="CSV rows: label, then the values")
    p.add_argument("--trials", type=count_option(1), required=True, help="trials per target")
    p.add_argument("--targets", default="weight,activation", help="weight,activation (both)")
    p.add_argument("--model", choices=MODELS, default="bitflip", help="error model (bitflip)")
    p.add_argument("--bits", choices=BIT_CLASSES, default="any", help="bit class (any)")
    p.add_argument("--flips", type=count_option(1), default=1, help="bit flips per trial (1)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument("--scale", type=float, default=255.0, help="divide the data by this (255)")
    p.add_argument("--range", type=_floats, default=[0.0, 1.0], help="value range (0,1)")
    p.add_argument("--layout", choices=("chw", "hwc"), default="chw", help="CSV pixel order")
    p.add_argument("--mean", type=_floats, help="per-channel mean, normalised outside the net")
    p.add_argument("--std", type=_floats, help="per-channel std, normalised outside the net")
    p.add_argument("--profile", type=float, default=0.5, help="data fraction for profiling")
    p.add_argument("--rows", type=count_option(2), help="use only the first N data rows")
    p.add_argument("--method", choices=("crown", "ibp"), default="crown", help="bounds (crown)")
    p.add_argument("--out", type=Path, required=True, help="folder for the CSV, JSON, PNG")
    p.add_argument("--threads", type=count_option(1), default=1, help="torch threads (1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="no PNG")
    return p


def load_rows(
    path: Path, shape: tuple[int, ...], scale: float, layout: str
) -> tuple[Tensor, Tensor]:
    """`(inputs [N, *shape], labels [N])` from a CSV of `label, values...` rows."""
    try:
        data = np.loadtxt(path, delimiter=",", ndmin=2)
    except (OSError, ValueError) as err:
        raise VerificationInputError(f"{path}: cannot read the data ({err})") from err
    numel = int(np.prod(shape))
    if data.shape[1] != numel + 1:
        raise VerificationInputError(f"{path}:1: {data.shape[1]} columns; the network needs a "
                                     f"label and {numel} values")  # fmt: skip
    values = torch.tensor(data[:, 1:] / scale, dtype=torch.float32)
    if layout == "hwc" and len(shape) == 3:
        values = values.reshape(-1, shape[1], shape[2], shape[0]).permute(0, 3, 1, 2)
    return values.reshape(-1, *shape).contiguous(), torch.tensor(data[:, 0], dtype=torch.long)


def _normaliser(args, shape):
    if (args.mean is None) != (args.std is None):
        raise VerificationInputError("give both --mean and --std, or neither")
    if args.mean is None:
        return lambda t: t
    view = (-1,) + (1,) * (len(shape) - 1)
    mean, std = torch.tensor(args.mean).view(view), torch.tensor(args.std).view(view)
    if (std <= 0).any():
        raise VerificationInputError(f"--std must be > 0, got {args.std}")
    return lambda t: (t - mean) / std


def build_bench(args: argparse.Namespace, net: nn.Module) -> tuple[Bench, Tensor, Tensor]:
    """The bench, the profiling indices and the held-out indices of the CLI's arguments."""
    shape = tuple(net.input_shape)
    raw, labels = load_rows(args.data, shape, args.scale, args.layout)
    if getattr(args, "rows", None):
        raw, labels = raw[: args.rows], labels[: args.rows]
    norm = _normaliser(args, shape)
    n_prof = round(args.profile * raw.shape[0])
    if not 0 < n_prof < raw.shape[0]:
        raise VerificationInputError(f"--profile {args.profile} leaves no profiling or "
                                     f"held-out rows of {raw.shape[0]}")  # fmt: skip
    prof, held = torch.arange(n_prof), torch.arange(n_prof, raw.shape[0])
    low, high = args.range
    kind, values = args.domain
    region = None
    if kind == "box":
        domain = Box(norm(torch.full(shape, values[0])), norm(torch.full(shape, values[1])))
        inputs = raw
    else:
        eps = values[0]
        centers = raw[held]
        domain = Box(norm((centers - eps).clamp(low, high)), norm((centers + eps).clamp(low, high)))
        rng = torch.Generator().manual_seed(args.seed + 2)
        noise = (torch.rand(centers.shape, generator=rng) * 2 - 1) * eps
        inputs = raw.clone()
        inputs[held] = (centers + noise).clamp(low, high)
        region = torch.zeros(raw.shape[0], dtype=torch.long)
        region[held] = torch.arange(held.numel())
    mon = monitor(net, domain, method=args.method)
    return Bench(net, mon, norm(inputs), labels, region), prof, held


def main(args: argparse.Namespace) -> int:
    """Runs the campaign of the parsed `args`; 0, or 2 for bad input (one `error:` line)."""
    try:
        return _main(args)
    except VerificationInputError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2


def _main(args: argparse.Namespace) -> int:
    torch.set_num_threads(getattr(args, "threads", 1))
    targets = [t for t in args.targets.split(",") if t]
    if not targets or any(t not in TARGETS for t in targets):
        raise VerificationInputError(f"--targets must list weight and/or activation, got "
                                     f"{args.targets!r}")  # fmt: skip
    if not args.out.is_dir() or not os.access(args.out, os.W_OK):
        raise VerificationInputError(f"--out {args.out} is not a writable folder")
    if len(args.range) != 2 or not args.range[0] <= args.range[1]:
        raise VerificationInputError(f"--range must be LOW,HIGH with LOW <= HIGH, got {args.range}")
    if not 0 < args.profile < 1:
        raise VerificationInputError(f"--profile must lie in (0, 1), got {args.profile}")
    net = load_onnx(args.network).eval()
    bench, prof, held = build_bench(args, net)
    profiled = profile_ranges(bench, bench.inputs[prof])
    fp = false_positives(bench, profiled, bench.inputs[held], _take_index(bench.region, held))
    report = {"network": str(args.network), "domain": args.domain, "false_positives": fp}
    rows, curves = [], {}
    for target in targets:
        campaign = Campaign(args.trials, target, args.model, args.bits, args.flips, args.seed)
        bar = None if args.no_progress else Progress(f"{target:>10}")
        mine = run_campaign(bench, held, profiled, campaign, bar)
        report[target] = summarise(mine)
        curves[f"{args.network.name}: {target} faults ({args.model}, bits {args.bits})"] = by_bit(
            mine
        )
        rows.extend(mine)
    write_csv(args.out / "trials.csv", rows)
    (args.out / "summary.json").write_text(json.dumps(report, indent=2))
    text = "".join(f"## {t} faults\n\n{markdown(report[t], fp)}\n" for t in targets)
    (args.out / "summary.md").write_text(text)
    print(text, end="")
    if not args.no_plot and any(curves.values()):
        plot_by_bit(curves, args.out / "bits.png")
    return 0
