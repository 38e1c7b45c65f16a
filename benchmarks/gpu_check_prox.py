"""Check and time the proximal block-step kernels (kernels/prox_relu_block.py) on one device.

One middle block step of the proximal method (Bunel, De Palma et al., UAI 2020, Sec. 4.2) at an
OVAL cifar_wide-like size: a 32x16x16 = 8192-neuron conv layer on both sides of a 3x3 conv,
1024 domains x 1 spec, float32, random tensors. First the Triton kernels are checked against
the reference (element by element where they should be exact; the sums to float32 tolerance);
then the reference (eager), torch.compile(reference) and the Triton kernels are timed per pass
and for the whole elementwise step (the affine maps replaced by fixed tensors), plus the step
with the conv and its transpose (time only). Achieved bandwidth = the bytes each pass must read
and write once / time, against a measured device-to-device copy. On CUDA the time is that of a
CUDA graph replay (no launch overhead; `ms_launch` is the plain loop). The target on the GPU:
the Triton step at >= 60% of copy bandwidth.

    python -m benchmarks.gpu_check_prox            # CUDA
    python -m benchmarks.gpu_check_prox --smoke    # CPU: tiny size, reference + interpreter
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

if not torch.cuda.is_available():  # the interpreter must be chosen before kernels are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import backend
from kernels import prox_relu_reference as KR
from kernels import prox_relu_triton as KT

FULL = {"batch": 1024, "specs": 1, "channels": 32, "side": 16, "iters": 30, "copy_mib": 1024}
SMOKE = {"batch": 3, "specs": 2, "channels": 2, "side": 5, "iters": 1, "copy_mib": 4}
TARGET = 0.6  # of copy bandwidth, for the whole elementwise step on the GPU


def make_inputs(size: dict, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """Random state of one middle block: layer j-1 (`*_in`) and layer j (`*_out`), same shape."""
    gen = torch.Generator(device=device).manual_seed(seed)
    full = (size["batch"], size["specs"], size["channels"], size["side"], size["side"])

    def randn(*shape: int) -> Tensor:
        return torch.randn(shape, generator=gen, device=device)

    def rand(*shape: int) -> Tensor:
        return torch.rand(shape, generator=gen, device=device)

    names = ["anchor_in", "xhB", "xhA_in", "g", "anchor_out", "xhB_out", "xhA_out", "xhA_cg"]
    t = {name: randn(*full) for name in names}
    t["eta_in"] = rand(*full[:2]) + 0.5
    t["eta_out"] = rand(*full[:2]) + 0.5
    t["lower"] = randn(full[0], *full[2:]) - 0.3
    t["upper"] = t["lower"] + 2 * rand(full[0], *full[2:])
    channels = size["channels"]
    t["weight"] = randn(channels, channels, 3, 3) / (3 * channels**0.5)
    t["bias"] = randn(channels) * 0.1
    return t


def _oracle_args(t: dict[str, Tensor]) -> tuple[Tensor, ...]:
    return t["anchor_in"], t["xhB"], t["xhA_in"], t["eta_in"], t["g"], t["lower"], t["upper"]


def _neg_rho_args(t: dict[str, Tensor]) -> tuple[Tensor, ...]:
    return t["anchor_out"], t["xhB_out"], t["xhA_out"], t["eta_out"]


def _update_args(t: dict[str, Tensor], oracle: tuple[Tensor, ...], coeff: Tensor) -> tuple:
    xhB_cg, _, num_b, den_b = oracle
    return coeff, t["xhA_out"], t["xhA_cg"], t["eta_out"], t["xhB"], xhB_cg, num_b, den_b


def implementations(compiled: bool) -> dict[str, tuple[Callable, Callable, Callable]]:
    """`impl -> (neg_rho, oracle, update)` with the positional arguments of the references."""
    impls = {
        "reference": (
            KR.prox_neg_rho_reference,
            KR.prox_relu_oracle_reference,
            KR.prox_block_update_reference,
        ),
        "triton": (KT.prox_neg_rho_triton, KT.prox_relu_oracle_triton, KT.prox_block_update_triton),
    }
    if compiled:
        impls["compiled"] = tuple(torch.compile(f, dynamic=False) for f in impls["reference"])
    return impls


def _conv_step(impl, t: dict[str, Tensor]) -> tuple[Tensor, ...]:
    """The whole block step: `g = W^T coeff` and `xhA_cg = W x_cg + b` by a 3x3 conv."""
    neg_rho, oracle, update = impl
    lead, shape = t["xhB"].shape[:2], t["xhB"].shape[2:]
    coeff = neg_rho(*_neg_rho_args(t))
    g = F.conv_transpose2d(coeff.flatten(0, 1), t["weight"], padding=1).view(*lead, *shape)
    cg = oracle(t["anchor_in"], t["xhB"], t["xhA_in"], t["eta_in"], g, t["lower"], t["upper"])
    xhA_cg = F.conv2d(cg[1].flatten(0, 1), t["weight"], t["bias"], padding=1).view(*lead, *shape)
    return update(coeff, t["xhA_out"], xhA_cg, t["eta_out"], t["xhB"], cg[0], cg[2], cg[3])


def _elementwise_step(impl, t: dict[str, Tensor]) -> tuple[Tensor, ...]:
    neg_rho, oracle, update = impl
    coeff = neg_rho(*_neg_rho_args(t))
    return update(*_update_args(t, oracle(*_oracle_args(t)), coeff))


def traffic(t: dict[str, Tensor]) -> dict[str, int]:
    """Bytes each pass must read and write once (lower/upper once per domain)."""
    e, (batch, specs), n = t["xhB"].element_size(), t["xhB"].shape[:2], t["xhB"][0, 0].numel()
    problems = batch * specs
    passes = {
        "neg_rho": e * (4 * problems * n + problems),
        "oracle": e * (6 * problems * n + 2 * batch * n + 3 * problems),
        "update": e * (7 * problems * n + 4 * problems),  # n_in = n_out = n
    }
    return passes | {"step": sum(passes.values())}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop_ms(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return 1e3 * (time.perf_counter() - start) / iters


def _graph_ms(fn: Callable[[], object], iters: int) -> float | None:
    """Mean time of a CUDA graph replay of `fn` (None when the capture fails)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def time_case(fn: Callable[[], object], iters: int, device: torch.device) -> dict[str, float]:
    """`ms` (graph replay on CUDA, else the loop) and `ms_launch` (the plain loop)."""
    for _ in range(2 if device.type == "cuda" else 1):
        fn()  # compile / warm the allocator
    launch = _loop_ms(fn, iters, device)
    graph = _graph_ms(fn, iters) if device.type == "cuda" else None
    return {"ms": launch if graph is None else graph, "ms_launch": launch}


