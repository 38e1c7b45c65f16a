"""Silent-data-corruption campaign: verified activation monitors (`verify.monitor`) against
profiled ranges (Ranger-like) and fixed clipping (+-6, +-100), side by side in one run.

Rows: mnist_fc 256x2 and 256x6 on the [0, 1] pixel box and on L-inf balls of eps 0.1 around
held-out test images; OVAL cifar_base on eps 8/255 balls (normalised outside the net); a
digits MLP trained here (sklearn digits, [0, 1] box). Per row and fault model: SDC rate (top-1
changed), detection rate on SDCs, false positives on fault-free held-out inputs, accuracy
recovered by clipping, and the latency of the wrapped module against the plain one (batch 1
and 256, interleaved calls, median of 5 blocks; the machine is shared, so only the ratios of
the same run mean anything).

Run: python benchmarks/sdc_campaign.py [--trials 10000] [--extra 2000] [--rows mnist_box,...]
[--name STEM] (needs ../shared/data, scikit-learn, matplotlib; 1 thread; writes
benchmarks/results/STEM.{json,md,png}, default sdc_campaign). `--latency-only` re-measures
the latencies of the rows of an existing STEM.json in place; `--compiled` adds the
torch.compile experiment (`compiled_latency`).

Production sizes (`--production`, writes benchmarks/results/sdc_production.{json,md}): a CIFAR
ResNet-18 (11M parameters) and a CIFAR-sized VGG-11 (9M) written as torchvision writes them
(`tests/torchvision_zoo.py`: in-place ReLUs, BatchNorm, 1x1 downsample, adaptive pooling),
random weights, IBP ranges over an L-inf ball of 2/255 around a random centre; latency of clip,
detect (ranges) and detect (ranges and checksums) against the plain module at batch 256 and 1,
the variants interleaved call by call in rounds (median over rounds of each round's median);
with the mnist/digits rows re-measured the same way; and a fault campaign on a small CNN
(`digits_cnn`: a torchvision-style ResNet-18 of width 4, trained here on sklearn digits
upsampled to 3x16x16) for detection rates and false positives. Run it pinned to one core:
`taskset -c 1 python benchmarks/sdc_campaign.py --production`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import CIFAR_MEAN, CIFAR_STD, DATA, RESULTS, write_json
from verify.cli.faults import (
    Bench,
    Campaign,
    Progress,
    build_bench,
    by_bit,
    false_positives,
    plot_by_bit,
    profile_ranges,
    run_campaign,
    summarise,
)
from verify.io.onnx_loader import load_onnx
from verify.monitor import Box, monitor
from verify.monitor.check import shared_trace

MNIST = DATA / "vnncomp2022" / "mnist_fc" / "onnx"
NOTES = """\
Columns: SDC rate = trials whose top-1 class changed; detected SDC = share of those flagged by
each method (ours: the verified CROWN ranges and the checksums of the Linear and Conv2d
layers; profiled: per-layer min/max over the profiling rows, Ranger-like; fix6 / fix100: an
activation outside +-6 / +-100); FP = fault-free held-out inputs flagged (box rows: the 50
held-out test images; ball rows: the held-out inputs and 20 random points of each ball;
digits: the 597 test images); accuracy recovered = top-1 accuracy of the clipped faulty
network over the fault-free accuracy on the same inputs.
Faults: "bitflip any/exponent" = one bit of a float32 word (uniform over all bits / the 8
exponent bits); "value" = one element replaced by U[-1000, 1000]; "exponent-model" = one
element's exponent field replaced by another (Ma et al. 2023). Weights: uniform over all
parameter elements; activations: uniform over the elements of every Linear/Conv/ReLU output
of one input. Latency: this thread's CPU time per call, plain module vs wrapped, interleaved
call by call, median of 5 blocks (batch 1: 400 calls, 256: 40); 1 thread, on a 2-core machine
shared with other jobs (their cache traffic inflates every extra pass over the activations).
detect: ranges and checksums (the campaign's "ours"); detect-ranges: the range checks alone;
clip: ranges only (fused with the ReLUs); both: detect and clip.
"""
COMPILED_NOTES = """\
torch.compile (`--latency-only --compiled`, batch 256, Inductor on CPU): the plain network
compiled, and the compiled detection path (`wrap(net, "detect", compile=True)`,
`verify.monitor.compiled`: per-sample range and checksum tests as pure tensor functions in the
network's fx trace, fused by Inductor), against the plain eager module and the eager wrapper
(`wrap`: detect with checksums; `_ranges`: without). Compile time: the first call in the
process; it depends on Inductor's on-disk cache (cold: `TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)`;
on mnist256x2 in a fresh cache 14.9 s for the first check graph, 2.1 s for the next, 1.2 s for
the plain net; warm: 3.1 / 0.13 / 0.09 s).
"""
PRODUCTION_NOTES = """\
Latency: CPU time of this thread per call (`time.thread_time`), 1 thread (`torch.set_num_threads(1)`,
`taskset -c 1`), on a 2-core machine shared with other engineers' jobs, so timings are noisy:
the variants (plain, clip, detect ranges, detect ranges + checksums) run interleaved call by
call in rounds (the order rotating), the figure is the median over rounds of each round's
median, and the overhead the median over rounds of the per-round ratio to plain (in brackets:
the smallest and largest per-round ratio). Fault-free check per model: the wrapped outputs
equal the plain ones to the bit and no in-domain sample is flagged.
Models (random weights, BatchNorm statistics randomised; `tests/torchvision_zoo.py`):
resnet18_cifar = torchvision's ResNet-18 with the CIFAR stem (3x3 stride-1 convolution, no max
pooling), 11.2M parameters; vgg11_cifar = torchvision's VGG-11 with adaptive pooling to 1x1 and
512-wide hidden layers, 9.2M parameters. Ranges: IBP over the L-inf ball of radius 2/255 around
a random centre in [0, 1] (CROWN is out of reach at this size on one core); inputs: uniform in
the ball. The mnist/digits rows are the campaign's rows above (their own domains and inputs).
Columns: "fx trace, no checks" = the torch.fx module the wrappers run, without checks (the
in-place `out += identity` of torchvision's blocks becomes an out-of-place add there); clip =
`wrap(net, "clip")`; detect (ranges) = `wrap(net, "detect", checksums=False)`; + checksums =
the default `wrap(net, "detect")`; these run the fused checks (`verify/monitor/fused.py`, the
default where the C kernel of `kernels/range_check.py` builds: each check in the pass that
writes the ReLU, a residual add with its operands' checks and its ReLU in one in-place pass);
"eager checks" = the same with `fused=False` (the checker of `verify/monitor/check.py`: per
node its extremes over the batch, extra passes). Fault-free: all variants' outputs equal the
plain ones to the bit / flagged samples summed over the detect variants.
Before the fused checks (commit 4d2bf3c, same command, resnet18_cifar batch 256, eager checks
only): clip +3.56%, detect (ranges) +33.5% (through_relu +21.5%; +8.6% in a second run),
detect (ranges + checksums) +49.4% (through_relu +37.8%); vgg11_cifar batch 256: clip +0.95%,
detect (ranges) +18.7%, + checksums +24.2%. Tried and dropped: Inductor (`torch.compile`) of
a ReLU + range-test function per layer does not fuse the reduction into the ReLU's loop (it
emits two loops over the activation: 34 ms against 7 ms for the in-place ReLU at 256x64x32x32);
the C kernel's loop built for the baseline x86-64 was 1.5x slower than with `-march=native`.
Measured: the table's resnet18/vgg11/mnist/digits rows at commit 902b1e7 (`--production --rows
resnet18_cifar,vgg11_cifar,mnist256x2_box,mnist256x6_ball,digits_box`; digits_cnn is an
earlier run's); sdc_production_rerun.md: resnet18_cifar again at 659eb6c (kernel launchers
prepared once per node; `--rows resnet18_cifar --name sdc_production_rerun`).
digits_cnn: a torchvision-style ResNet-18 of width 4 (in-place ReLUs, BatchNorm, downsample
convolutions) trained here on sklearn digits upsampled to 3x16x16; monitor: CROWN over the
[0, 1] pixel box; "ours" = `wrap(net, "detect")` (ranges and checksums: each convolution's
checksum read after its BatchNorm, the classifier's through the average pooling), the
campaigns and baselines of the table above (SDC = top-1 changed; faults injected with
`verify.monitor.faults`); which faults escape, and why: `benchmarks/sdc_detection.py`
(results/sdc_detection.md).
"""
PRODUCTION = ("resnet18_cifar", "vgg11_cifar")
ROWS = ("mnist256x2_box", "mnist256x2_ball", "mnist256x6_box", "mnist256x6_ball",
        "cifar_base_ball", "digits_box")  # fmt: skip


def _args(**kw) -> argparse.Namespace:
    base = dict(scale=255.0, layout="chw", mean=None, std=None, profile=0.5, range=[0.0, 1.0],
                seed=0, method="crown", rows=None)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def mnist(width: str, domain) -> tuple:
    net = load_onnx(MNIST / f"mnist-net_{width}.onnx.gz").eval()
    args = _args(data=DATA / "oval" / "mnist_test_first100.csv", domain=domain)
    return build_bench(args, net)


def cifar(eps: float, rows: int) -> tuple:
    net = load_onnx(DATA / "vnncomp2022" / "oval21" / "onnx" / "cifar_base_kw.onnx.gz").eval()
    args = _args(data=DATA / "oval" / "cifar10_test_first100.csv", domain=("ball", [eps]),
                 layout="hwc", mean=list(CIFAR_MEAN), std=[CIFAR_STD] * 3, rows=rows,
                 profile=2 / 3)  # fmt: skip
    return build_bench(args, net)


def fit(net: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> torch.Tensor:
    """Adam on the cross-entropy of the first 1,200 rows (batches of 64), then eval mode and
    frozen weights; returns the training rows' indices."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    train = torch.arange(1200)
    net.train()
    for _ in range(epochs):
        for batch in train[torch.randperm(1200)].split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
            opt.step()
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return train


def digits() -> tuple:
    """A 64-64-32-10 ReLU MLP trained here on sklearn's digits (pixels / 16 in [0, 1])."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                        nn.Linear(32, 10))  # fmt: skip
    train = fit(net, x, y, epochs=60, lr=3e-3)
    mon = monitor(net, Box(torch.zeros(64), torch.ones(64)))
    return Bench(net, mon, x, y), train, torch.arange(1200, len(x))


def load(row: str) -> tuple:
    if row == "digits_box":
        return digits()
    if row == "cifar_base_ball":
        return cifar(8 / 255, 75)
    width = row[5:10]
    return mnist(width, ("box", [0.0, 1.0]) if row.endswith("box") else ("ball", [0.1]))


def fault_free_points(bench: Bench, held: torch.Tensor, per_region: int) -> tuple:
    """The held-out inputs and, for ball domains, `per_region` random points of each ball."""
    inputs, region = bench.inputs[held], None
    if bench.region is not None:
        box = bench.monitor.box
        gen = torch.Generator().manual_seed(11)
        r = torch.arange(box.lower.shape[0]).repeat_interleave(per_region)
        t = torch.rand(len(r), *box.lower.shape[1:], generator=gen, dtype=torch.float64)
        extra = (box.lower[r] + (box.upper[r] - box.lower[r]) * t).to(inputs.dtype)
        inputs, region = torch.cat([inputs, extra]), torch.cat([bench.region[held], r])
    return inputs, region


def paired_latency(plain, wrapped, x, region, calls: int, blocks: int = 5) -> dict:
    """Median seconds per call of each, interleaved call by call, per block; the ratio. The
    clock is this thread's CPU time: a call preempted by the other jobs on the machine is not
    charged for the wait (it still pays for the caches they evict)."""
    out = {"plain": [], "wrapped": [], "ratio": []}
    with torch.no_grad():
        for _ in range(blocks):
            a, b = [], []
            for i in range(calls):
                pair = ((plain, a, ()), (wrapped, b, (region,)))
                for fn, times, extra in pair if i % 2 else pair[::-1]:
                    start = time.thread_time()
                    fn(x, *extra)
                    times.append(time.thread_time() - start)
            out["plain"].append(statistics.median(a))
            out["wrapped"].append(statistics.median(b))
            out["ratio"].append(out["wrapped"][-1] / out["plain"][-1])
    return {"plain_s": statistics.median(out["plain"]), "wrapped_s":
            statistics.median(out["wrapped"]), "ratio": statistics.median(out["ratio"]),
            "ratio_min": min(out["ratio"]), "blocks": blocks, "calls": calls}  # fmt: skip


def latency(bench: Bench, held: torch.Tensor) -> dict:
    gen = torch.Generator().manual_seed(5)
    out = {}
    for batch in (1, 256):
        pick = held[torch.randint(len(held), (batch,), generator=gen)]
        x = bench.inputs[pick]
        region = None if bench.region is None else bench.region[pick]
        calls = 400 if batch == 1 else 40
        variants = (("detect", "affine"), ("detect-ranges", "affine"), ("clip", "affine"),
                    ("both", "affine"), ("detect", "all"))  # fmt: skip
        for action, nodes in variants:
            sums = action != "detect-ranges"  # detect-ranges: the range checks alone
            wrapped = bench.monitor.wrap(bench.net, action.split("-")[0], nodes=nodes,
                                         checksums=sums)  # fmt: skip
            key = f"b{batch}_{action}_{nodes}"
            out[key] = paired_latency(bench.net, wrapped, x, region, calls)
    return out


def compiled_latency(bench: Bench, held: torch.Tensor, batch: int = 256) -> dict:
    """torch.compile (Inductor, CPU) of the plain network and the compiled detection path
    (`wrap(..., compile=True)`, `verify.monitor.compiled`) against the plain eager module and
    the eager wrapper, interleaved: compile times (first call), seconds per call (median of 5
    blocks of 40 calls), and whether the compiled flags equal the eager ones (clean inputs)."""
    gen = torch.Generator().manual_seed(5)
    pick = held[torch.randint(len(held), (batch,), generator=gen)]
    x = bench.inputs[pick]
    region = None if bench.region is None else bench.region[pick]
    out, fns = {}, {"plain": lambda: bench.net(x)}
    with torch.no_grad():
        compiled = torch.compile(bench.net)
        start = time.perf_counter()
        compiled(x)
        out["compile_plain_s"] = time.perf_counter() - start
        fns["plain_compiled"] = lambda: compiled(x)
        for sums in (False, True):
            tag = "" if sums else "_ranges"
            eager = bench.monitor.wrap(bench.net, "detect", checksums=sums)
            fast = bench.monitor.wrap(bench.net, "detect", checksums=sums, compile=True)
            start = time.perf_counter()
            report = fast.run(x, region)[1]
            out[f"compile{tag}_s"] = time.perf_counter() - start
            out[f"flags_equal{tag}"] = bool(torch.equal(report.node_flags,
                                                        eager.run(x, region)[1].node_flags))  # fmt: skip
            fns[f"wrap{tag}"] = lambda w=eager: w(x, region)
            fns[f"wrap_compiled{tag}"] = lambda w=fast: w(x, region)
        times = {name: [] for name in fns}
        for block in range(5):
            for name in list(fns) if block % 2 else list(fns)[::-1]:
                calls = []
                for _ in range(40):
                    start = time.thread_time()
                    fns[name]()
                    calls.append(time.thread_time() - start)
                times[name].append(statistics.median(calls))
    for name, values in times.items():
        out[f"{name}_s"] = statistics.median(values)
        out[f"{name}_spread_s"] = [min(values), max(values)]
    return out


def compiled_table(results: dict) -> str:
    lines = ["| row | variant | ms (median, spread) | vs plain eager | vs plain compiled |",
             "|---|---|---|---|---|"]  # fmt: skip
    for row, res in results.items():
        c = res.get("compiled")
        if not c:
            continue
        base, fast = c["plain_s"], c["plain_compiled_s"]
        for name in ("plain", "plain_compiled", "wrap_ranges", "wrap_compiled_ranges", "wrap",
                     "wrap_compiled"):  # fmt: skip
            lo, hi = c[f"{name}_spread_s"]
            lines.append(f"| {row} | {name} | {c[f'{name}_s'] * 1e3:.3f} ({lo * 1e3:.3f}-"
                         f"{hi * 1e3:.3f}) | {100 * (c[f'{name}_s'] / base - 1):+.1f}% | "
                         f"{100 * (c[f'{name}_s'] / fast - 1):+.1f}% |")  # fmt: skip
        lines.append(f"| {row} | compile s: plain {c['compile_plain_s']:.1f}, wrap "
                     f"{c['compile_s']:.1f}, ranges only {c['compile_ranges_s']:.1f}; flags "
                     f"equal to eager: {c['flags_equal'] and c['flags_equal_ranges']} | | | |")  # fmt: skip
    return "\n".join(lines) + "\n"


# --- production sizes ------------------------------------------------------------------------


def production_model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """A random-weight CIFAR model of production size (module docstring), eval mode, float32."""
    from tests.torchvision_zoo import randomise_batchnorm, resnet18, vgg11

    torch.manual_seed(0)
    if name == "resnet18_cifar":
        net = resnet18(width=64, cifar_stem=True)
    elif name == "vgg11_cifar":
        net = vgg11(width=64, pool=(1, 1), hidden=512)
    else:
        raise ValueError(f"unknown production model {name!r}; known: {', '.join(PRODUCTION)}")
    net = randomise_batchnorm(net).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, (3, 32, 32)


def production_bench(name: str, eps: float = 2 / 255, count: int = 256) -> tuple[Bench, dict]:
    """The model, its IBP monitor over one eps ball, and `count` inputs uniform in the ball."""
    from verify.monitor import Ball

    net, shape = production_model(name)
    gen = torch.Generator().manual_seed(1)
    centre = torch.rand(*shape, generator=gen) * (1 - 2 * eps) + eps
    start = time.perf_counter()
    mon = monitor(net, Ball(centre, eps, within=(0.0, 1.0)), method="ibp", input_shape=shape)
    build = time.perf_counter() - start
    inputs = centre + eps * (2 * torch.rand(count, *shape, generator=gen) - 1)
    inputs = torch.minimum(torch.maximum(inputs, centre - eps), centre + eps).clamp(0, 1)
    info = {"build_s": build, "parameters": sum(p.numel() for p in net.parameters()),
            "nodes": len(mon.affine), "checksums": sorted(mon.sums)}  # fmt: skip
    return Bench(net, mon, inputs, torch.zeros(count, dtype=torch.long)), info


def variants(bench: Bench) -> dict[str, nn.Module]:
    """The wrapped modules whose latency the production table gives."""
    mon, net = bench.monitor, bench.net
    return {"clip": mon.wrap(net, "clip"),
            "detect_ranges": mon.wrap(net, "detect", checksums=False),
            "detect": mon.wrap(net, "detect"),
            "clip_eager": mon.wrap(net, "clip", fused=False),
            "detect_ranges_eager": mon.wrap(net, "detect", checksums=False, fused=False),
            "detect_eager": mon.wrap(net, "detect", fused=False)}  # fmt: skip


def fault_free(bench: Bench, wrapped: dict[str, nn.Module], x: torch.Tensor, region) -> dict:
    """Per variant: the output equals the plain one to the bit, and samples flagged."""
    out = {}
    with torch.no_grad():
        plain = bench.net(x)
        for name, module in wrapped.items():
            y, report = module.run(x, region)
            out[name] = {"equal": bool(torch.equal(y, plain)),
                         "flagged": int(report.flagged.sum()) if name != "clip" else 0}  # fmt: skip
    return out


def interleaved(fns: dict, rounds: int, calls: int) -> dict:
    """Seconds per call of each function (thread CPU time), interleaved call by call in
    `rounds` rounds of `calls` calls, the order rotating; per function the median over rounds
    of each round's median, and its per-round ratio to "plain" (median, min, max)."""
    names = list(fns)
    per = {n: [] for n in names}
    with torch.no_grad():
        for fn in fns.values():  # warm up (allocator, first-call caches)
            fn()
        for r in range(rounds):
            times = {n: [] for n in names}
            for i in range(calls):
                shift = (r * calls + i) % len(names)
                for n in names[shift:] + names[:shift]:
                    start = time.thread_time()
                    fns[n]()
                    times[n].append(time.thread_time() - start)
            for n in names:
                per[n].append(statistics.median(times[n]))
    out = {}
    for n in names:
        ratios = [a / b for a, b in zip(per[n], per["plain"])]
        out[n] = {"s": statistics.median(per[n]), "ratio": statistics.median(ratios),
                  "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": rounds,
                  "calls": calls}  # fmt: skip
    return out


def production_latency(bench: Bench, pool: torch.Tensor, rounds: int, big_calls: int,
                       compiled: bool = False, only: set[str] | None = None) -> dict:  # fmt: skip
    """Batch 256 and batch 1 (inputs drawn from `pool` indices): fault-free checks, then the
    interleaved latencies of plain, clip, detect (ranges) and detect; `compiled`: at batch
    256 also the plain network and the detection path (ranges) through torch.compile, their
    first calls (compile) timed; `only`: the variants to time (besides plain), else all."""
    gen = torch.Generator().manual_seed(5)
    wrapped = {k: v for k, v in variants(bench).items() if only is None or k in only}
    out = {}
    for batch, calls in ((256, big_calls), (1, 200)):
        pick = pool[torch.randint(len(pool), (batch,), generator=gen)]
        x = bench.inputs[pick]
        region = None if bench.region is None else bench.region[pick]
        checks = fault_free(bench, wrapped, x, region)
        traced = shared_trace(bench.net)  # the fx module the wrappers run, without checks
        fns = {"plain": lambda x=x: bench.net(x), "traced": lambda x=x, t=traced: t(x)}
        if only is not None and "traced" not in only:
            del fns["traced"]
        for name, module in wrapped.items():
            fns[name] = lambda m=module, x=x, region=region: m(x, region)
        compile_s = {}
        if compiled and batch == 256:
            fast = torch.compile(bench.net)
            mine = bench.monitor.wrap(bench.net, "detect", checksums=False, compile=True)
            with torch.no_grad():
                for name, fn in (("plain_compiled", lambda f=fast, x=x: f(x)),
                                 ("detect_ranges_compiled",
                                  lambda m=mine, x=x, r=region: m(x, r))):  # fmt: skip
                    start = time.perf_counter()
                    fn()
                    compile_s[name] = time.perf_counter() - start
                    fns[name] = fn
                y, report = mine.run(x, region)
                checks["detect_ranges_compiled"] = {
                    "equal": bool(torch.equal(y, bench.net(x))),
                    "flagged": int(report.flagged.sum())}  # fmt: skip
        out[f"b{batch}"] = {"fault_free": checks, "latency": interleaved(fns, rounds, calls),
                            "compile_s": compile_s}  # fmt: skip
        print(production_table({"row": {f"b{batch}": out[f"b{batch}"]}}), flush=True)
    return out


def digits_cnn() -> tuple:
    """A torchvision-style ResNet-18 of width 4 (CIFAR stem) trained here on sklearn's digits,
    upsampled to 16x16 and repeated over 3 channels (pixels / 16 in [0, 1]); its monitor over
    the [0, 1] box (CROWN)."""
    from sklearn.datasets import load_digits

    from tests.torchvision_zoo import resnet18

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    x = nn.functional.interpolate(x, size=(16, 16), mode="nearest").expand(-1, 3, -1, -1)
    x = x.contiguous()
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    torch.manual_seed(0)
    net = resnet18(width=4, cifar_stem=True)
    train = fit(net, x, y, epochs=15, lr=1e-2)
    mon = monitor(net, Box(torch.zeros(3, 16, 16), torch.ones(3, 16, 16)), input_shape=(3, 16, 16))
    return Bench(net, mon, x, y), train, torch.arange(1200, len(x))


def detection_row(trials: int, extra: int) -> dict:
    """The fault campaign of `digits_cnn` (the campaigns of the other rows)."""
    start = time.perf_counter()
    bench, prof, held = digits_cnn()
    build = time.perf_counter() - start
    with torch.no_grad():
        accuracy = float((bench.net(bench.inputs[held]).argmax(1) == bench.labels[held]).float().mean())
    profiled = profile_ranges(bench, bench.inputs[prof])
    result = {"build_s": build, "clean_accuracy": accuracy, "nodes": bench.monitor.affine,
              "checksums": sorted(bench.monitor.sums),
              "false_positives": false_positives(bench, profiled, bench.inputs[held], None),
              "campaigns": {}}  # fmt: skip
    for label, campaign in campaigns(trials, extra):
        rows = run_campaign(bench, held, profiled, campaign, Progress(f"digits_cnn {label:>24}"))
        result["campaigns"][label] = summarise(rows)
    return result


VARIANT_HEADS = {"traced": "fx trace, no checks", "clip": "clip", "detect_ranges": "detect (ranges)",
                 "detect_ranges_relu": "detect (ranges, through_relu)",
                 "detect": "detect (ranges + checksums)",
                 "detect_relu": "detect (ranges + checksums, through_relu)",
                 "clip_eager": "clip, eager checks", "detect_ranges_eager":
                 "detect (ranges), eager checks", "detect_eager": "detect (+ checksums), eager checks",
                 "plain_compiled": "plain, torch.compile",
                 "detect_ranges_compiled": "detect (ranges), compiled"}  # fmt: skip


def production_table(results: dict) -> str:
    names = [n for n in VARIANT_HEADS if any(n in e["latency"] for r in results.values()
                                             for k, e in r.items() if k.startswith("b"))]  # fmt: skip
    lines = [f"| row | batch | plain ms | {' | '.join(VARIANT_HEADS[n] for n in names)} "
             "| fault-free: equal / flagged |", "|---" * (len(names) + 4) + "|"]  # fmt: skip
    notes: list[str] = []
    for row, res in results.items():
        for key, entry in res.items():
            if not key.startswith("b"):
                continue
            lat = entry["latency"]
            cells = []
            for name in names:
                if name not in lat:
                    cells.append("")
                    continue
                v = lat[name]
                cells.append(f"{100 * (v['ratio'] - 1):+.2f}% ({100 * (v['ratio_min'] - 1):+.1f}"
                             f"..{100 * (v['ratio_max'] - 1):+.1f})")  # fmt: skip
            ff = entry["fault_free"]
            equal = all(v["equal"] for v in ff.values())
            flagged = sum(v["flagged"] for v in ff.values())  # over the detect variants
            lines.append(f"| {row} | {key[1:]} | {lat['plain']['s'] * 1e3:.3f} | "
                         f"{' | '.join(cells)} | {equal} / {flagged} |")  # fmt: skip
            for name, seconds in entry.get("compile_s", {}).items():
                notes.append(f"{row} batch {key[1:]}: first call (compile) of {name} "
                             f"{seconds:.1f} s")  # fmt: skip
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def detection_table(res: dict) -> str:
    fp = res["false_positives"]["rate"]
    rates = " / ".join(f"{fp[k]:.3f}" for k in ("ours", "profiled", "fixed6", "fixed100"))
    lines = [f"digits_cnn: clean accuracy {res['clean_accuracy']:.3f} on the held-out digits; "
             f"false positives ours / profiled / fix6 / fix100 {rates} of "
             f"{res['false_positives']['count']}; "
             f"{len(res['nodes'])} monitored nodes, checksums on {', '.join(res['checksums'])}",
             "", "| faults | trials | SDC rate | detected SDC ours / profiled / fix6 / fix100 |",
             "|---|---|---|---|"]  # fmt: skip
    for label, s in res["campaigns"].items():
        m = s["methods"]
        det = " / ".join(f"{m[k]['detected_sdc']:.3f}" for k in m)
        lines.append(f"| {label} | {s['trials']} | {s['sdc_rate']:.4f} | {det} |")
    return "\n".join(lines) + "\n"


def production(args) -> None:
    """`--production`: the latency table of the production-size models and the mnist/digits
    rows, and the detection campaign of `digits_cnn` (module docstring)."""
    payload = {"threads": 1, "machine": "shared CPU (2 cores, other jobs running)",
               "rounds": args.rounds, "rows": {}, "info": {}}  # fmt: skip
    stem = args.name if args.name != "sdc_campaign" else "sdc_production"
    if (RESULTS / f"{stem}.json").exists():  # a partial rerun replaces only its rows
        import json

        previous = json.loads((RESULTS / f"{stem}.json").read_text())
        fresh = {} if args.plot_only else {k: v for k, v in payload.items()
                                           if k not in ("rows", "info")}  # fmt: skip
        payload = {**previous, **fresh}

    def save() -> None:
        write_json(f"{stem}.json", payload)
        text = production_table(payload["rows"])
        if "digits_cnn" in payload:
            text += "\n" + detection_table(payload["digits_cnn"])
        (RESULTS / f"{stem}.md").write_text(f"# SDC monitors at production size\n\n"
                                            f"{PRODUCTION_NOTES}\n{text}")  # fmt: skip

    if args.plot_only:  # the markdown of the JSON as it is
        return save()

    rows = args.rows.split(",") if args.rows != ",".join(ROWS) else [*PRODUCTION, *ROWS,
                                                                      "digits_cnn"]  # fmt: skip
    for row in rows:
        if row == "digits_cnn":
            payload["digits_cnn"] = detection_row(args.trials, args.extra)
            print(detection_table(payload["digits_cnn"]), flush=True)
        elif row in PRODUCTION:
            bench, info = production_bench(row)
            payload["info"][row] = info
            pool = torch.arange(len(bench.inputs))
            only = set(args.only.split(",")) if args.only else None
            payload["rows"][row] = production_latency(bench, pool, args.rounds, args.calls,
                                                      args.compiled, only)  # fmt: skip
        else:
            bench, _, held = load(row)
            payload["rows"][row] = production_latency(bench, held, args.rounds, 10 * args.calls)
        save()
    print(production_table(payload["rows"]))


def campaigns(trials: int, extra: int) -> list[tuple[str, Campaign]]:
    out = []
    for target in ("weight", "activation"):
        out += [
            (f"{target} bitflip any", Campaign(trials, target, "bitflip", "any")),
            (f"{target} bitflip exponent", Campaign(extra, target, "bitflip", "exponent")),
            (f"{target} value", Campaign(extra, target, "value")),
            (f"{target} exponent-model", Campaign(extra, target, "exponent")),
        ]
    return out


def run_row(row: str, trials: int, extra: int) -> tuple[dict, dict]:
    start = time.perf_counter()
    bench, prof, held = load(row)
    build = time.perf_counter() - start
    profiled = profile_ranges(bench, bench.inputs[prof])
    points, region = fault_free_points(bench, held, 20)
    result = {"build_s": build, "regions": bench.monitor.regions, "nodes": bench.monitor.affine,
              "false_positives": false_positives(bench, profiled, points, region),
              "campaigns": {}}  # fmt: skip
    curves = {}
    for label, campaign in campaigns(trials, extra):
        rows = run_campaign(bench, held, profiled, campaign, Progress(f"{row} {label:>24}"))
        result["campaigns"][label] = summarise(rows)
        if label.endswith("bitflip any"):
            curves[f"{row}: {label}"] = by_bit(rows)
            result["campaigns"][label]["by_bit"] = curves[f"{row}: {label}"]
    result["latency"] = latency(bench, held)
    return result, curves


def table(results: dict) -> str:
    head = (
        "| row | faults | trials | SDC rate | detected SDC ours / profiled / fix6 / fix100 "
        "| FP ours / profiled / fix6 / fix100 | accuracy recovered ours / fix6 / fix100 |"
    )
    lines = [head, "|" + "---|" * 7]
    for row, res in results.items():
        fp = res["false_positives"]["rate"]
        for label, s in res["campaigns"].items():
            m = s["methods"]
            det = " / ".join(f"{m[k]['detected_sdc']:.3f}" for k in m)
            fps = " / ".join(f"{fp[k]:.3f}" for k in m)
            acc = " / ".join(f"{m[k]['accuracy_recovered']:.3f}" for k in
                             ("ours", "fixed6", "fixed100"))  # fmt: skip
            lines.append(f"| {row} | {label} | {s['trials']} | {s['sdc_rate']:.4f} | {det} | "
                         f"{fps} | {acc} |")  # fmt: skip
    lines += ["", "| row | batch | action | plain ms | wrapped ms | overhead (median, min) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for row, res in results.items():
        for key, v in res["latency"].items():
            batch, action, nodes = key.split("_")
            lines.append(f"| {row} | {batch[1:]} | {action} ({nodes}) | {v['plain_s'] * 1e3:.3f} "
                         f"| {v['wrapped_s'] * 1e3:.3f} | {100 * (v['ratio'] - 1):+.2f}% "
                         f"({100 * (v['ratio_min'] - 1):+.2f}%) |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=10000, help="single-bit trials per target")
    parser.add_argument("--extra", type=int, default=2000, help="trials of the other models")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"subset of {','.join(ROWS)}")
    parser.add_argument("--name", default="sdc_campaign", help="results file stem")
    parser.add_argument("--latency-only", action="store_true",
                        help="re-measure the latencies of the rows of an existing JSON")  # fmt: skip
    parser.add_argument("--plot-only", action="store_true", help="re-plot an existing JSON")
    parser.add_argument("--compiled", action="store_true",
                        help="with --latency-only or --production: also the torch.compile "
                        "experiment (batch 256)")  # fmt: skip
    parser.add_argument("--production", action="store_true",
                        help="the production-size table (sdc_production.{json,md})")
    parser.add_argument("--rounds", type=int, default=7, help="--production: timing rounds")
    parser.add_argument("--only", default="", help="--production: the variants to time "
                        "(comma-separated; default all)")  # fmt: skip
    parser.add_argument("--calls", type=int, default=3,
                        help="--production: calls per round at batch 256 (x10 for the small rows)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.production:
        return production(args)
    if args.latency_only:
        return remeasure(args)
    if args.plot_only:
        return replot(args)
    results, curves = {}, {}
    for row in args.rows.split(","):
        results[row], more = run_row(row, args.trials, args.extra)
        curves.update(more)
        print(table({row: results[row]}), flush=True)
        payload = {"trials": args.trials, "extra": args.extra, "threads": 1, "rows": results,
                   "machine": "shared CPU (2 cores, other jobs running)"}  # fmt: skip
        write_json(f"{args.name}.json", payload)  # after every row: a partial run keeps its rows
        text = table(results)
        (RESULTS / f"{args.name}.md").write_text(f"# SDC campaign\n\n{NOTES}\n{text}")
    plot_by_bit(curves, RESULTS / f"{args.name}.png")
    print(text)


def replot(args) -> None:
    """The PNG of a previous run, from the per-bit rates in its JSON."""
    import json

    payload = json.loads((RESULTS / f"{args.name}.json").read_text())
    curves = {
        f"{row}: {label}": {int(b): v for b, v in s["by_bit"].items()}
        for row, res in payload["rows"].items()
        for label, s in res["campaigns"].items()
        if "by_bit" in s
    }
    plot_by_bit(curves, RESULTS / f"{args.name}.png")
    (RESULTS / f"{args.name}.md").write_text(f"# SDC campaign\n\n{NOTES}\n{markdown(payload)}")


def remeasure(args) -> None:
    """Latencies only, written into the JSON and markdown of a previous run."""
    import json

    payload = json.loads((RESULTS / f"{args.name}.json").read_text())
    for row in args.rows.split(","):
        if row in payload["rows"]:
            bench, _, held = load(row)
            payload["rows"][row]["latency"] = latency(bench, held)
            if args.compiled:
                payload["rows"][row]["compiled"] = compiled_latency(bench, held)
                print(compiled_table({row: payload["rows"][row]}), flush=True)
            print(table({row: payload["rows"][row]}), flush=True)
    write_json(f"{args.name}.json", payload)
    (RESULTS / f"{args.name}.md").write_text(f"# SDC campaign\n\n{NOTES}\n{markdown(payload)}")


def markdown(payload: dict) -> str:
    """The tables of a run: the campaign and latencies, and the compile experiment if run."""
    extra = compiled_table(payload["rows"])
    if extra.count("\n") <= 2:
        return table(payload["rows"])
    return f"{table(payload['rows'])}\n{COMPILED_NOTES}\n{extra}"


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
