"""Bias-field instances: 16 inputs in front of an 8-layer CIFAR conv net, the shape of
VNN-COMP 2022's `cifar_biasfield` (whose networks we do not have), through `run-all` with
`--splitting input`, `relu` and `auto`, side by side (a mode can add `+smart`, `+smear` or
`+widest`, the input branching, `+<bound method>` and `+noclip`).

    python -m benchmarks.biasfield --images 12 --limit 30

Each instance multiplies a CIFAR-10 test image by a smooth bias field
`F(u, v) = sum_{i,j<=3} c_ij P_i(u) P_j(v)` (Legendre polynomials on the image square,
`c_00` = 1 nominally), the 16 coefficients being the network's inputs: the first layer is a
`Gemm` (16 -> 3072, the image, the field and the input normalisation folded into it), then
the OVAL `cifar_deep_kw` network (4 conv + 2 fully connected layers, 6,756 ReLUs). The
property: the label stays the top class for `c_00` in [1 - eps, 1 + eps] and the other
coefficients in [-eps, eps].

The instances are written (deterministically) to `--work`; the answers go to
`benchmarks/results/biasfield_<splitting>.csv` and `biasfield.json` (counts, per-instance
rows of each mode, and where auto lost to a fixed mode).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import CIFAR_MEAN, CIFAR_STD, DATA, RESULTS, cifar_images, write_json
from verify.bab.branchers import INPUT_BRANCHINGS
from verify.cli.main import build_parser, run_all
from verify.cli.rows import summary
from verify.io.onnx_loader import load_onnx

NET = DATA / "vnncomp2022" / "oval21" / "onnx" / "cifar_deep_kw.onnx.gz"
DEGREE = 3  # (DEGREE + 1)^2 = 16 coefficients


def legendre_basis(size: int = 32) -> np.ndarray:
    """`[16, size, size]`: P_i(u) P_j(v) on the pixel centres of [-1, 1]^2, i, j <= 3."""
    t = (np.arange(size) + 0.5) / size * 2 - 1
    p = [np.ones_like(t), t, (3 * t**2 - 1) / 2, (5 * t**3 - 3 * t) / 2][: DEGREE + 1]
    return np.stack([np.outer(pu, pv) for pu in p for pv in p])


def biasfield_model(image: np.ndarray) -> onnx.ModelProto:
    """The network of one instance: `Gemm` (coefficients -> normalised perturbed image),
    `Reshape` to `[1, 3, 32, 32]`, then `cifar_deep_kw`."""
    with gzip.open(NET) as f:
        base = onnx.load_model_from_string(f.read())
    basis = legendre_basis()  # [16, 32, 32]
    mean = np.array(CIFAR_MEAN).reshape(3, 1, 1)
    # normalised pixel = (image * F - mean) / std, F = sum_k c_k basis_k
    weight = (image[None] * basis[:, None]) / CIFAR_STD  # [16, 3, 32, 32]
    weight = weight.reshape(len(basis), -1).T.astype(np.float32)  # [3072, 16]
    bias = np.broadcast_to(-mean / CIFAR_STD, image.shape).reshape(-1).astype(np.float32)
    graph = base.graph
    old_input = graph.input[0].name
    inits = [
        numpy_helper.from_array(weight, "biasfield_W"),
        numpy_helper.from_array(bias, "biasfield_b"),
        numpy_helper.from_array(np.array([1, 3, 32, 32], dtype=np.int64), "biasfield_shape"),
    ]
    nodes = [
        helper.make_node(
            "Gemm",
            ["coefficients", "biasfield_W", "biasfield_b"],
            ["biasfield_flat"],
            transB=1,
            name="biasfield_gemm",
        ),
        helper.make_node(
            "Reshape", ["biasfield_flat", "biasfield_shape"], [old_input], name="biasfield_reshape"
        ),
    ]
    new_input = helper.make_tensor_value_info("coefficients", onnx.TensorProto.FLOAT, [1, 16])
    out = helper.make_graph(
        nodes + list(graph.node), "biasfield", [new_input], list(graph.output),
        inits + list(graph.initializer),
    )  # fmt: skip
    model = helper.make_model(out, opset_imports=list(base.opset_import))
    model.ir_version = base.ir_version
    onnx.checker.check_model(model)
    return model


def vnnlib_text(label: int, eps: float, n_out: int = 10) -> str:
    """The property: the unsafe set is some other class scoring at least the label's."""
    lines = [f"(declare-const X_{i} Real)" for i in range(16)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i in range(16):
        centre = 1.0 if i == 0 else 0.0
        lines += [f"(assert (>= X_{i} {centre - eps!r}))", f"(assert (<= X_{i} {centre + eps!r}))"]
    others = " ".join(f"(and (>= Y_{j} Y_{label}))" for j in range(n_out) if j != label)
    lines.append(f"(assert (or {others}))")
    return "\n".join(lines) + "\n"


def write_instances(work: Path, n_images: int, eps_list: list[float], timeout: float) -> Path:
    """Write the networks, properties and `instances.csv` (the correctly classified images
    among the first `n_images`, each at every eps) to `work`."""
    (work / "onnx").mkdir(parents=True, exist_ok=True)
    (work / "vnnlib").mkdir(exist_ok=True)
    images, labels = cifar_images(n_images)
    rows = []
    for k in range(n_images):
        image, label = images[k].numpy().astype(np.float64), int(labels[k])
        net = f"onnx/biasfield_img{k}.onnx"
        onnx.save(biasfield_model(image), str(work / net))
        if _predicted(work / net) != label:
            continue
        for eps in eps_list:
            prop = f"vnnlib/biasfield_img{k}_eps{eps}.vnnlib"
            (work / prop).write_text(vnnlib_text(label, eps))
            rows.append(f"{net},{prop},{timeout:g}")
    (work / "instances.csv").write_text("\n".join(rows) + "\n")
    return work / "instances.csv"


def _predicted(path: Path) -> int:
    """The class the network at `path` gives at the nominal field (c_00 = 1)."""
    net = load_onnx(path)
    x = torch.zeros(1, 16)
    x[0, 0] = 1.0
    with torch.no_grad():
        return int(net(x).argmax())


def mode_argv(mode: str) -> list[str]:
    """The options of a mode: `<splitting>[+<input branching>][+<bound method>][+noclip]`,
    e.g. `input+smart+forward` or `auto+smear+noclip`."""
    splitting, *extras = mode.split("+")
    argv = ["--splitting", splitting]
    for extra in extras:
        if extra == "noclip":
            argv += ["--no-clip"]
        elif extra in INPUT_BRANCHINGS.names():
            argv += ["--input-branching", extra]
        else:
            argv += ["--method", extra]
    return argv


def run_mode(work: Path, csv: Path, mode: str) -> list[dict]:
    argv = [
        "run-all", str(csv), "--root", str(work), "--out",
        str(RESULTS / f"biasfield_{mode.replace('+', '_')}.csv"), *mode_argv(mode),
        "--device", "cpu", "--threads", "1",
    ]  # fmt: skip
    return run_all(build_parser().parse_args(argv))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.02, 0.04])
    parser.add_argument("--limit", type=float, default=30.0, help="seconds per instance")
    parser.add_argument(
        "--modes", nargs="+", default=["input", "relu", "auto"],
        help="splitting modes, each optionally with +<input branching> and +noclip",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "biasfield")
    args = parser.parse_args()
    if not NET.is_file():
        sys.exit(f"the shared network {NET} is absent")
    torch.set_num_threads(1)
    csv = write_instances(args.work, args.images, args.eps, args.limit)
    table: dict[str, list[dict]] = {}
    for mode in args.modes:
        start = time.monotonic()
        table[mode] = run_mode(args.work, csv, mode)
        print(f"--splitting {mode} ({time.monotonic() - start:.0f} s):")
        print(summary(table[mode]))
    solved = {m: sum(r["result"] in ("sat", "unsat") for r in rows) for m, rows in table.items()}
    answers = {m: [r["result"] for r in rows] for m, rows in table.items()}
    contradictions = [
        i for i in range(len(next(iter(answers.values()))))
        if {a[i] for a in answers.values()} >= {"sat", "unsat"}
    ]  # fmt: skip
    print("answered per mode:", solved, "contradictions:", contradictions or "none")
    write_json("biasfield.json", {
        "images": args.images, "eps": args.eps, "limit": args.limit, "threads": 1,
        "answered": solved, "counts": {m: dict(Counter(a)) for m, a in answers.items()},
        "contradictions": contradictions, "rows": table,
    })  # fmt: skip


if __name__ == "__main__":
    main()
