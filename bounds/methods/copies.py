"""Pre-activations that are copies: a node reached from an earlier one only through data
movement (reshape, permute, index, pad, broadcast: the `exact` unary affine ops) has, element
by element, the CROWN bounds of the element it copies. A backward pass from a copy's unit
functional `e_j` goes through the data movement's adjoint to the unit functional of its source
element, so both passes are the same pass.

CROWN's intervals (`bounds.methods.crown.crown_intervals`) therefore bound the distinct source
elements of a copy's ambiguous neurons once and carry the result forward by the copies'
intervals (exact: no arithmetic). In a transformer's attention, `Q K^T` and `softmax(.) V` are
relaxed as elementwise products of broadcast operands, each element of `Q`, `K` and `V` copied
once per token: ViT's 17 tokens make 17 backward passes per element where one suffices (the
VNN-COMP 2023 `vit` nets: 13,872 copies of 867 elements per operand).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from bounds.graph.graph import Graph, Node
from bounds.ops import UnaryAffineOp


class CopyChain(NamedTuple):
    """`source`: the node copied; `nodes`: the data-movement nodes from the source's reader to
    the copy, in order; `index [n]`: per flat element of the copy, the flat element of the
    source it holds, or -1 for a constant the chain inserts (padding)."""

    source: str
    nodes: tuple[Node, ...]
    index: Tensor


def is_copy(node: Node) -> bool:
    """A single-input op that only moves data (its output elements are input elements or
    constants)."""
    return isinstance(node.op, UnaryAffineOp) and node.op.exact and len(node.inputs) == 1


def copy_chain(graph: Graph, name: str) -> CopyChain | None:
    """The chain by which node `name` copies an earlier node, or None when `name` is no copy."""
    nodes: list[Node] = []
    node = graph[name]
    while is_copy(node):
        nodes.append(node)
        node = graph[node.inputs[0]]
    if not nodes:
        return None
    nodes.reverse()
    # flat positions + 1 through the chain's linear parts: padding's constants read 0
    size = int(torch.Size(node.shape).numel())
    x = torch.arange(1, size + 1, dtype=torch.float64).reshape(1, *node.shape)
    for step in nodes:
        x = step.op.linear(x)
    return CopyChain(node.name, tuple(nodes), x.reshape(-1).long() - 1)


def source_elements(chain: CopyChain, index: Tensor, done: Tensor | None) -> Tensor:
    """The distinct flat source elements that the copy's flat `index` hold, less those marked
    in `done [n_source]` (bounded already)."""
    src = chain.index.to(index.device)[index]
    src = torch.unique(src[src >= 0])
    return src if done is None else src[~done[src]]
