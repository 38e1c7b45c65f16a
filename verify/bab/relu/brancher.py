"""The brancher of ReLU splitting (`ReluBrancher`): per parent the neuron to split, chosen by
the registered heuristic of `ReluSplitConfig.branching` (`verify.bab.relu.branching`: BaBSR,
or FSB's best candidate by its children's one-pass bounds), and the two children, warm-started
from the parent (`with_split`)."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from verify.bab.branchers import RELU_BRANCHINGS
from verify.bab.config import ReluSplitConfig
from verify.bab.protocols import Children
from verify.bab.relu.bounder import ReluBounder
from verify.bab.relu.branching import babsr_scores, branchable, pre_biases, side_slopes, with_split
from verify.bab.relu.domains import ReluDomains, Target
from verify.bab.relu.stratified import StratifiedBounder


class ReluBrancher:
    """Brancher of ReLU-split domains: per parent the neuron to split (`settings.branching`:
    BaBSR, or FSB's best candidate by its children's one-pass bounds) and the two children,
    warm-started from the parent (see `verify.bab.relu.branching`)."""

    fanout = 2

    def __init__(self, target: Target, settings: ReluSplitConfig) -> None:
        self.t, self.settings = target, settings
        self.bias = pre_biases(target.graph, target.layout, target.box.lower)
        self.slopes = side_slopes(target.graph, target.layout, target.box.lower)
        self.pick = RELU_BRANCHINGS.get(settings.branching)(target, settings.fsb_candidates)

    def choose(self, parents: ReluDomains, bounder: ReluBounder) -> tuple[Tensor, Tensor]:
        """`[N]` the flat neuron to split per parent (-1: none left), and the parents'
        coefficients at the ReLU outputs `[N, r, n]`."""
        flat = bounder.flat_intervals(parents.splits)
        mask = branchable(flat.lower, flat.upper, parents.splits)
        lam = bounder.coefficients(parents)
        best = lam[torch.arange(len(parents), device=self.t.device), parents.rows.argmax(dim=1)]
        score, gain = babsr_scores(best, flat.lower, flat.upper, self.bias, mask, self.slopes)
        choice = self.pick(parents, score, gain, bounder)
        return torch.where(mask.any(dim=1), choice, torch.full_like(choice, -1)), lam

    def children(self, parents: ReluDomains, bounder: StratifiedBounder) -> Children:
        """Split each parent on its chosen neuron and bound the children; parents with nothing
        left to split get a long optimisation instead (`final_iterations`: their relaxation is
        exact for the optimal multipliers), and those still open are counted as unsplittable
        (dropped, never proven)."""
        t, popped = self.t, 2 * len(parents)
        tick = time.perf_counter()
        choice, lam = self.choose(parents, bounder.easy)
        t.stats["branch_seconds"] += time.perf_counter() - tick
        stuck = choice < 0
        tried = []
        if stuck.any():
            done, points = bounder.bound(parents.take(stuck.nonzero().flatten()),
                                         self.settings.final_iterations)  # fmt: skip
            is_open = (done.margin <= 0).nonzero().flatten()
            t.stats["unsplittable"] += len(is_open)
            tried.append(points[is_open].flatten(0, 1))
            keep = (~stuck).nonzero().flatten()
            parents, choice, lam = parents.take(keep), choice[keep], lam[keep]
        if not len(parents):
            none = tried[0][:0]
            return Children(parents, tried[0], none, popped)
        children, points = bounder.bound(self.split(parents, choice, lam))
        t.stats["max_depth"] = max(t.stats["max_depth"], int(children.depth.max()))
        is_open = (children.margin <= 0).nonzero().flatten()
        children, points = children.take(is_open), points[is_open]
        tried.append(points.flatten(0, 1))
        return Children(children, torch.cat(tried), points[:, 0], popped)

    def split(self, parents: ReluDomains, choice: Tensor, lam: Tensor) -> ReluDomains:
        """Two children per parent (active ones first), warm-started from the parent
        (`lam [N, r, n]`: the parent's coefficients at the ReLU outputs, see
        `verify.bab.relu.branching.with_split`); each keeps its parent's rows, margin and stall
        count until it is bounded, and its parent's warm start for the hard bounder
        (`verify.bab.relu.warm`)."""
        two = lambda x: torch.cat([x, x])  # noqa: E731
        n = len(parents)
        sign = torch.ones(2 * n, dtype=torch.int8, device=self.t.device)
        sign[n:] = -1
        splits, beta = with_split(
            two(parents.splits), two(parents.alpha), two(parents.beta), two(lam), two(choice), sign
        )
        return ReluDomains(
            splits, two(parents.alpha), beta, two(parents.poly), two(parents.rows),
            two(parents.margin), two(parents.depth) + 1, two(parents.stall), two(parents.warm),
        )  # fmt: skip
