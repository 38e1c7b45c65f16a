"""ReLU branching for branch and bound: the scores that pick the neuron to split, and the
registered neuron choices (`RELU_BRANCHINGS`: "babsr", "fsb"), picked by name once, when the
search is configured.

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

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.methods.beta_crown import SplitBackward
from bounds.methods.pacing import passed
from verify.bab.branchers import RELU_BRANCHINGS
from verify.bab.common import DeadlineReachedError
from verify.bab.relu.domains import Layout, ReluDomains, Target


def with_split(
    splits: Tensor, alpha: Tensor, beta: Tensor, lam: Tensor, neuron: Tensor, sign: Tensor
) -> tuple[Tensor, Tensor]:
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


def fsb_pick(splits: Tensor, cands: Tensor, margins: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
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


class OnePass(Protocol):
    """What FSB needs of the bounder: one alpha-beta-CROWN backward pass on domains."""

    def one_pass(self, splits: Tensor, alpha: Tensor, beta: Tensor, C: Tensor) -> SplitBackward: ...


@RELU_BRANCHINGS.register("babsr")
class Babsr:
    """BaBSR: per parent the neuron of best score (module docstring)."""

    def __init__(self, target: Target, fsb_candidates: int) -> None:
        self.t = target

    def __call__(
        self, parents: ReluDomains, score: Tensor, gain: Tensor, bounder: OnePass
    ) -> Tensor:
        return score.argmax(dim=1)


@RELU_BRANCHINGS.register("fsb")
class Fsb:
    """FSB: per parent the best of the top `fsb_candidates` of BaBSR and of the intercept score,
    judged by its two children's one-pass bounds (`fsb_pick`), in groups of the batch size
    (deadline between)."""

    def __init__(self, target: Target, fsb_candidates: int) -> None:
        self.t, self.k = target, fsb_candidates

    def __call__(
        self, parents: ReluDomains, score: Tensor, gain: Tensor, bounder: OnePass
    ) -> Tensor:
        cands = candidates((score, gain), self.k)
        t = self.t
        k = cands.shape[1]
        group = max(1, t.sizer.size // (2 * k))
        picks = []
        for start in range(0, len(parents), group):
            if passed(t.deadline):
                raise DeadlineReachedError
            index = torch.arange(start, min(start + group, len(parents)), device=t.device)
            part = parents.take(index)

            def margins(splits: Tensor, rep: Tensor, part: ReluDomains = part) -> Tensor:
                rows = t.rows_of[part.poly[rep]]
                C = t.spec.C[rows]
                lower = bounder.one_pass(splits, part.alpha[rep], part.beta[rep], C).lower
                return (lower - t.spec.b[rows] - t.tol[rows]).amax(1)

            picks.append(fsb_pick(part.splits, cands[index], margins))
        return torch.cat(picks)
