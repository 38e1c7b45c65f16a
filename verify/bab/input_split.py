"""Branch and bound with input splitting over batches of boxes (one VNN-LIB region): a `Search`
(`RegionBab`) of an `InputBounder` and an `InputBrancher`, run by the shared loop and step of
`verify/bab/common.py`.

Each step pops the open domains with the smallest margin (best-first: the likeliest to hold a
counterexample), splits each in two along one input dimension, bounds all children with one
`verify.bounds` call, prunes the children whose bounds exclude every unsafe polytope, tries the
centres (and corners, for small inputs) of the open children as counterexamples, runs PGD on the
worst ones now and then, and keeps the rest. The region holds when no domain is left (Bunel et
al. 2020, "Branch and bound for piecewise linear neural network verification"; input splitting
with a smear-like heuristic as in Wang et al. 2018, "Efficient formal safety analysis").

Float32 networks are bounded in float32, but a domain is pruned only once the bound that closes
it, evaluated again in float64 (the same method on the same box; alpha-CROWN at the slopes that
gave the float32 bound), still excludes its polytopes (`common.Float64Check`); a domain that
fails stays open and is split further.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from bounds.graph.graph import Graph, build_graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown, crown_intervals
from bounds.types import Budget, Interval, rounded_down
from verify.api import bounds
from verify.attack import UnsafeSpec, min_max, pgd
from verify.bab.common import (
    BatchSizer,
    DeadlineReachedError,
    DomainBatch,
    Float64Check,
    Found,
    RegionSearch,
    in_chunks,
    outward_box,
)
from verify.bab.config import TRIAL_SCORES, BabConfig
from verify.bab.protocols import Children
from verify.property import Region

__all__ = ["Domains", "InputBounder", "InputBrancher", "RegionBab", "box_points"]


@dataclass
class Domains(DomainBatch):
    """Open boxes, flattened: `lower`, `upper` `[N, n_in]`; `rows [N, m]` lower bounds of
    `C y - b`; `margin [N]`; `depth [N]` (number of splits from the region's box)."""

    lower: Tensor
    upper: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor


class InputBounder:
    """The input-splitting `Bounder`: each box by `BabConfig.method` (`verify.bounds`, one call
    per chunk of the batch size, halved on out-of-memory), by `strong_method` from depth
    `strong_depth` on; a closing bound is confirmed in float64 (`confirm`) by the same method
    on the same box (alpha-CROWN at the slopes that gave it). Candidate points: the centres."""

    def __init__(self, graph: Graph, spec: UnsafeSpec, config: BabConfig, check: Float64Check,
                 sizer: BatchSizer, stats: dict[str, Any]):  # fmt: skip
        self.graph, self.spec, self.config, self.check = graph, spec, config, check
        self.sizer, self.stats = sizer, stats
        self.shape = graph.input.shape
        self.tol = config.prune_tol * (1 + spec.b.abs())
        self.deadline = float("inf")

    def bound(self, domains: Domains) -> tuple[Domains, Tensor]:
        bounded = self.confirm(*self.measure(domains))
        return bounded, ((bounded.lower + bounded.upper) / 2).unsqueeze(1)

    def _strong(self, depth: Tensor) -> Tensor:
        """`[N]` bool: the domains of this depth bounded by the strong method."""
        if self.config.strong_method is None:
            return torch.zeros_like(depth, dtype=torch.bool)
        return depth >= self.config.strong_depth

    def measure(self, d: Domains) -> tuple[Domains, Tensor, dict[str, Tensor]]:
        """Bound the boxes (not confirmed): the strong method at depth >= strong_depth. Returns
        the domains, and per domain its row of `slopes` (alpha-CROWN's best output slopes
        `{activation: [K, 2m, *shape]}`, the certificate of its bound for `confirm`) or -1."""
        lower, upper, depth = d.lower, d.upper, d.depth
        rows = lower.new_empty(lower.shape[0], self.spec.C.shape[0])
        strong = self._strong(depth)
        slope_rows = torch.full_like(depth, -1)
        parts: list[dict[str, Tensor]] = []
        count = 0
        for use_strong in (False, True):
            index = (strong == use_strong).nonzero().flatten()
            if len(index):
                found: list[dict[str, Tensor]] = []
                rows[index] = self.bound_rows(lower[index], upper[index], use_strong, found)
                if found and found[0]:  # alpha-CROWN: one row of slopes per domain, in order
                    slope_rows[index] = count + torch.arange(len(index), device=lower.device)
                    parts, count = parts + found, count + len(index)
        slopes = {a: torch.cat([p[a] for p in parts]) for a in parts[0]} if parts else {}
        margin = min_max(rows - self.tol, self.spec.owner, self.spec.n_polytopes)
        self.stats["domains"] += lower.shape[0]
        return Domains(lower, upper, rows, margin, depth), slope_rows, slopes

    def bound_rows(
        self, lower: Tensor, upper: Tensor, strong: bool, slopes: list | None = None
    ) -> Tensor:
        """Lower bounds of `C y - b` `[N, m]`, in chunks of the batch size (halved on OOM);
        appends each chunk's alpha-CROWN best output slopes to `slopes` (when given)."""
        def chunk(part: slice) -> Tensor:
            return self._call_bounds(lower[part], upper[part], strong, slopes)

        return torch.cat(in_chunks(len(lower), self.sizer, self.deadline, chunk, whole=True))

    def _call_bounds(
        self, lower: Tensor, upper: Tensor, strong: bool, slopes: list | None = None
    ) -> Tensor:
        method = self.config.strong_method if strong else self.config.method
        options = dict(self.config.strong_options) if strong else {}
        # The time left (a share of it for the iterative strong method): every method honours
        # a seconds budget (CROWN's layers keep IBP's intervals past it; IBP has nothing to cut).
        left = max(1e-3, self.deadline - time.monotonic())
        options |= {"budget": Budget(seconds=0.3 * left if strong else left)}
        result = bounds(
            self.graph,
            lower=lower.reshape(-1, *self.shape),
            upper=upper.reshape(-1, *self.shape),
            C=self.spec.C,
            method=method,
            exact=False,  # a search bound: every closing one is rechecked exactly (`confirm`)
            **options,
        )
        self.stats["batches"] += 1
        self.stats["strong_domains"] += lower.shape[0] if strong else 0
        if slopes is not None and "best_slopes" in result.stats:
            slopes.append(result.stats["best_slopes"])
        return result.lower - self.spec.b

    # ----- the float64 recheck of closing bounds -----

    def confirm(self, d: Domains, slope_rows: Tensor, slopes: dict[str, Tensor]) -> Domains:
        """`d` with its closed domains (margin > 0) confirmed in float64 (`_bounds64`); those
        that fail stay open with their float64 rows (rounded down) and a margin <= 0."""
        closed = (d.margin > 0).nonzero().flatten()
        if not self.check.active or not len(closed):
            self.stats["closed"] = self.stats.get("closed", 0) + len(closed)
            return d
        if not self.check.fits(len(closed), self.deadline):  # unconfirmed: they must not count
            raise DeadlineReachedError
        tick = time.perf_counter()
        spec = self.check.spec
        rows64 = self._bounds64(d.lower[closed], d.upper[closed], d.depth[closed],
                                slope_rows[closed], slopes)  # fmt: skip
        margin64 = min_max(rows64 - self.check.tol, spec.owner, spec.n_polytopes)
        failed = closed[margin64 <= 0]
        rows, margin = d.rows.clone(), d.margin.clone()
        rows[failed] = rounded_down(rows64[margin64 <= 0], rows.dtype)
        margin[failed] = margin64[margin64 <= 0].to(margin.dtype).clamp(max=0)
        self.check.record(len(closed), len(failed), time.perf_counter() - tick)
        self.stats["closed"] = self.stats.get("closed", 0) + len(closed) - len(failed)
        return Domains(d.lower, d.upper, rows, margin, d.depth)

    def _bounds64(self, lower, upper, depth, slope_rows, slopes) -> Tensor:
        """Float64 lower bounds of `C y - b` `[K, m]` (C, b as in the VNN-LIB file) on the boxes
        `lower`, `upper [K, n_in]` (exact in float64), by each domain's own method: alpha-CROWN
        at its certificate slopes (`slope_rows` into `slopes`), otherwise the method itself."""
        out = torch.empty(len(lower), self.check.spec.C.shape[0], dtype=torch.float64,
                          device=lower.device)  # fmt: skip
        strong = self._strong(depth)
        for use_strong in (False, True):
            index = (strong == use_strong).nonzero().flatten()
            for start in range(0, len(index), self.sizer.size):
                part = index[start : start + self.sizer.size]
                given = {}
                if bool((slope_rows[part] >= 0).all()):
                    given = {a: t[slope_rows[part]] for a, t in slopes.items()}
                out[part] = self._call_bounds64(lower[part], upper[part], use_strong, given)
        return out

    def _call_bounds64(self, lower, upper, strong: bool, slopes: dict[str, Tensor]) -> Tensor:
        method = self.config.strong_method if strong else self.config.method
        box = Interval(*(t.to(torch.float64).reshape(-1, *self.shape) for t in (lower, upper)))
        spec = self.check.spec
        C = spec.C.expand(len(lower), *spec.C.shape)
        graph = self.check.graph
        if method == "crown":
            lower64 = self._crown64(box, C)
        elif method == "alpha-crown" and slopes:  # the certificate: one pass at those slopes
            config = AlphaCrownConfig(iterations=0, optimize_intermediate=False, compile=False)
            base = crown_intervals(graph, box, every_neuron=True)
            lower64 = alpha_crown(graph, box, C, config, intervals=base, init_slopes=slopes)[0]
        else:
            options = dict(self.config.strong_options) if strong else {}
            lower64 = bounds(graph, lower=box.lower, upper=box.upper, C=C, method=method,
                             **options).lower  # fmt: skip
        return lower64 - spec.b

    def _crown64(self, box: Interval, C: Tensor) -> Tensor:
        """Float64 CROWN lower bounds `[K, m]` on the boxes; for the boxes it leaves open, also
        with every neuron bounded by CROWN (a box's float32 bound depended a little on its
        batch, see `crown_intervals`), keeping the better (both are valid)."""
        spec, graph = self.check.spec, self.check.graph
        lower = crown(graph, box, C)[0]
        margin = min_max(lower - spec.b - self.check.tol, spec.owner, spec.n_polytopes)
        again = (margin <= 0).nonzero().flatten()
        if len(again):
            sub = Interval(box.lower[again], box.upper[again])
            lower[again] = torch.maximum(lower[again], crown(graph, sub, C[again], None, True)[0])
        return lower


def box_points(domains: Domains, corner_domains: int) -> Tensor:
    """Candidate counterexamples of open boxes `[M, n_in]`: the centres, and the corners of the
    `corner_domains` worst boxes when the input has at most 6 dimensions."""
    points = [(domains.lower + domains.upper) / 2]
    n_in = domains.lower.shape[1]
    if n_in <= 6 and len(domains):
        worst = domains.pop(corner_domains)[0]
        bits = torch.arange(2**n_in, device=worst.lower.device)[:, None] >> torch.arange(
            n_in, device=worst.lower.device
        )
        mask = (bits & 1).bool()  # [2^n, n_in]
        points.append(torch.where(mask, worst.upper[:, None], worst.lower[:, None]).flatten(0, 1))
    return torch.cat(points)


class InputBrancher:
    """The input-splitting `Brancher`: each parent is halved along one input dimension, chosen
    by `BabConfig.branching` ("smear": |gradient| x width of the critical row at the centre;
    "widest": normalised width); with `trial_dims` k > 1 the top-k dimensions are all tried
    and the pair of children whose `trial_score` of their margins is best is kept."""

    def __init__(self, net: nn.Module, root: tuple[Tensor, Tensor], spec: UnsafeSpec,
                 config: BabConfig, stats: dict[str, Any]):  # fmt: skip
        self.net, self.root, self.spec, self.config, self.stats = net, root, spec, config, stats
        self.k = min(config.trial_dims, root[0].shape[1])
        self.shape = tuple(getattr(net, "input_shape", None) or (root[0].shape[1],))

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
        """`[N, n_in]` branching scores: widest normalised width, plus (smear) |dv/dx| x width
        of the critical row (the best row of the worst polytope) at the centre."""
        width = parents.upper - parents.lower
        root_width = (self.root[1] - self.root[0]).clamp_min(1e-12)
        widest = width / root_width
        if self.config.branching == "widest":
            return widest
        rows = self.critical_rows(parents.rows)
        centre = ((parents.lower + parents.upper) / 2).reshape(-1, *self.shape)
        centre.requires_grad_(True)
        with torch.enable_grad():
            out = self.net(centre).flatten(1)
            picked = (out * self.spec.C[rows]).sum()
            (grad,) = torch.autograd.grad(picked, centre)
        smear = grad.flatten(1).abs() * width
        smear = smear / smear.amax(dim=1, keepdim=True).clamp_min(1e-30)
        return smear + 1e-3 * widest * (widest > 0)

    def critical_rows(self, rows: Tensor) -> Tensor:
        """Per domain the row index of the best row of the polytope that is least excluded."""
        owner, n_poly = self.spec.owner, self.spec.n_polytopes
        init = rows.new_full((rows.shape[0], n_poly), -torch.inf)
        index = owner.unsqueeze(0).expand_as(rows)
        per_poly = init.scatter_reduce(1, index, rows, reduce="amax", include_self=True)
        worst = per_poly.argmin(dim=1)
        mine = owner.unsqueeze(0) == worst.unsqueeze(1)
        return rows.masked_fill(~mine, -torch.inf).argmax(dim=1)


class RegionBab(RegionSearch):
    """Input-splitting branch and bound on one region (a `Search`: `run(deadline)` returns a
    `RegionOutcome`): `InputBounder` and `InputBrancher` in the shared step."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int = 0):
        self.net, self.region, self.config = net, region, config
        self.shape = tuple(getattr(net, "input_shape", None) or (len(region.lower),))
        param = next(net.parameters())
        self.dtype, self.device = param.dtype, param.device
        graph = build_graph(net, self.shape)  # once: `bounds` gets the graph, not the net
        graph = graph.to(self.dtype, self.device) if self.device.type != "cpu" else graph
        self.root = tuple(t.to(self.device) for t in outward_box(region, self.dtype))
        spec = UnsafeSpec.of(region, self.dtype, self.device)
        self.spec = spec.with_combinations() if config.combine_rows else spec
        self.value_tol = self.value_tolerance(self.spec)
        self.sizer = BatchSizer(config)
        self.generator = torch.Generator().manual_seed(seed)
        self.stats: dict[str, Any] = {"domains": 0, "batches": 0, "max_open": 0, "max_depth": 0}
        self.stats |= {"attacks": 0, "strong_domains": 0, "attack_seconds": 0.0}
        check = Float64Check(graph, region, config, self.stats, config.combine_rows)
        self.bounder = InputBounder(graph, self.spec, config, check, self.sizer, self.stats)
        self.brancher = InputBrancher(net, self.root, self.spec, config, self.stats)
        self.fanout = 2 * self.brancher.k
        self.last_attack = self.started = time.monotonic()

    @property
    def deadline(self) -> float:
        return self.bounder.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.bounder.deadline = value

    def begin(self) -> tuple[Domains, Found]:
        """The region's box bounded, confirmed and tried: its open domains (none or the root)
        and a validated counterexample, if one was found."""
        lower, upper = self.root
        depth = torch.zeros(1, dtype=torch.long, device=self.device)
        unknown = lower.new_full((1, self.spec.C.shape[0]), -torch.inf)
        tick = time.perf_counter()
        root, slope_rows, slopes = self.bounder.measure(Domains(lower, upper, unknown,
                                                                unknown[:, 0], depth))  # fmt: skip
        self.sizer.seed(time.perf_counter() - tick)
        open_ = self.bounder.confirm(root, slope_rows, slopes).open()
        self.last_attack = self.started = time.monotonic()
        return open_, self._try_points(box_points(open_, self.config.corner_domains))

    def too_many(self, open_: Domains) -> bool:
        return len(open_) > self.config.max_domains

    def unproven(self) -> int:
        """Domains dropped without a proof: none in input splitting."""
        return 0

    def _attack(self, children: Children) -> Found:
        """PGD from random points of the worst open children, each inside its own box."""
        open_ = children.domains
        if not len(open_):
            return None
        worst = open_.pop(self.config.attack_domains)[0]
        noise = torch.rand(worst.lower.shape, generator=self.generator, dtype=self.dtype)
        starts = worst.lower + noise.to(self.device) * (worst.upper - worst.lower)
        lower, upper = (t.reshape(-1, *self.shape) for t in (worst.lower, worst.upper))
        attack = self.config.attack
        points, values = pgd(
            self.net, lower, upper, self.spec, starts.reshape(lower.shape), attack.steps,
            deadline=self.deadline,
        )  # fmt: skip
        return self._validate_best(points, values)
