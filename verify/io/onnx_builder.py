"""The fx graph under construction for `verify.io.onnx_loader`: `Traced` values (an fx node, its
batch-1 example and whether ONNX's axis 0 is our batch axis) and the `GraphBuilder` that emits
nodes, registers weights and converts between the batched and unbatched forms (see
`verify.io.onnx_ops` for the conventions). Also `broadcast_operands`, the alignment of ONNX
(numpy) broadcasting onto our batch-first tensors.
"""

from __future__ import annotations

import builtins
import keyword
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from torch import fx, nn

from verify.io.onnx_checks import mismatch, unsupported

# Attribute names of the returned GraphModule that submodules and buffers must not take.
_RESERVED = frozenset(dir(nn.Module())) | {
    "meta",
    "input_shape",
    "output_shape",
    "source_path",
    "self",
    *keyword.kwlist,
    *keyword.softkwlist,
    *dir(builtins),  # and the globals of fx's generated code:
    *("torch", "operator", "math", "fx_pytree", "pytree", "device", "inf", "nan", "typing"),
}


@dataclass
class Traced:
    """An fx node, its batch-1 example value `[1, *per-sample shape]` and whether the ONNX
    tensor's axis 0 is our batch axis (`batched`, see the module docstring)."""

    node: fx.Node
    example: torch.Tensor
    batched: bool = True

    @property
    def shape(self) -> tuple[int, ...]:
        """The ONNX shape (batch 1)."""
        return tuple(self.example.shape) if self.batched else tuple(self.example.shape[1:])

    def axis(self, onnx_axis: int) -> int:
        """Our (torch) axis of the non-negative ONNX axis `onnx_axis`."""
        return onnx_axis if self.batched else onnx_axis + 1


Value = Any  # Traced (depends on the network input) or np.ndarray (a constant)


def as_param(array: np.ndarray) -> nn.Parameter:
    tensor = torch.tensor(np.ascontiguousarray(array, dtype=np.float32))
    return nn.Parameter(tensor, requires_grad=False)


