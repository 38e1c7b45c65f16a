"""A feed-forward chain of affine blocks and activations, the form Lagrangian decomposition
works on: `xh_k = W_k x_{k-1} + b_k` (k = 1..n), `x_k = sigma(xh_k)` (k = 1..n-1).

Each `W_k` is the composition of the graph's affine ops between two activations, applied
through their forward and adjoint passes (never as a dense matrix). Tensors carry two leading
dimensions `[batch, specs, *shape]`; the ops see them flattened to `[batch * specs, *shape]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.graph import Graph
from bounds.ops import ActivationOp, UnaryAffineOp
from relaxations.base import Relaxation


def _flat(t: Tensor) -> tuple[Tensor, tuple[int, int]]:
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]), (t.shape[0], t.shape[1])


def _unflat(t: Tensor, lead: tuple[int, int]) -> Tensor:
    return t.reshape(*lead, *t.shape[1:])


@dataclass(frozen=True)
class AffineBlock:
    """`W x + b` as a composition of unary affine ops (empty: the identity)."""

    ops: tuple[UnaryAffineOp, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]

    def forward(self, x: Tensor) -> Tensor:
        """`W x + b` on `[batch, specs, *in_shape]`."""
        flat, lead = _flat(x)
        for op in self.ops:
            flat = op.forward(flat)
        return _unflat(flat, lead)

    def adjoint(self, A: Tensor) -> Tensor:
        """`W^T A` on `[batch, specs, *out_shape]`."""
        flat, lead = _flat(A)
        for op in reversed(self.ops):
            flat = op.adjoint(flat)
        return _unflat(flat, lead)


@dataclass(frozen=True)
class LayeredNet:
    """`blocks[k]` maps `x_k` to `xh_{k+1}` (k = 0..n-1); `relaxations[k]` relaxes
    `x_{k+1} = sigma(xh_{k+1})`; `pre_names[k]` names the graph node holding `xh_{k+1}`."""

    blocks: tuple[AffineBlock, ...]
    relaxations: tuple[Relaxation, ...]
    pre_names: tuple[str, ...]

    @property
    def n_hidden(self) -> int:
        return len(self.relaxations)

    def truncated(self, k: int) -> LayeredNet:
        """The net whose output is `xh_k` (k >= 1): the first k blocks."""
        return LayeredNet(self.blocks[:k], self.relaxations[: k - 1], self.pre_names[: k - 1])

    def to(self, dtype: torch.dtype) -> LayeredNet:
        blocks = tuple(
            AffineBlock(tuple(op.to(dtype, _device(op)) for op in b.ops), b.in_shape, b.out_shape)
            for b in self.blocks
        )
        return LayeredNet(blocks, self.relaxations, self.pre_names)


def _device(op: UnaryAffineOp) -> torch.device:
    consts = op.constants()
    return consts[0].device if consts else torch.device("cpu")


def layered(graph: Graph) -> LayeredNet:
    """The chain form of `graph`; raises UnsupportedOperationError for non-chain graphs
    (residual connections): the decomposition here covers feed-forward networks."""
    blocks, relaxations, pre_names = [], [], []
    ops: list[UnaryAffineOp] = []
    shape_in = graph.input.shape
    previous = graph.input
    for node in graph.nodes[1:]:
        if node.inputs != (previous.name,):
            raise UnsupportedOperationError(
                "non-chain graph", node.name,
                "Lagrangian decomposition supports feed-forward chains; use 'alpha-crown'",
            )  # fmt: skip
        if isinstance(node.op, ActivationOp):
            blocks.append(AffineBlock(tuple(ops), shape_in, previous.shape))
            relaxations.append(node.op.relaxation)
            pre_names.append(previous.name)
            ops, shape_in = [], node.shape
        else:
            ops.append(node.op)
        previous = node
    blocks.append(AffineBlock(tuple(ops), shape_in, previous.shape))
    return LayeredNet(tuple(blocks), tuple(relaxations), tuple(pre_names))
