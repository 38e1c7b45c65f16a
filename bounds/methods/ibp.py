"""Interval bound propagation (Gowal et al. 2018; Mirman et al. 2018)."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.graph import Graph
from bounds.methods.crown import interval_bound, split_output
from bounds.rounding import in_float64, outward
from bounds.types import Interval, rounded_down, rounded_up


def ibp(
    graph: Graph, box: Interval, C: Tensor, given: dict[str, Interval] | None = None,
    exact: bool = True,
) -> tuple[Tensor, Tensor, dict[str, Interval]]:  # fmt: skip
    """Interval bounds on `C . y`: `(lower [B, S], upper [B, S], intervals per node)`; a
    float32 network's in float64, rounded outward (`bounds.rounding`); `exact=False`: in the
    network's dtype (each op's interval still accounts for its rounding)."""
    dtype = box.lower.dtype
    if exact and dtype != torch.float64:
        given64 = {k: in_float64(iv) for k, iv in (given or {}).items()}
        low, up, found = ibp(graph.float64, in_float64(box), C.double(), given64)
        intervals = {k: outward(iv, dtype) for k, iv in found.items()}
        return rounded_down(low, dtype), rounded_up(up, dtype), intervals
    intervals = graph.interval(box, given)
    lower, upper = split_output(interval_bound(C, intervals[graph.output.name]))
    return lower, upper, intervals