def copy_bandwidth(size: dict, device: torch.device) -> dict:
    """Device-to-device copy of a large float32 tensor (bytes read + written)."""
    src = torch.empty(size["copy_mib"] * 2**18, device=device).uniform_()
    dst = torch.empty_like(src)
    timing = time_case(lambda: dst.copy_(src), size["iters"], device)
    gbs = 2 * src.numel() * src.element_size() / (timing["ms"] * 1e6)
    return {"case": "copy", "impl": "torch", **timing, "GB/s": gbs, "copy_frac": 1.0}


def check(t: dict[str, Tensor]) -> list[dict]:
    """Triton vs reference on the benchmark inputs."""
    rows = []
    ref_coeff = KR.prox_neg_rho_reference(*_neg_rho_args(t))
    got_coeff = KT.prox_neg_rho_triton(*_neg_rho_args(t))
    ref = KR.prox_relu_oracle_reference(*_oracle_args(t))
    got = KT.prox_relu_oracle_triton(*_oracle_args(t))
    exact = {"neg_rho": (got_coeff, ref_coeff), "oracle xhB_cg": (got[0], ref[0])}
    exact["oracle x_cg"] = (got[1], ref[1])
    for case, (a, b) in exact.items():
        mismatches = int((a != b).sum())
        rows.append({"case": f"check {case}", "mismatches": mismatches, "ok": mismatches == 0})
    update_args = _update_args(t, ref, ref_coeff)
    close = {"oracle sums": (got[2:], ref[2:])}
    close["update"] = (KT.prox_block_update_triton(*update_args), KR.prox_block_update_reference(*update_args))  # fmt: skip
    for case, (a, b) in close.items():
        err = max(float((x - y).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b))
        scale = max(float(y.abs().max()) if y.numel() else 0.0 for y in b)
        rows.append({"case": f"check {case}", "max_abs_err": err, "ok": err <= 1e-4 * (1 + scale)})
    return rows


def _cases(impl, t: dict[str, Tensor]) -> dict[str, Callable[[], object]]:
    neg_rho, oracle, update = impl
    oracle_out = KR.prox_relu_oracle_reference(*_oracle_args(t))
    coeff = KR.prox_neg_rho_reference(*_neg_rho_args(t))
    return {
        "neg_rho": lambda: neg_rho(*_neg_rho_args(t)),
        "oracle": lambda: oracle(*_oracle_args(t)),
        "update": lambda: update(*_update_args(t, oracle_out, coeff)),
        "step": lambda: _elementwise_step(impl, t),
        "step+conv": lambda: _conv_step(impl, t),
    }


def run(device: str | torch.device = "cuda", *, smoke: bool = False) -> list[dict]:
    """Rows: the checks (`ok`), the copy bandwidth, then one row per (case, implementation)
    with `ms`, `ms_launch`, `GB/s` and `copy_frac` (bandwidth / copy bandwidth)."""
    device = torch.device(device)
    if device.type == "cpu" and not backend.INTERPRET:
        raise RuntimeError("on CPU the kernels need TRITON_INTERPRET=1 before kernels is imported")
    size = SMOKE if smoke else FULL
    t = make_inputs(size, device)
    rows = check(t)
    copy = copy_bandwidth(size, device)
    rows.append(copy)
    bytes_per_case = traffic(t)
    for name, impl in implementations(compiled=not smoke).items():
        for case, fn in _cases(impl, t).items():
            timing = time_case(fn, size["iters"], device)
            row = {"case": case, "impl": name, **timing}
            if case in bytes_per_case:
                row["GB/s"] = bytes_per_case[case] / (timing["ms"] * 1e6)
                row["copy_frac"] = row["GB/s"] / copy["GB/s"]
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    columns = ["case", "impl", "ms", "ms_launch", "GB/s", "copy_frac", "mismatches", "max_abs_err", "ok"]  # fmt: skip
    lines = [" | ".join(f"{c:>11}" for c in columns)]
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c, "")
            cells.append(f"{value:>11.4g}" if isinstance(value, float) else f"{value!s:>11}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny size on CPU (interpreter)")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    args = parser.parse_args()
    device = args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    rows = run(device, smoke=args.smoke or device == "cpu")  # full size only on a GPU
    print(format_table(rows))
    if torch.device(device).type != "cuda":
        print("CPU smoke run (interpreter): the timings say nothing about the GPU target")
        return
    step = next(r for r in rows if r.get("case") == "step" and r.get("impl") == "triton")
    verdict = "met" if step["copy_frac"] >= TARGET else "NOT met"
    print(
        f"Triton step: {step['copy_frac']:.0%} of copy bandwidth (target {TARGET:.0%}: {verdict})"
    )


if __name__ == "__main__":
    main()
