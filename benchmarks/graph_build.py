"""Does a graph cache pay? Per real network: the time to build its `Graph` from the module, the
time a correct cache key would take (a content hash of every parameter and buffer, the module
tree's repr and training flags: pointers and versions alone gave stale, unsound bounds), and one
CROWN / alpha-CROWN bound through a prebuilt graph.

Run: python benchmarks/graph_build.py   (needs ../shared/data; 1 thread; writes
benchmarks/results/graph_build.{txt,json})
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verify
from benchmarks.common import DATA, RESULTS
from bounds.graph.graph import build_graph

NETS = {
    "acasxu 1_1": "vnncomp2022/acasxu/onnx/ACASXU_run2a_1_1_batch_2000.onnx.gz",
    "mnist_fc 256x6": "vnncomp2022/mnist_fc/onnx/mnist-net_256x6.onnx.gz",
    "oval21 cifar_base_kw": "vnncomp2022/oval21/onnx/cifar_base_kw.onnx.gz",
}


def median_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def content_key(net: torch.nn.Module) -> str:
    """What a cache that cannot go stale on weights would have to hash, at the least."""
    digest = hashlib.blake2b(repr(net).encode())
    digest.update(bytes(m.training for m in net.modules()))
    for tensor in [*net.parameters(), *net.buffers()]:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for name, rel in NETS.items():
        path = DATA / rel
        if not path.exists():
            print(f"skip {name}: {path} absent")
            continue
        net = verify.load_onnx(path)
        shape = tuple(net.input_shape)
        x = torch.rand(1, *shape, generator=torch.Generator().manual_seed(0))
        graph = build_graph(net, shape)
        row = {
            "net": name,
            "build_ms": median_ms(lambda net=net, shape=shape: build_graph(net, shape)),
            "content_key_ms": median_ms(lambda net=net: content_key(net)),
            "crown_ms": median_ms(
                lambda g=graph, x=x: verify.bounds(g, 0.001, x=x, method="crown")
            ),
            "alpha_crown_ms": median_ms(
                lambda g=graph, x=x: verify.bounds(g, 0.001, x=x, method="alpha-crown"), 5
            ),
        }
        row["build_share_of_crown"] = row["build_ms"] / (row["build_ms"] + row["crown_ms"])
        rows.append(row)
    header = f"{'net':<22} {'build ms':>9} {'key ms':>7} {'crown ms':>9} {'a-crown ms':>11} {'build/(build+crown)':>20}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{r['net']:<22} {r['build_ms']:>9.2f} {r['content_key_ms']:>7.2f} "
            f"{r['crown_ms']:>9.2f} {r['alpha_crown_ms']:>11.1f} {r['build_share_of_crown']:>20.2f}"
        )
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "graph_build.txt").write_text(text + "\n")
    (RESULTS / "graph_build.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
