"""Interval bound propagation (Gowal et al. 2018; Mirman et al. 2018)."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.methods.crown import interval_bound, split_output
from bounds.registry import IntermediateBounds, MethodResult, NoConfig, register_method
from bounds.rounding import bounds_in_float64
from bounds.types import Interval


def ibp(
    graph: Graph, box: Interval, C: Tensor, given: dict[str, Interval] | None = None,
    exact: bool = True,
) -> tuple[Tensor, Tensor, dict[str, Interval]]:  # fmt: skip
    """Interval bounds on `C . y`: `(lower [B, S], upper [B, S], intervals per node)`; a
    float32 network's in float64, rounded outward (`bounds.rounding`); `exact=False`: in the
    network's dtype (each op's interval still accounts for its rounding)."""
    if exact and box.lower.dtype != torch.float64:
        return bounds_in_float64(ibp, graph, box, C, given)
    intervals = graph.interval(box, given)
    lower, upper = split_output(interval_bound(C, intervals[graph.output.name]))
    return lower, upper, intervals


def ibp_intermediate(
    graph: Graph, box: Interval, C: Tensor, iterations: int = 50,
    given: dict[str, Interval] | None = None, deadline: float | None = None,
    start: IntermediateBounds | None = None,
) -> dict[str, Interval]:  # fmt: skip
    """Interval bound propagation's intervals (`IntermediateBounds`)."""
    return graph.interval(box, given)


@register_method("ibp", NoConfig, "interval bound propagation", intermediate=ibp_intermediate)
def _ibp(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    return (*ibp(graph, box, C, given, exact), {})
