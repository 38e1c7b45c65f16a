"""alpha-CROWN's intermediate targets (Xu et al., ICLR 2021): the ambiguous neurons of the
pre-activation nodes whose `+-e_j` specs get slopes of their own, as many layers as fit
in memory."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.graph.cone import in_cone
from bounds.graph.graph import Graph
from bounds.methods.crown import needs_crown, unstable_indices
from bounds.methods.pacing import passed
from bounds.types import Interval


def activations_before(graph: Graph, start: str) -> list[str]:
    """The activations among the ancestors of node `start`, in graph order."""
    ancestors = graph.ancestors(start)
    return [n.name for n in graph.activations() if n.name in ancestors]


# Slope elements of the intermediate targets (each with Adam's two moments and its gradient)
# beyond which the later targets keep CROWN's intervals (valid): 2^27, 0.5 GiB in float32 each
# (cGAN 64x64 of VNN-COMP 2023 asked for 5.9 GB in one tensor).
MAX_SLOPE_ELEMENTS = 1 << 27


def within_memory(graph: Graph, batch: int, targets: dict[str, Tensor]) -> dict[str, Tensor]:
    """The targets, in order, whose slopes (`[B, 2, k, *act_shape]` per activation before
    each) fit in `MAX_SLOPE_ELEMENTS` together; no allocation is started past it."""
    kept, total = {}, 0
    for name, index in targets.items():
        size = sum(torch.Size(graph[a].shape).numel() for a in activations_before(graph, name))
        total += batch * 2 * index.numel() * size
        if total > MAX_SLOPE_ELEMENTS:
            break
        kept[name] = index
    return kept


def intermediate_targets(
    graph: Graph, box: Interval, base: dict[str, Interval], optimize: bool,
    stop_at: float | None, predicted: bool, cone: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:  # fmt: skip
    """The ambiguous neurons (flat indices) of each pre-activation node whose slopes are
    optimised, within memory: none unless `optimize` (`optimize_intermediate`), when not even a chunk is
    `predicted` to fit, or past the deadline; only those in the `cone` where given
    (`bounds.graph.cone.spec_cone`)."""
    targets = {}
    if optimize and not (predicted or passed(stop_at)):
        for name in needs_crown(graph):
            index = unstable_indices(graph, name, base[name])
            index = in_cone(cone, name, index)
            if index.numel():
                targets[name] = index
        targets = within_memory(graph, box.lower.shape[0], targets)
    return targets
