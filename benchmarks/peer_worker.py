"""The auto_LiRPA side of `benchmarks/peer_bounds.py`, run by the peer's own venv python.

It imports nothing from this toolkit (its venv has auto_LiRPA, torch, onnx and onnxruntime only).
Usage: PEER_PYTHON benchmarks/peer_worker.py JOB.pt RESULT.pt, where JOB.pt (written by
peer_bounds.py with `torch.save`) holds `{"threads", "lr", "decay", "iterations", "instances":
[{"net": onnx path, "problems": [(lower, upper, C), ...]}, ...]}` and RESULT.pt gets, per
instance and problem, the peer's alpha-CROWN lower bounds of `C y` and its seconds for the lower
side alone and for both sides (auto_LiRPA optimises each side separately).

The ONNX net becomes a `torch.nn.Sequential` (Sub/Add of a constant, Flatten, Reshape, MatMul+Add,
Gemm, Relu, Conv), checked against onnxruntime on 64 points of the first box (max abs error
printed and returned; over 1e-4 relative is an error).

A job with `"kind": "timing"` (written by benchmarks/conv_bounds.py) instead times each of
`job["methods"]` (auto_LiRPA names: "CROWN", "CROWN-Optimized") `job["repeats"][method]` times
after one warm-up per instance, lower side alone and both sides, and returns per instance and
method the minimum seconds of each and the lower bounds of `C y`.
"""

from __future__ import annotations

import gzip
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from torch import nn


class Shift(nn.Module):
    """`x + c` for a constant `c` (ONNX Add/Sub of an initializer)."""

    def __init__(self, c: np.ndarray):
        super().__init__()
        self.register_buffer("c", torch.tensor(c, dtype=torch.float32))

    def forward(self, x):
        return x + self.c


class Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape = tuple(int(s) for s in shape)

    def forward(self, x):
        return x.reshape(x.shape[0], *self.shape[1:])


def _model_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def convert(model: onnx.ModelProto) -> nn.Sequential:
    """A chain ONNX graph as `nn.Sequential`; raises ValueError on anything else."""
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
    layers: list[nn.Module] = []
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    i = 0
    while i < len(nodes):
        node, attrs = nodes[i], _attrs(nodes[i])
        op = node.op_type
        if (
            op in ("Add", "Sub")
            and layers
            and isinstance(layers[-1], nn.Linear)
            and (node.input[1] in consts)
            and getattr(layers[-1], "_pending_bias", False)
        ):
            c = consts[node.input[1]].reshape(-1)
            layers[-1].bias.data = torch.tensor(c if op == "Add" else -c, dtype=torch.float32)
            layers[-1]._pending_bias = False
        elif op in ("Add", "Sub"):
            const = next(x for x in node.input if x in consts)
            c = consts[const]
            if op == "Sub" and node.input[0] in consts:
                raise ValueError("Sub of a variable from a constant is not handled")
            layers.append(Shift(c if op == "Add" else -c))
        elif op == "Flatten":
            axis = attrs.get("axis", 1)
            if axis != 1:
                raise ValueError(f"Flatten axis {axis}")
            layers.append(nn.Flatten())
        elif op == "Reshape":
            layers.append(Reshape(tuple(consts[node.input[1]])))
        elif op == "MatMul":
            W = consts[node.input[1]]  # y = x W
            lin = nn.Linear(W.shape[0], W.shape[1])
            lin.weight.data = torch.tensor(W.T.copy(), dtype=torch.float32)
            lin.bias.data.zero_()
            lin._pending_bias = True
            layers.append(lin)
        elif op == "Gemm":
            W = consts[node.input[1]]
            if attrs.get("transA", 0):
                raise ValueError("Gemm transA")
            W = W if attrs.get("transB", 0) else W.T
            W = W * attrs.get("alpha", 1.0)
            lin = nn.Linear(W.shape[1], W.shape[0])
            lin.weight.data = torch.tensor(W.copy(), dtype=torch.float32)
            B = consts[node.input[2]] * attrs.get("beta", 1.0) if len(node.input) > 2 else 0
            lin.bias.data = torch.tensor(
                np.broadcast_to(B, (W.shape[0],)).copy(), dtype=torch.float32
            )
            layers.append(lin)
        elif op == "Relu":
            layers.append(nn.ReLU())
        elif op == "Conv":
            W = consts[node.input[1]]
            pads = attrs.get("pads", [0, 0, 0, 0])
            if pads[0] != pads[2] or pads[1] != pads[3]:
                raise ValueError("asymmetric Conv pads")
            conv = nn.Conv2d(W.shape[1] * attrs.get("group", 1), W.shape[0], W.shape[2:],
                             stride=tuple(attrs.get("strides", [1, 1])), padding=tuple(pads[:2]),
                             dilation=tuple(attrs.get("dilations", [1, 1])),
                             groups=attrs.get("group", 1), bias=len(node.input) > 2)  # fmt: skip
            conv.weight.data = torch.tensor(W, dtype=torch.float32)
            if len(node.input) > 2:
                conv.bias.data = torch.tensor(consts[node.input[2]], dtype=torch.float32)
            layers.append(conv)
        else:
            raise ValueError(f"unsupported ONNX op {op}")
        i += 1
    for layer in layers:
        if hasattr(layer, "_pending_bias"):
            del layer._pending_bias
    return nn.Sequential(*layers).eval()


