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

Any activation exact on each side of 0 (`split_at_zero`: slope `a` below 0, `c` above, e.g.
LeakyReLU's `a = 0.01, c = 1`) has the same estimate with its own chord: slope
`s = (c u - a l) / (u - l)` and intercept `(c - a) (-l u) / (u - l)`, which lies above the
function when it is convex (`c > a`, used where `lambda < 0`) and below it when it is concave
(`c < a`, used where `lambda > 0`): `g = -min(lambda * intercept, 0)`, and the children pass
`lambda c` (active) or `lambda a` (inactive) instead of `lambda s`. For ReLU (`a = 0, c = 1`)
these are the formulas above.
The intercept score `g` alone is FSB's second ranking (De Palma et al. 2021, "Improved branch and
bound for neural network verification via Lagrangian decomposition", Sec. 5: "filtered smart
branching" bounds both children of the top candidates of each score and keeps the best).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.graph.graph import Graph
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


def with_split(splits, alpha, beta, lam, neuron, sign) -> tuple[Tensor, Tensor]:
    """Copies of `splits [M, n]` and `beta [M, r, n]` with `neuron [M]` split to `sign [M]`.
    The new multiplier makes the child's functional equal to the parent's where the parent
    used the lower line `alpha xh` (`lam >= 0`): the coefficient reaching `xh` is then
    `lam - beta = lam alpha` (active: `beta = lam (1 - alpha)`) or `beta = lam alpha`
    (inactive), so the child's one-pass bound is at least the parent's; elsewhere 0."""
    rows = torch.arange(len(neuron), device=neuron.device)
    splits, beta = splits.clone(), beta.clone()
    splits[rows, neuron] = sign
    lam_j = lam[rows, :, neuron].clamp(min=0)  # [M, r]
    alpha_j = alpha[rows, :, neuron].clamp(0, 1)
    active = (sign > 0).unsqueeze(1)
    beta[rows, :, neuron] = torch.where(active, lam_j * (1 - alpha_j), lam_j * alpha_j)
    return splits, beta


def polytope_rows(spec) -> Tensor | None:
    """`[P, r]` the row indices of each of the `UnsafeSpec`'s polytopes, padded by repeating
    its first row (None when some polytope has no rows)."""
    owner = spec.owner
    index = [(owner == p).nonzero().flatten() for p in range(spec.n_polytopes)]
    if not index or not all(len(i) for i in index):
        return None
    r = max(len(i) for i in index)
    return torch.stack([torch.cat([i, i[:1].repeat(r - len(i))]) for i in index])


def pre_biases(graph: Graph, layout: Layout, like: Tensor) -> Tensor:
    """`[total]`: the bias feeding each ReLU neuron (`Graph.bias_of` per pre-activation)."""
    return torch.cat([graph.bias_of(pre, like) for pre in layout.pres])


def side_slopes(graph: Graph, layout: Layout, like: Tensor) -> tuple[Tensor, Tensor]:
    """`([total], [total])`: each neuron's slope below 0 and above 0 (`Graph.side_slopes` per
    activation)."""
    below, above = zip(*(graph.side_slopes(act, like) for act in layout.acts))
    return torch.cat(below), torch.cat(above)


def branchable(lower: Tensor, upper: Tensor, splits: Tensor) -> Tensor:
    """`[N, total]` mask of ambiguous (`l < 0 < u`), not yet split neurons."""
    return (lower < 0) & (upper > 0) & (splits == 0)


def babsr_scores(
    lam: Tensor, lower: Tensor, upper: Tensor, bias: Tensor, mask: Tensor,
    slopes: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """BaBSR and intercept scores `[N, total]` (see the module docstring; -inf where `mask` is
    False). `lam [N, total]`: coefficients at the activation outputs; `lower`, `upper
    [N, total]`: the domain's pre-activation bounds; `bias [total]`; `slopes`: each neuron's
    slopes below and above 0 (`side_slopes`; default ReLU's 0 and 1)."""
    a, c = slopes if slopes is not None else (torch.zeros_like(bias), torch.ones_like(bias))
    width = torch.where(mask, upper - lower, torch.ones_like(upper))
    slope = torch.where(mask, (c * upper - a * lower) / width, torch.zeros_like(upper))
    intercept = torch.where(mask, (c - a) * (-lower * upper) / width, torch.zeros_like(upper))
    gain = -(lam * intercept).clamp(max=0)
    active = lam * bias * (c - slope)
    inactive = lam * bias * (a - slope)
    score = (gain + torch.minimum(active, inactive)).abs()
    neg = torch.full_like(score, -torch.inf)
    return torch.where(mask, score, neg), torch.where(mask, gain, neg)


def fsb_pick(splits: Tensor, cands: Tensor, margins) -> Tensor:
    """FSB's choice per domain among its candidates `cands [G, K]` (flat neurons): the one
    whose worse child has the best margin. `margins(child_splits [2GK, n], parent [2GK])` gives
    the children's one-pass bound margins `[2GK]` (the parents' slopes and multipliers, the new
    split's multiplier 0: with `with_split`'s the one-pass bound of a child equals the parent's
    wherever `lam >= 0`, which would hide those candidates' gains)."""
    g, k = cands.shape
    device = cands.device
    rep = torch.arange(g, device=device).repeat_interleave(2 * k)
    neuron = cands.repeat_interleave(2, dim=1).reshape(-1)
    sign = torch.tensor([1, -1], dtype=torch.int8, device=device).repeat(g * k)
    children = splits[rep]
    children[torch.arange(len(rep), device=device), neuron] = sign
    worse = margins(children, rep).reshape(g, k, 2).amin(dim=2)
    return cands[torch.arange(g, device=device), worse.argmax(dim=1)]


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
