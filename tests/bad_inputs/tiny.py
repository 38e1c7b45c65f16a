"""Tiny files for the command-line cases: a 2-4-2 ReLU network as ONNX and VNN-LIB properties."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

N_IN, N_HIDDEN, N_OUT = 2, 4, 2


def tiny_onnx(path: Path, seed: int = 0, n_in: int = N_IN) -> Path:
    """`x [1, n_in] -> Gemm -> Relu -> Gemm -> y [1, 2]` with seeded weights."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(size=(N_HIDDEN, n_in)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=N_HIDDEN).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(size=(N_OUT, N_HIDDEN)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(size=N_OUT).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu1"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N_OUT])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return path


def tiny_vnnlib(path: Path, n_in: int = N_IN, n_out: int = N_OUT, threshold: float = 1e3) -> Path:
    """Inputs in [-1, 1]; unsafe: `Y_0 >= threshold` (a large threshold holds: unsat)."""
    lines = [f"(declare-const X_{i} Real)" for i in range(n_in)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_out)]
    for i in range(n_in):
        lines += [f"(assert (>= X_{i} -1.0))", f"(assert (<= X_{i} 1.0))"]
    lines.append(f"(assert (>= Y_0 {threshold}))")
    path.write_text("\n".join(lines) + "\n")
    return path
