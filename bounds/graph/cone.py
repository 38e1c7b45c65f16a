"""The output cone: the neurons of each node on which chosen outputs depend (the backward
receptive field of a specification's rows). CROWN needs the intermediate bounds of those
neurons only: a neuron outside the cone has a zero coefficient in every functional pushed
back from the rows, at every node on the way (`crown.crown_intervals`' `cone`).

Computed by pushing a positive functional back from the chosen outputs through each op's
adjoint (`BoundOp.vjp`), its magnitude taken and re-drawn at random in `[1, 2)` at every node,
so that terms cancel to an exact zero only by a coincidence of measure zero; and a neuron
wrongly left out keeps its interval bound, which is valid (looser): the cone never makes a
bound unsound."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.ops import ActivationOp


def spec_cone(graph: Graph, C: Tensor) -> dict[str, Tensor] | None:
    """`output_cone` of the outputs that some row of `C` (`[batch, specs, n_out]`) weighs,
    cached on the graph per set of outputs; None where every output is weighed (no
    neuron is left out)."""
    outputs = (C.detach() != 0).reshape(-1, C.shape[-1]).any(0).cpu()
    if outputs.all():
        return None
    key = outputs.numpy().tobytes()
    if key not in graph.cones:
        graph.cones[key] = output_cone(graph, outputs)
    return graph.cones[key]


def in_cone(cone: dict[str, Tensor] | None, name: str, index: Tensor) -> Tensor:
    """The flat neuron indices `index` of node `name` that lie in `cone` (all: no cone)."""
    return index if cone is None else index[cone[name].to(index.device)[index]]


def output_cone(graph: Graph, outputs: Tensor) -> dict[str, Tensor]:
    """Per node name, a flat boolean mask `[numel]` of the neurons on which some output in
    `outputs` (a flat boolean mask `[n_out]` of the graph's output) depends; the input's
    included."""
    graph = graph.float64
    gen = torch.Generator().manual_seed(0)
    reach: dict[str, Tensor] = {graph.output.name: outputs.reshape(-1).to(torch.float64)}
    cone: dict[str, Tensor] = {}
    for node in reversed(graph.nodes):
        size = int(torch.Size(node.shape).numel())
        r = reach.pop(node.name, None)
        mask = torch.zeros(size, dtype=torch.bool) if r is None else r.reshape(-1) != 0
        cone[node.name] = mask
        if node.op is None or not mask.any():
            continue
        drawn = (1 + torch.rand(size, generator=gen, dtype=torch.float64)) * mask
        for name, part in zip(node.inputs, _parts(graph, node, drawn)):
            reach[name] = part if name not in reach else reach[name] + part
    return cone


def _parts(graph: Graph, node, drawn: Tensor) -> list[Tensor]:
    """The magnitudes `[numel]` that a functional `drawn` on `node` gives each of its inputs:
    an activation's elementwise (every element of an input of another shape), an affine op's
    through its adjoint."""
    if isinstance(node.op, ActivationOp):
        return [drawn if graph[i].shape == node.shape
                else torch.ones(torch.Size(graph[i].shape).numel(), dtype=torch.float64)
                for i in node.inputs]  # fmt: skip
    parts = node.op.vjp(drawn.reshape(1, 1, *node.shape))
    return [p.reshape(-1).abs() for p in parts]
