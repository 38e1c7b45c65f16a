"""The domains of ReLU splitting and what one search shares.

A domain is the region's input box, one unsafe polytope to exclude, and an assignment of some
ReLUs to active (`xh >= 0`) or inactive (`xh <= 0`), flat over the network's ReLU neurons
(`Layout`): `ReluDomains`. `Target` holds what every part of one search shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph, build_graph
from bounds.types import Interval
from verify.attack import UnsafeSpec
from verify.bab.common import BatchSizer, DomainBatch, Float64Check
from verify.bab.search import Clock


def relu_only(net: nn.Module, n_inputs: int) -> bool:
    """Whether every activation of `net` is a ReLU (so ReLU splitting applies)."""
    shape = tuple(getattr(net, "input_shape", None) or (n_inputs,))
    try:
        graph = build_graph(net, shape)
    except (NotImplementedError, UnsupportedOperationError):
        return False
    return relu_graph(graph)


def relu_graph(graph: Graph) -> bool:
    """Whether every activation of `graph` is a ReLU (so ReLU splitting applies)."""
    try:
        graph.split_pairs()
    except (NotImplementedError, UnsupportedOperationError):
        return False
    return True


@dataclass(frozen=True)
class Layout:
    """The ReLU neurons of a network, flattened and concatenated in topological order:
    `acts[k]` (activation node) fed by `pres[k]` (pre-activation node) of shape `shapes[k]`
    occupies the flat slice `offsets[k] : offsets[k] + sizes[k]`."""

    acts: tuple[str, ...]
    pres: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @staticmethod
    def of(graph: Graph, pairs: list[tuple[str, str]]) -> Layout:
        shapes = tuple(tuple(graph[pre].shape) for _, pre in pairs)
        sizes = tuple(int(torch.Size(s).numel()) for s in shapes)
        offsets = tuple(sum(sizes[:k]) for k in range(len(sizes)))
        acts = tuple(a for a, _ in pairs)
        return Layout(acts, tuple(p for _, p in pairs), shapes, offsets, sizes)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def views(self, flat: Tensor, keys: tuple[str, ...]) -> dict[str, Tensor]:
        """`flat [..., total]` -> per layer `[..., *shape]` keyed by `keys` (acts or pres)."""
        lead = flat.shape[:-1]
        return {
            key: flat[..., o : o + n].reshape(*lead, *shape)
            for key, o, n, shape in zip(keys, self.offsets, self.sizes, self.shapes)
        }

    def flatten(self, per_layer: dict[str, Tensor], keys: tuple[str, ...]) -> Tensor:
        """Inverse of `views`: per-layer `[..., *shape]` -> `[..., total]`."""
        parts = []
        for key, shape, n in zip(keys, self.shapes, self.sizes):
            t = per_layer[key]
            parts.append(t.reshape(*t.shape[: t.dim() - len(shape)], n))
        return torch.cat(parts, dim=-1)


@dataclass
class ReluDomains(DomainBatch):
    """Open domains, flat over the ReLU neurons (`Layout`): `splits [N, n]` int8 (+1 active,
    -1 inactive, 0 free); `alpha`, `beta [N, r, n]`; `poly [N]` the unsafe polytope to exclude;
    `rows [N, r]` lower bounds of its rows' `C y - b` (padded by repeating a row); `margin [N]`
    the best row minus its tolerance (> 0: excluded); `depth [N]` the number of splits; `stall
    [N]` how many of the last splits in a row improved the margin by less than
    `ReluSplitConfig.stall_gain` (the hard-subtree predictor); `warm [N]` int64 the id of the
    hard bounder's stored duals its hard bound starts from (`verify.bab.relu.warm`; -1, the
    default: none)."""

    splits: Tensor
    alpha: Tensor
    beta: Tensor
    poly: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor
    stall: Tensor
    warm: Tensor | None = None

    def __post_init__(self) -> None:
        if self.warm is None:
            self.warm = torch.full_like(self.depth, -1, dtype=torch.long)


@dataclass
class Target:
    """What every part of one ReLU-splitting search shares: the graph in the network's dtype
    and device, its ReLU `layout`, the region's outward-rounded `box [1, *input_shape]` (and
    `box64`, float64 when rechecking), the unsafe polytopes (`spec`, `rows_of [P, r]`, pruning
    tolerance `tol [m]`), the float64 `check`, the batch `sizer`, `stats` and the search's
    `clock` (its `deadline`, `time.monotonic()`)."""

    graph: Graph
    layout: Layout
    box: Interval
    box64: Interval
    spec: UnsafeSpec
    rows_of: Tensor | None
    tol: Tensor
    check: Float64Check
    sizer: BatchSizer
    stats: dict[str, Any]
    clock: Clock

    @property
    def device(self) -> torch.device:
        return self.box.lower.device

    @property
    def deadline(self) -> float:
        return self.clock.deadline


def polytope_rows(spec: UnsafeSpec) -> Tensor | None:
    """`[P, r]` the row indices of each of the `UnsafeSpec`'s polytopes, padded by repeating
    its first row (None when some polytope has no rows)."""
    owner = spec.owner
    index = [(owner == p).nonzero().flatten() for p in range(spec.n_polytopes)]
    if not index or not all(len(i) for i in index):
        return None
    r = max(len(i) for i in index)
    return torch.stack([torch.cat([i, i[:1].repeat(r - len(i))]) for i in index])


def flat_intervals(base: dict[str, Interval], layout: Layout) -> Interval:
    """The pre-activation intervals flattened to `[B, total]`."""
    lower = layout.flatten({p: base[p].lower for p in layout.pres}, layout.pres)
    upper = layout.flatten({p: base[p].upper for p in layout.pres}, layout.pres)
    return Interval(lower, upper)
