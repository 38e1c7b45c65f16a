"""ReLU branching for branch and bound: the flat layout of a network's ReLU neurons and the
scores that pick the neuron to split.

BaBSR (Bunel et al. 2020, JMLR, "Branch and bound for piecewise linear neural network
verification", Sec. 5.1) estimates, from one backward pass of the domain's bound, how much
splitting an ambiguous neuron `j` (`l < 0 < u`) would raise the bound. Let `lambda` be the
coefficient of the neuron's ReLU output in the lower-bound functional (CROWN's sign convention:
we lower-bound `c . y`), `s = u / (u - l)` the slope of the triangle's upper side and `b` the
bias of the affine op feeding the neuron. Two effects:
- the upper side's intercept `-s l`, used where `lambda < 0`, costs the bound
  `min(lambda, 0) (-s l)`; a split removes it: gain `g = min(lambda, 0) u l / (u - l) >= 0`;
- the neuron passes `lambda s` to its pre-activation (the Wong-Kolter dual's slope); split
  active it passes `lambda` (change `lambda b (1 - s)` in the bias term), split inactive `0`
  (change `-lambda s b`).
The score is `|g + min(lambda b (1 - s), -lambda s b)|`: the estimated change of the worse child.
The intercept score `g` alone is FSB's second ranking (De Palma et al. 2021, "Improved branch and
bound for neural network verification via Lagrangian decomposition", Sec. 5: "filtered smart
branching" bounds both children of the top candidates of each score and keeps the best).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.graph import Graph
from bounds.ops import UnaryAffineOp
from bounds.types import Interval


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


def pre_biases(graph: Graph, layout: Layout, like: Tensor) -> Tensor:
    """`[total]`: the bias feeding each ReLU neuron (0 where the pre-activation op is not a
    single-input affine op with a bias)."""
    parts = []
    for pre, shape, n in zip(layout.pres, layout.shapes, layout.sizes):
        op = graph[pre].op
        bias = op.bias_vector() if isinstance(op, UnaryAffineOp) else None
        if bias is None:
            parts.append(like.new_zeros(n))
        else:
            parts.append(torch.broadcast_to(bias.to(like), shape).reshape(-1))
    return torch.cat(parts)


def branchable(lower: Tensor, upper: Tensor, splits: Tensor) -> Tensor:
    """`[N, total]` mask of ambiguous (`l < 0 < u`), not yet split neurons."""
    return (lower < 0) & (upper > 0) & (splits == 0)


def babsr_scores(
    lam: Tensor, lower: Tensor, upper: Tensor, bias: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """BaBSR and intercept scores `[N, total]` (see the module docstring; -inf where `mask` is
    False). `lam [N, total]`: coefficients at the ReLU outputs; `lower`, `upper [N, total]`: the
    domain's pre-activation bounds; `bias [total]`."""
    width = torch.where(mask, upper - lower, torch.ones_like(upper))
    slope = torch.where(mask, upper / width, torch.zeros_like(upper))
    gain = lam.clamp(max=0) * torch.where(mask, upper * lower / width, torch.zeros_like(upper))
    active = lam * bias * (1 - slope)
    inactive = -lam * bias * slope
    score = (gain + torch.minimum(active, inactive)).abs()
    neg = torch.full_like(score, -torch.inf)
    return torch.where(mask, score, neg), torch.where(mask, gain, neg)


def candidates(scores: tuple[Tensor, ...], k: int) -> Tensor:
    """`[N, len(scores) * k]` flat neuron indices: the top-k of each score (may repeat; a
    domain with fewer than k branchable neurons repeats its best one)."""
    picks = []
    for score in scores:
        top = score.topk(min(k, score.shape[1]), dim=1)
        index = torch.where(torch.isfinite(top.values), top.indices, top.indices[:, :1])
        picks.append(index)
    return torch.cat(picks, dim=1)


def flat_intervals(base: dict[str, Interval], layout: Layout) -> Interval:
    """The pre-activation intervals flattened to `[B, total]`."""
    lower = layout.flatten({p: base[p].lower for p in layout.pres}, layout.pres)
    upper = layout.flatten({p: base[p].upper for p in layout.pres}, layout.pres)
    return Interval(lower, upper)