class GraphBuilder:
    """Accumulates the fx graph, its submodules and buffers, and the ONNX value environment."""

    def __init__(self, uses: dict[str, int]) -> None:
        self.root = nn.Module()
        self.graph = fx.Graph()
        self.env: dict[str, Value] = {}
        self.uses = uses
        self.elements = 0  # elements of all activation examples so far (batch 1)
        self._taken: set[str] = set()
        self._suffix: dict[str, int] = {}  # next suffix to try per base name

    def fresh_name(self, hint: str) -> str:
        """An ASCII Python identifier from `hint` (ONNX names may hold any character)."""
        base = re.sub(r"[^0-9a-z_]", "_", hint.lower()).strip("_") or "node"
        base = base if base[0].isalpha() else f"n_{base}"
        name, k = base, self._suffix.get(base, 1)
        while name in self._taken or name in _RESERVED or hasattr(fx.GraphModule, name):
            name, k = f"{base}_{k}", k + 1
        self._taken.add(name)
        self._suffix[base] = k
        return name

    def placeholder(self, hint: str, shape: tuple[int, ...], batched: bool = True) -> Traced:
        """The network input of ONNX shape `shape` (batch 1 when `batched`)."""
        self.elements += int(np.prod(shape))
        example = torch.zeros(shape if batched else (1, *shape))
        self.input = Traced(self.graph.placeholder(self.fresh_name(hint)), example, batched)
        self._batch_size: fx.Node | None = None
        return self.input

    def module(self, hint: str, module: nn.Module, x: Traced) -> Traced:
        """`module(x)`, keeping `x`'s batched flag."""
        module.eval().requires_grad_(False)
        name = self.fresh_name(hint)
        self.root.add_module(name, module)
        with torch.no_grad():
            example = module(x.example)
        return Traced(self.graph.call_module(name, (x.node,)), example, x.batched)

    def buffer(self, hint: str, array: np.ndarray, dtype: Any = np.float32) -> Traced:
        """A constant tensor (float32 unless `dtype`: int64 indices, bool masks)."""
        name = self.fresh_name(hint)
        tensor = torch.tensor(np.ascontiguousarray(array, dtype=dtype))
        self.root.register_buffer(name, tensor)
        return Traced(self.graph.get_attr(name), tensor)

    def function(
        self, fn: Callable[..., torch.Tensor], *args: Any, batched: bool = True,
        hint: str | None = None,
    ) -> Traced:  # fmt: skip
        """`fn(*args)` (Traced arguments by their node), a value held `batched` or not; `hint`:
        the fx node's name (from the ONNX node's, so errors at graph build name it)."""
        fx_args = fx.node.map_aggregate(args, lambda a: a.node if isinstance(a, Traced) else a)
        examples = fx.node.map_aggregate(args, lambda a: a.example if isinstance(a, Traced) else a)
        with torch.no_grad():
            example = fn(*examples)
        name = None if hint is None else self.fresh_name(hint)
        node = self.graph.create_node("call_function", fn, tuple(fx_args), {}, name=name)
        return Traced(node, example, batched)

    def expand(self, x: Traced, per_sample: tuple[int, ...]) -> Traced:
        """`x.expand(-1, *per_sample)` (same rank; our batch axis kept)."""
        node = self.graph.call_method("expand", (x.node, -1, *per_sample))
        return Traced(node, x.example.expand(-1, *per_sample), x.batched)

    def batch_size(self) -> fx.Node:
        """The fx node of the batch size (`input.shape[0]`), created once."""
        if self._batch_size is None:
            shape = self.graph.call_function(getattr, (self.input.node, "shape"))
            self._batch_size = self.graph.call_function(operator.getitem, (shape, 0))
        return self._batch_size

    def batch_constant(self, hint: str, per_sample: np.ndarray) -> Traced:
        """A constant repeated over our batch axis: `[N, *per_sample.shape]` (for torch.cat,
        which does not broadcast). Its flag is meaningless: it is never bound to an ONNX name."""
        buf = self.buffer(hint, np.asarray(per_sample)[None])
        node = self.graph.call_method(
            "expand", (buf.node, self.batch_size(), *[-1] * per_sample.ndim)
        )
        return Traced(node, buf.example)

    def reshape(self, x: Traced, shape: tuple[int, ...], node: onnx.NodeProto) -> Traced:
        """`x` as an ONNX tensor of (batch-1) shape `shape`, same elements in order: batched when
        `shape` has rank >= 2 and starts with 1, else unbatched. No fx node when nothing moves."""
        shape = tuple(int(d) for d in shape)
        if not shape:
            raise unsupported(node, "its result is a rank-0 (scalar) activation")
        batched = len(shape) >= 2 and shape[0] == 1
        per_sample = shape[1:] if batched else shape
        if tuple(x.example.shape[1:]) == per_sample:
            return x if x.batched == batched else Traced(x.node, x.example, batched)
        return self.function(torch.reshape, x, (-1, *per_sample), batched=batched)

    def unbatched(self, x: Traced) -> Traced:
        """`x` with our batch axis in front of all ONNX axes."""
        if not x.batched:
            return x
        return self.function(torch.reshape, x, (-1, *x.shape), batched=False)

    def batched(self, x: Traced, node: onnx.NodeProto) -> Traced:
        """`x` with ONNX's axis 0 (of size 1) as our batch axis; refused when axis 0 is larger."""
        if x.batched:
            return x
        if len(x.shape) < 2 or x.shape[0] != 1:
            raise unsupported(
                node, f"input of shape {list(x.shape)}: it needs axis 0 to be a batch of 1"
            )
        return self.reshape(x, x.shape, node)

    def same_rank(self, x: Traced, rank: int, node: onnx.NodeProto) -> Traced:
        """`x` with leading size-1 ONNX axes up to `rank` (numpy broadcasting's alignment)."""
        if len(x.shape) >= rank:
            return x
        return self.reshape(x, (1,) * (rank - len(x.shape)) + x.shape, node)


def broadcast_operands(
    b: GraphBuilder, node: onnx.NodeProto, values: list[Value]
) -> tuple[list[Value], bool, tuple[int, ...]]:
    """Activations and constants aligned for torch broadcasting on our batch-first tensors:
    `(values, batched, result ONNX shape)`. Activations get the result's rank and one common
    representation; constants lose the leading axes our tensors do not have."""
    shapes = [v.shape if isinstance(v, Traced) else np.shape(v) for v in values]
    try:
        result = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError as err:
        described = ", ".join(f"{n!r} {tuple(s)}" for n, s in zip(node.input, shapes))
        raise mismatch(node, f"operands {described} do not broadcast") from err
    acts = [b.same_rank(v, len(result), node) if isinstance(v, Traced) else v for v in values]
    batched = all(v.batched for v in acts if isinstance(v, Traced)) and result[0] == 1
    if len(result) < 2:
        batched = False
    out = []
    for v in acts:
        if isinstance(v, Traced):
            out.append(
                v
                if v.batched == batched
                else (b.unbatched(v) if not batched else b.batched(v, node))
            )
        else:
            dims = list(np.shape(v))
            keep = len(result) - 1 if batched else len(result)
            while len(dims) > keep:
                dims.pop(0)  # a leading axis of size 1 (the result's batch axis or padding)
            out.append(np.reshape(v, dims))
    return out, batched, result
