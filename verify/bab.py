"""Branch and bound on one VNN-LIB region: input splitting over batches of boxes (here), or
ReLU splitting (`verify/relu_bab.py`); `solve_region` picks one by the number of inputs.

Each step pops the open domains with the smallest margin (best-first: the likeliest to hold a
counterexample), splits each in two along one input dimension, bounds all children with one
`verify.bounds` call, prunes the children whose bounds exclude every unsafe polytope, tries the
centres (and corners, for small inputs) of the open children as counterexamples, runs PGD on the
worst ones now and then, and keeps the rest. The region holds when no domain is left (Bunel et
al. 2020, "Branch and bound for piecewise linear neural network verification"; input splitting
with a smear-like heuristic as in Wang et al. 2018, "Efficient formal safety analysis").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from bounds.types import Budget
from verify.api import bounds
from verify.attack import AttackConfig, UnsafeSpec, min_max, pgd
from verify.bab_common import (
    BatchSizer,
    DeadlineReachedError,
    DomainBatch,
    RegionOutcome,
    RegionSearch,
    is_out_of_memory,
    outward_box,
)
from verify.relu_bab import ReluBab, ReluSplitConfig, relu_only
from verify.vnnlib import Region

__all__ = ["BabConfig", "BatchSizer", "Domains", "RegionBab", "RegionOutcome", "solve_region"]

SPLITTINGS = ("auto", "input", "relu")

TRIAL_SCORES = {
    "max": lambda margins: margins.amax(dim=1),
    "sum": lambda margins: margins.sum(dim=1),
    "min": lambda margins: margins.amin(dim=1),
}


@dataclass(frozen=True)
class BabConfig:
    """method: bounds for every domain; strong_method (None: off) for domains at depth >=
    strong_depth, with strong_options; batch_size: first domains per bounds call, adapted by
    measured throughput between min_batch and max_batch (halved on out-of-memory); branching:
    "smear" (|gradient| x width of the critical row at the centre) or "widest" (normalised
    width); trial_dims: split each parent on its top-k dimensions by that score, bound all 2k
    children and keep the pair whose trial_score ("max", "sum" or "min" of the two children's
    margins clipped at 0) is largest (k = 1: no trial; "max" favours the split that prunes or
    nearly prunes one half); attack_every: seconds between PGD runs on the attack_domains
    worst open domains; corner_domains: open domains whose corners are tried (inputs of at most
    6 dimensions); max_domains: open domains beyond which the answer is "unknown";
    prune_tol: a domain is pruned when its margin exceeds prune_tol * (1 + |b|) (rounding).
    splitting: "input", "relu" or "auto" (input splitting for at most input_split_max_dims
    inputs or a network with other activations than ReLU, else ReLU splitting); relu: the
    ReLU-splitting settings (`method`, `strong_*`, `branching`, `trial_*` and `corner_domains`
    are input-splitting settings; the rest is shared); combine_rows: input splitting also
    bounds the midpoints of pairs of a polytope's rows (`UnsafeSpec.with_combinations`)."""

    method: str = "crown"
    strong_method: str | None = "alpha-crown"
    strong_depth: int = 30
    strong_options: dict[str, Any] = field(
        default_factory=lambda: {"iterations": 10, "optimize_intermediate": False}
    )
    batch_size: int = 128
    min_batch: int = 16
    max_batch: int = 2048
    branching: str = "smear"
    trial_dims: int = 5
    trial_score: str = "max"
    attack_every: float = 1.0
    attack_domains: int = 32
    corner_domains: int = 256
    attack: AttackConfig = field(default_factory=lambda: AttackConfig(restarts=32, steps=30))
    max_domains: int = 2_000_000
    prune_tol: float = 1e-5
    splitting: str = "auto"
    input_split_max_dims: int = 12
    relu: ReluSplitConfig = field(default_factory=ReluSplitConfig)
    combine_rows: bool = True

    def __post_init__(self) -> None:
        if self.branching not in ("smear", "widest"):
            raise ValueError(f"branching must be 'smear' or 'widest', got {self.branching!r}")
        if self.trial_dims < 1 or self.trial_score not in TRIAL_SCORES:
            raise ValueError(f"need trial_dims >= 1 and trial_score in {sorted(TRIAL_SCORES)}")
        if not 1 <= self.min_batch <= self.batch_size <= self.max_batch:
            raise ValueError("need 1 <= min_batch <= batch_size <= max_batch")
        if self.strong_depth < 0 or self.attack_every < 0 or self.prune_tol < 0:
            raise ValueError("strong_depth, attack_every and prune_tol must be >= 0")
        if self.splitting not in SPLITTINGS:
            raise ValueError(f"splitting must be one of {SPLITTINGS}, got {self.splitting!r}")


