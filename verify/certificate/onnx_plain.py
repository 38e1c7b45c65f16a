"""The checker's own ONNX reader: a chain of affine layers and ReLUs (`crown64.Layer`), read with
the `onnx` protobuf parser and numpy only, in the exact real semantics of the stored weights.

Supported operators (enough for VNN-COMP 2022 ACAS Xu and mnist_fc): `MatMul` and `Gemm` with a
constant weight, `Add` and `Sub` of a constant, `Relu`, `Flatten`, `Reshape`, `Identity` and
`Constant`. Activations are flat vectors (batch 1, row-major). No weights are multiplied
together: each operator is a layer of its own (an `Add` is folded into the previous layer's zero
bias, exactly), so the chain computes exactly what the file says over the reals; anything else
(e.g. `Div`, whose folding would round) is rejected with `UnsupportedModelError`."""

from __future__ import annotations

import gzip
import os

import numpy as np
import onnx
from onnx import numpy_helper

from verify.certificate.crown64 import Layer


class UnsupportedModelError(ValueError):
    """The ONNX file uses an operator or form the checker does not read."""


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes (those hashed), and its content (gunzipped for `.gz`)."""
    with open(path, "rb") as f:
        return f.read()


def model_of(data: bytes) -> onnx.ModelProto:
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return onnx.load_model_from_string(data)


def constants_of(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    consts = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            value = next(a for a in node.attribute if a.name == "value")
            consts[node.output[0]] = numpy_helper.to_array(value.t).astype(np.float64)
    return consts


def _attr(node: onnx.NodeProto, name: str, default: float) -> float:
    for a in node.attribute:
        if a.name == name:
            return a.f if a.type == onnx.AttributeProto.FLOAT else a.i
    return default


class Chain:
    """The layers read so far and the size of the current value."""

    def __init__(self, n: int) -> None:
        self.layers: list[Layer] = []
        self.n = n

    def push(self, w: np.ndarray, c: np.ndarray, relu: bool = False) -> None:
        self.layers.append((w, c, relu))
        self.n = w.shape[0]

    def bias(self, const: np.ndarray, sign: float) -> None:
        """Add `sign * const` (broadcast): folded into a zero bias, else a layer of its own.
        Only a scalar or a constant of shape `(1, ..., 1, n)` (elementwise on the flat value)."""
        if const.size > 1 and (const.size != self.n or any(d != 1 for d in const.shape[:-1])):
            raise UnsupportedModelError(f"a constant of shape {const.shape} on {self.n} values")
        c = sign * np.broadcast_to(const.reshape(-1) if const.size > 1 else const, (self.n,))
        last = self.layers[-1] if self.layers else None
        if last is not None and not last[2] and not last[1].any():
            self.layers[-1] = (last[0], c.copy(), False)
        else:
            self.push(np.eye(self.n), c.copy())

    def relu(self) -> None:
        if not self.layers or self.layers[-1][2]:
            self.push(np.eye(self.n), np.zeros(self.n))
        w, c, _ = self.layers[-1]
        self.layers[-1] = (w, c, True)


def _apply(chain: Chain, node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> None:
    op, const = node.op_type, [consts[i] for i in node.input if i in consts]
    if op == "MatMul" and node.input[1] in consts:
        chain.push(const[0].T.copy(), np.zeros(const[0].shape[1]))
    elif op == "Gemm" and node.input[1] in consts:
        if _attr(node, "transA", 0):
            raise UnsupportedModelError("Gemm with transA")
        w = const[0] if _attr(node, "transB", 0) else const[0].T
        alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
        if alpha != 1.0 or beta != 1.0:
            raise UnsupportedModelError("Gemm with alpha or beta other than 1")
        chain.push(w.copy(), np.zeros(w.shape[0]))
        if len(const) > 1:
            chain.bias(const[1], 1.0)
    elif op in ("Add", "Sub") and len(const) == 1 and len(node.input) == 2:
        if op == "Sub" and node.input[0] in consts:  # const - x
            chain.push(-np.eye(chain.n), np.zeros(chain.n))
            chain.bias(const[0], 1.0)
        else:
            chain.bias(const[0], -1.0 if op == "Sub" else 1.0)
    elif op == "Relu":
        chain.relu()
    elif op not in ("Flatten", "Reshape", "Identity"):
        raise UnsupportedModelError(f"operator {op} ({node.name}) is not read by the checker")


def read_network(data: bytes) -> tuple[list[Layer], int]:
    """The chain of layers of an ONNX model (bytes, gzip or not) and its number of inputs."""
    graph = model_of(data).graph
    consts = constants_of(graph)
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1:
        raise UnsupportedModelError(f"expected one input, got {len(inputs)}")
    dims = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim]
    n_in = int(np.prod([d for d in dims if d > 0]))
    chain, current = Chain(n_in), inputs[0].name
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        if current not in node.input:
            raise UnsupportedModelError(f"node {node.name} ({node.op_type}) is not on the chain")
        _apply(chain, node, consts)
        current = node.output[0]
    if current != graph.output[0].name:
        raise UnsupportedModelError("the graph's output is not the end of the chain")
    if not chain.layers or chain.layers[-1][2]:
        chain.push(np.eye(chain.n), np.zeros(chain.n))
    return chain.layers, n_in
