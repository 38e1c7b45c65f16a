"""Interval bound propagation (Gowal et al. 2018; Mirman et al. 2018)."""

from __future__ import annotations

from torch import Tensor

from bounds.graph import Graph
from bounds.methods.crown import interval_bound, split_output
from bounds.types import Interval


def ibp(
    graph: Graph, box: Interval, C: Tensor, given: dict[str, Interval] | None = None
) -> tuple[Tensor, Tensor, dict[str, Interval]]:
    """Interval bounds on `C . y`: `(lower [B, S], upper [B, S], intervals per node)`."""
    intervals = graph.interval(box, given)
    lower, upper = split_output(interval_bound(C, intervals[graph.output.name]))
    return lower, upper, intervals
