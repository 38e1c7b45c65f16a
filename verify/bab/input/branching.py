"""The brancher of input splitting (`InputBrancher`): each parent is halved along one input
dimension, chosen by a registered score (`INPUT_BRANCHINGS`: "smear", |gradient| x width of
the critical row at the centre, as in Wang et al. 2018, "Efficient formal safety analysis";
"smart", |coefficient| x width of the critical row's linear bound; "widest", the normalised
width), picked by name once, when the search is configured."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from verify.attack import UnsafeSpec
from verify.bab.branchers import INPUT_BRANCHINGS
from verify.bab.config import TRIAL_SCORES, BabConfig
from verify.bab.input.bounder import InputBounder
from verify.bab.input.domains import Domains, box_points, critical_rows
from verify.bab.protocols import Children


@INPUT_BRANCHINGS.register("smear")
class SmearScore:
    """`[N, n_in]` branching scores: widest normalised width, plus |dv/dx| x width of the
    critical row (the best row of the worst polytope) at the centre."""

    def __init__(self, net: nn.Module, root: tuple[Tensor, Tensor], spec: UnsafeSpec,
                 shape: tuple[int, ...]) -> None:  # fmt: skip
        self.net, self.root, self.spec, self.shape = net, root, spec, shape

    def widest(self, parents: Domains) -> Tensor:
        """The widths normalised by the root's."""
        width = parents.upper - parents.lower
        return width / (self.root[1] - self.root[0]).clamp_min(1e-12)

    def __call__(self, parents: Domains) -> Tensor:
        width = parents.upper - parents.lower
        widest = self.widest(parents)
        rows = critical_rows(parents.rows, self.spec.owner, self.spec.n_polytopes)
        centre = ((parents.lower + parents.upper) / 2).reshape(-1, *self.shape)
        centre.requires_grad_(True)
        with torch.enable_grad():
            out = self.net(centre).flatten(1)
            picked = (out * self.spec.C[rows]).sum()
            (grad,) = torch.autograd.grad(picked, centre)
        smear = grad.flatten(1).abs() * width
        smear = smear / smear.amax(dim=1, keepdim=True).clamp_min(1e-30)
        return smear + 1e-3 * widest * (widest > 0)


@INPUT_BRANCHINGS.register("widest")
class WidestScore(SmearScore):
    """`[N, n_in]` branching scores: the normalised widths."""

    def __call__(self, parents: Domains) -> Tensor:
        return self.widest(parents)


@INPUT_BRANCHINGS.register("smart")
class SmartScore(SmearScore):
    """`[N, n_in]` branching scores from the linear bounds: |a_j| x width_j of the critical
    row's input functional `a` (`Domains.coeff`, from the bound that gave the domain's rows),
    normalised, plus the normalised width for ties: the dimension along which the linear
    bound varies most over the box (the input "smart branching" of Bunel et al. 2018, "A
    unified view of piecewise linear neural network verification", BaBSB, Sec. 5.2). No
    forward or backward pass of its own; "smear" where the method gave no functional."""

    def __call__(self, parents: Domains) -> Tensor:
        if parents.coeff is None:
            return super().__call__(parents)
        width = parents.upper - parents.lower
        widest = self.widest(parents)
        score = parents.coeff.abs() * width
        score = score / score.amax(dim=1, keepdim=True).clamp_min(1e-30)
        return score + 1e-3 * widest * (widest > 0)


class InputBrancher:
    """The input-splitting `Brancher`: each parent is halved along one input dimension, chosen
    by `BabConfig.branching` (module docstring); with `trial_dims` k > 1 the top-k dimensions
    are all tried and the pair of children whose `trial_score` of their margins is best is
    kept."""

    def __init__(self, net: nn.Module, root: tuple[Tensor, Tensor], spec: UnsafeSpec,
                 config: BabConfig, stats: dict[str, Any]) -> None:  # fmt: skip
        self.net, self.root, self.spec, self.config, self.stats = net, root, spec, config, stats
        # a dimension the root box holds fixed never splits: no trial on it (nn4sys's mscn
        # properties vary 3 of 308 inputs: 5 trials would bound 8 copies of the parent)
        varying = int((root[1] > root[0]).sum(dim=1).max())
        self.k = max(1, min(config.trial_dims, varying))
        self.fanout = 2 * self.k
        self.shape = tuple(getattr(net, "input_shape", None) or (root[0].shape[1],))
        self.score = INPUT_BRANCHINGS.get(config.branching)(net, root, spec, self.shape)

    def children(self, parents: Domains, bounder: InputBounder) -> Children:
        """The bounded open children of `parents` (left ones first); with k > 1, per parent
        the split whose children's margins score best among its top-k dimensions (only the
        kept pair is confirmed in float64)."""
        scores, n, k = self.scores(parents), len(parents), self.k
        dims = scores.topk(k, dim=1).indices
        splits = [self.split(parents, dims[:, j]) for j in range(k)]
        lower, upper, depth = (torch.cat(parts) for parts in zip(*splits))
        unknown = lower.new_full((len(lower), self.spec.C.shape[0]), -torch.inf)
        trial = Domains(lower, upper, unknown, unknown[:, 0], depth)
        bounded, slope_rows, slopes = bounder.measure(trial)
        self.stats["max_depth"] = max(self.stats["max_depth"], int(bounded.depth.max()))
        if k > 1:
            margins = bounded.margin.reshape(k, 2, n).clamp(max=0)
            quality = TRIAL_SCORES[self.config.trial_score](margins)
            offset = quality.argmax(0) * 2 * n + torch.arange(n, device=lower.device)
            keep = torch.cat([offset, offset + n])
            bounded, slope_rows = bounded.take(keep), slope_rows[keep]
        open_ = bounder.confirm(bounded, slope_rows, slopes).open()
        points = box_points(open_, self.config.corner_domains)
        return Children(open_, points, (open_.lower + open_.upper) / 2, len(lower))

    def split(self, parents: Domains, dim: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Two children per parent (left ones first), halved along `dim [N]`."""
        rows = torch.arange(len(parents), device=parents.lower.device)
        mid = (parents.lower[rows, dim] + parents.upper[rows, dim]) / 2
        left_upper, right_lower = parents.upper.clone(), parents.lower.clone()
        left_upper[rows, dim] = mid
        right_lower[rows, dim] = mid
        lower = torch.cat([parents.lower, right_lower])
        upper = torch.cat([left_upper, parents.upper])
        return lower, upper, (parents.depth + 1).repeat(2)

    def scores(self, parents: Domains) -> Tensor:
        """`[N, n_in]` branching scores of the registered heuristic."""
        return self.score(parents)