@dataclass
class Domains(DomainBatch):
    """Open boxes, flattened: `lower`, `upper` `[N, n_in]`; `rows [N, m]` lower bounds of
    `C y - b`; `margin [N]`; `depth [N]` (number of splits from the region's box)."""

    lower: Tensor
    upper: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor


class RegionBab(RegionSearch):
    """Branch and bound on one region; `run(deadline)` returns a `RegionOutcome`."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int = 0):
        self.net, self.region, self.config = net, region, config
        self.shape = tuple(getattr(net, "input_shape", None) or (len(region.lower),))
        param = next(net.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.root = tuple(t.to(self.device) for t in outward_box(region, self.dtype))
        self.k = min(config.trial_dims, self.root[0].shape[1])
        spec = UnsafeSpec.of(region, self.dtype, self.device)
        self.spec = spec.with_combinations() if config.combine_rows else spec
        self.tol = config.prune_tol * (1 + self.spec.b.abs())
        self.value_tol = self.value_tolerance(self.spec)
        self.sizer = BatchSizer(config)
        self.deadline = float("inf")  # monotonic clock; set by run()
        self.generator = torch.Generator().manual_seed(seed)
        self.stats: dict[str, Any] = {"domains": 0, "batches": 0, "max_open": 0, "max_depth": 0}
        self.stats |= {"attacks": 0, "strong_domains": 0}

    def _search(self) -> RegionOutcome:
        deadline = self.deadline
        if not self.region.unsafe:  # no unsafe set: nothing to exclude
            return RegionOutcome("unsat", None, self.stats)
        tick = time.perf_counter()
        root = self._bound(*self.root, torch.zeros(1, dtype=torch.long, device=self.device))
        self.sizer.seed(time.perf_counter() - tick)
        found = self._try_points(root)
        if found is not None:
            return RegionOutcome("sat", found, self.stats)
        open_, last_attack = root.open(), time.monotonic()
        while len(open_):
            left = deadline - time.monotonic()
            if left <= 0:
                return RegionOutcome("timeout", None, self.stats)
            if len(open_) > self.config.max_domains:
                return RegionOutcome("unknown", None, self.stats)
            parents, rest = open_.pop(self._batch(left))
            tick = time.perf_counter()
            children, n_bounded = self._children(parents)
            found = self._try_points(children)
            if found is None and time.monotonic() - last_attack >= self.config.attack_every:
                found, last_attack = self._pgd(children), time.monotonic()
            if found is not None:
                return RegionOutcome("sat", found, self.stats)
            self.sizer.record(n_bounded, time.perf_counter() - tick)
            open_ = Domains.cat([rest, children.open()])
            self.stats["max_open"] = max(self.stats["max_open"], len(open_))
        return RegionOutcome("unsat", None, self.stats)

    def _batch(self, seconds_left: float) -> int:
        """Parents per step (each gives two children per trial dimension)."""
        return max(1, self.sizer.allowed(seconds_left) // (2 * self.k))

    def _bound(self, lower: Tensor, upper: Tensor, depth: Tensor) -> Domains:
        """Bound the boxes `[N, n_in]`: the strong method at depth >= strong_depth."""
        rows = lower.new_empty(lower.shape[0], self.spec.C.shape[0])
        strong = depth >= self.config.strong_depth
        if self.config.strong_method is None:
            strong = torch.zeros_like(strong)
        for use_strong in (False, True):
            index = (strong == use_strong).nonzero().flatten()
            if len(index):
                rows[index] = self._bound_rows(lower[index], upper[index], use_strong)
        margin = min_max(rows - self.tol, self.spec.owner, self.spec.n_polytopes)
        self.stats["domains"] += lower.shape[0]
        return Domains(lower, upper, rows, margin, depth)

    def _bound_rows(self, lower: Tensor, upper: Tensor, strong: bool) -> Tensor:
        """Lower bounds of `C y - b` `[N, m]`, in chunks of the batch size (halved on OOM)."""
        out, start = [], 0
        while start < lower.shape[0]:
            left = self.deadline - time.monotonic()
            if left <= 0:  # between chunks: a big step cannot overrun
                raise DeadlineReachedError
            size = min(self.sizer.size, self.sizer.allowed(left))
            chunk = slice(start, start + size)
            try:
                out.append(self._call_bounds(lower[chunk], upper[chunk], strong))
            except RuntimeError as error:
                if not is_out_of_memory(error) or self.sizer.size == 1:
                    raise
                self.sizer.shrink()
                continue
            start += size
        return torch.cat(out)

    def _call_bounds(self, lower: Tensor, upper: Tensor, strong: bool) -> Tensor:
        method = self.config.strong_method if strong else self.config.method
        options = dict(self.config.strong_options) if strong else {}
        if strong:  # iterative: give it a share of the time left, checked every iteration
            left = self.deadline - time.monotonic()
            options |= {"budget": Budget(seconds=max(1e-3, 0.3 * left)), "check_every": 1}
        result = bounds(
            self.net,
            lower=lower.reshape(-1, *self.shape),
            upper=upper.reshape(-1, *self.shape),
            C=self.spec.C,
            method=method,
            **options,
        )
        self.stats["batches"] += 1
        self.stats["strong_domains"] += lower.shape[0] if strong else 0
        return result.lower - self.spec.b

    def _children(self, parents: Domains) -> tuple[Domains, int]:
        """The bounded children of `parents` (left ones first) and how many boxes were bounded.
        With trial_dims k > 1, per parent the split whose children's summed negative margins
        are largest (pruned children count 0) among its top-k dimensions."""
        scores, n, k = self._scores(parents), len(parents), self.k
        dims = scores.topk(k, dim=1).indices
        splits = [self._split(parents, dims[:, j]) for j in range(k)]
        bounded = self._bound(*(torch.cat(parts) for parts in zip(*splits)))
        self.stats["max_depth"] = max(self.stats["max_depth"], int(bounded.depth.max()))
        if k == 1:
            return bounded, len(bounded)
        margins = bounded.margin.reshape(k, 2, n).clamp(max=0)
        quality = TRIAL_SCORES[self.config.trial_score](margins)
        offset = quality.argmax(0) * 2 * n + torch.arange(n, device=self.device)
        return bounded.take(torch.cat([offset, offset + n])), len(bounded)

    def _split(self, parents: Domains, dim: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Two children per parent (left ones first), halved along `dim [N]`."""
        rows = torch.arange(len(parents), device=self.device)
        mid = (parents.lower[rows, dim] + parents.upper[rows, dim]) / 2
        left_upper, right_lower = parents.upper.clone(), parents.lower.clone()
        left_upper[rows, dim] = mid
        right_lower[rows, dim] = mid
        lower = torch.cat([parents.lower, right_lower])
        upper = torch.cat([left_upper, parents.upper])
        return lower, upper, (parents.depth + 1).repeat(2)

    def _scores(self, parents: Domains) -> Tensor:
        """`[N, n_in]` branching scores: widest normalised width, plus (smear) |dv/dx| x width
        of the critical row (the best row of the worst polytope) at the centre."""
        width = parents.upper - parents.lower
        root_width = (self.root[1] - self.root[0]).clamp_min(1e-12)
        widest = width / root_width
        if self.config.branching == "widest":
            return widest
        rows = self._critical_rows(parents.rows)
        centre = ((parents.lower + parents.upper) / 2).reshape(-1, *self.shape)
        centre.requires_grad_(True)
        with torch.enable_grad():
            out = self.net(centre).flatten(1)
            picked = (out * self.spec.C[rows]).sum()
            (grad,) = torch.autograd.grad(picked, centre)
        smear = grad.flatten(1).abs() * width
        smear = smear / smear.amax(dim=1, keepdim=True).clamp_min(1e-30)
        return smear + 1e-3 * widest * (widest > 0)

    def _critical_rows(self, rows: Tensor) -> Tensor:
        """Per domain the row index of the best row of the polytope that is least excluded."""
        owner, n_poly = self.spec.owner, self.spec.n_polytopes
        init = rows.new_full((rows.shape[0], n_poly), -torch.inf)
        index = owner.unsqueeze(0).expand_as(rows)
        per_poly = init.scatter_reduce(1, index, rows, reduce="amax", include_self=True)
        worst = per_poly.argmin(dim=1)
        mine = owner.unsqueeze(0) == worst.unsqueeze(1)
        return rows.masked_fill(~mine, -torch.inf).argmax(dim=1)

    def _try_points(self, domains: Domains) -> tuple[Tensor, Tensor] | None:
        """Evaluate the centres of the open domains (and the corners of the worst ones when the
        input has at most 6 dimensions); validate the best point if it violates."""
        open_ = domains.open()
        if not len(open_):
            return None
        points = [(open_.lower + open_.upper) / 2]
        n_in = open_.lower.shape[1]
        if n_in <= 6:
            worst = open_.pop(self.config.corner_domains)[0]
            bits = torch.arange(2**n_in, device=self.device)[:, None] >> torch.arange(
                n_in, device=self.device
            )
            mask = (bits & 1).bool()  # [2^n, n_in]
            points.append(
                torch.where(mask, worst.upper[:, None], worst.lower[:, None]).flatten(0, 1)
            )
        points = torch.cat(points)
        return self._validate_best(points, self._violations(points))

    def _pgd(self, domains: Domains) -> tuple[Tensor, Tensor] | None:
        """PGD from random points of the worst open domains, each inside its own box."""
        open_ = domains.open()
        if not len(open_):
            return None
        self.stats["attacks"] += 1
        worst = open_.pop(self.config.attack_domains)[0]
        noise = torch.rand(worst.lower.shape, generator=self.generator, dtype=self.dtype)
        starts = worst.lower + noise.to(self.device) * (worst.upper - worst.lower)
        lower, upper = (t.reshape(-1, *self.shape) for t in (worst.lower, worst.upper))
        attack = self.config.attack
        points, values = pgd(
            self.net, lower, upper, self.spec, starts.reshape(lower.shape), attack.steps
        )
        return self._validate_best(points, values)


def solve_region(
    net: nn.Module, region: Region, deadline: float, config: BabConfig | None = None, seed: int = 0
) -> RegionOutcome:
    """Branch and bound on `region` until `deadline` (`time.monotonic()` seconds), splitting
    inputs or ReLUs as `config.splitting` says (see `splitting_mode`)."""
    config = config or BabConfig()
    if splitting_mode(net, region, config) == "relu":
        return ReluBab(net, region, config).run(deadline)
    return RegionBab(net, region, config, seed).run(deadline)


def splitting_mode(net: nn.Module, region: Region, config: BabConfig) -> str:
    """The splitting mode, "input" or "relu": `config.splitting` unless "auto", which splits
    inputs when there are at most `config.input_split_max_dims` of them (a few input splits
    tighten bounds a lot there) or when the network has other activations than ReLU, and ReLUs
    otherwise."""
    if config.splitting != "auto":
        return config.splitting
    if len(region.lower) <= config.input_split_max_dims or not relu_only(net, len(region.lower)):
        return "input"
    return "relu"