def check(model: onnx.ModelProto, net: nn.Module, lower: torch.Tensor, upper: torch.Tensor):
    """Max abs difference to onnxruntime on 64 points of the box (inputs in the ONNX shape)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [
        i for i in sess.get_inputs() if i.name not in {t.name for t in model.graph.initializer}
    ]
    shape = [d if isinstance(d, int) else 1 for d in inputs[0].shape]
    gen = torch.Generator().manual_seed(0)
    worst, scale = 0.0, 0.0
    for _ in range(64):
        x = lower + (upper - lower) * torch.rand(lower.shape, generator=gen)
        ref = sess.run(None, {inputs[0].name: x.reshape(shape).numpy()})[0].reshape(-1)
        with torch.no_grad():
            ours = net(x).reshape(-1).numpy()
        worst = max(worst, float(np.abs(ours - ref).max()))
        scale = max(scale, float(np.abs(ref).max()))
    if worst > 1e-4 * max(1.0, scale):
        raise ValueError(f"conversion differs from onnxruntime by {worst}")
    return worst


def _timing(job: dict, opts: dict) -> list:
    """See the module docstring (`"kind": "timing"`)."""
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm

    results = []
    for inst in job["instances"]:
        model = onnx.load_from_string(_model_bytes(inst["net"]))
        net = convert(model)
        lower, upper, C = inst["problem"]
        err = check(model, net, lower, upper)
        bounded = BoundedModule(net, torch.zeros_like(lower), bound_opts=opts, device="cpu")
        x = BoundedTensor((lower + upper) / 2, PerturbationLpNorm(x_L=lower, x_U=upper))
        out = {"conversion_error": err}
        for method in job["methods"]:

            def run(upper_too: bool, method=method, x=x, C=C, bounded=bounded):
                return bounded.compute_bounds(x=(x,), C=C, method=method, bound_lower=True,
                                              bound_upper=upper_too)  # fmt: skip

            run(True)  # warm-up: lazy initialisation
            lower_s, both_s = [], []
            for _ in range(job["repeats"][method]):
                start = time.perf_counter()
                lb, _ = run(False)
                lower_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                run(True)
                both_s.append(time.perf_counter() - start)
            out[method] = {"lower": lb.detach().reshape(-1), "lower_s": min(lower_s),
                           "both_s": min(both_s)}  # fmt: skip
        results.append(out)
    return results


def main() -> None:
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm

    job = torch.load(sys.argv[1])
    torch.set_num_threads(job["threads"])
    opts = {"optimize_bound_args": {"iteration": job["iterations"], "lr_alpha": job["lr"],
                                    "lr_decay": job["decay"]}, "verbosity": 0}  # fmt: skip
    if job.get("kind") == "timing":
        torch.save(_timing(job, opts), sys.argv[2])
        return
    modules: dict[str, tuple] = {}
    results, warmed = [], False
    for inst in job["instances"]:
        if inst["net"] not in modules:
            model = onnx.load_from_string(_model_bytes(inst["net"]))
            net = convert(model)
            lower0, upper0, _ = inst["problems"][0]
            err = check(model, net, lower0, upper0)
            start = time.perf_counter()
            bounded = BoundedModule(net, torch.zeros_like(lower0), bound_opts=opts, device="cpu")
            modules[inst["net"]] = (bounded, err, time.perf_counter() - start)
        bounded, err, build = modules[inst["net"]]
        out = []
        for lower, upper, C in inst["problems"]:
            x = BoundedTensor((lower + upper) / 2, PerturbationLpNorm(x_L=lower, x_U=upper))

            def run(upper_too: bool, bounded=bounded, x=x, C=C):
                return bounded.compute_bounds(x=(x,), C=C, method="CROWN-Optimized",
                                              bound_lower=True, bound_upper=upper_too)  # fmt: skip

            if not warmed:  # the first call pays for lazy initialisation
                run(False)
                warmed = True
            start = time.perf_counter()
            lb, _ = run(False)
            lower_s = time.perf_counter() - start
            start = time.perf_counter()
            run(True)
            both_s = time.perf_counter() - start
            out.append({"lower": lb.detach().reshape(-1), "lower_s": lower_s, "both_s": both_s})
        results.append({"problems": out, "conversion_error": err, "build_s": build})
    torch.save(results, sys.argv[2])


if __name__ == "__main__":
    main()
