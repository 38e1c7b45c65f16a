"""Branch and bound on one VNN-LIB region: input splitting over batches of boxes (here), or
ReLU splitting (`verify/relu_bab.py`); `solve_region` picks one by the number of inputs.

Each step pops the open domains with the smallest margin (best-first: the likeliest to hold a
counterexample), splits each in two along one input dimension, bounds all children with one
`verify.bounds` call, prunes the children whose bounds exclude every unsafe polytope, tries the
centres (and corners, for small inputs) of the open children as counterexamples, runs PGD on the
worst ones now and then, and keeps the rest. The region holds when no domain is left (Bunel et
al. 2020, "Branch and bound for piecewise linear neural network verification"; input splitting
with a smear-like heuristic as in Wang et al. 2018, "Efficient formal safety analysis").

Float32 networks are bounded in float32, but a domain is pruned only once the bound that closes
it, evaluated again in float64 (the same method on the same box; alpha-CROWN at the slopes that
gave the float32 bound), still excludes its polytopes (`bab_common.Float64Check`); a domain that
fails stays open and is split further.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown, crown_intervals
from bounds.types import Budget, Interval
from verify.api import bounds, network_graph
from verify.attack import AttackConfig, UnsafeSpec, min_max, pgd
from verify.bab_common import (
    BatchSizer,
    DeadlineReachedError,
    DomainBatch,
    Float64Check,
    RegionOutcome,
    RegionSearch,
    is_out_of_memory,
    outward_box,
    rounded_down,
)
from verify.property import Region
from verify.relu_bab import ReluBab, ReluSplitConfig, relu_only

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
    prune_tol: a domain is pruned when its margin exceeds prune_tol * (1 + |b|) (rounding);
    float64_recheck: a float32 network's closing bounds are evaluated again in float64 before
    a domain is pruned (off only to measure what it costs: float32 rounding can then prune a
    domain that holds a counterexample; see `bab_common.Float64Check`). splitting: "input", "relu" or "auto" (input splitting for at most input_split_max_dims
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
    float64_recheck: bool = True
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
        graph = network_graph(net, self.shape)  # once: `bounds` gets the graph, not the net
        self.graph = graph.to(self.dtype, self.device) if self.device.type != "cpu" else graph
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
        self.check = Float64Check(self.graph, region, config, self.stats, config.combine_rows)

    def _search(self) -> RegionOutcome:
        deadline = self.deadline
        if not self.region.unsafe:  # no unsafe set: nothing to exclude
            return RegionOutcome("unsat", None, self.stats)
        tick = time.perf_counter()
        root, slopes = self._bound(*self.root, torch.zeros(1, dtype=torch.long, device=self.device))
        self.sizer.seed(time.perf_counter() - tick)
        root = self._confirm(root, *slopes)
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

    def _strong(self, depth: Tensor) -> Tensor:
        """`[N]` bool: the domains of this depth bounded by the strong method."""
        if self.config.strong_method is None:
            return torch.zeros_like(depth, dtype=torch.bool)
        return depth >= self.config.strong_depth

    def _bound(self, lower: Tensor, upper: Tensor, depth: Tensor) -> tuple[Domains, tuple]:
        """Bound the boxes `[N, n_in]`: the strong method at depth >= strong_depth. Returns the
        domains and `(slope_rows [N], slopes)`: per domain its row of `slopes` (alpha-CROWN's
        best output slopes `{activation: [K, 2m, *shape]}`, the certificate of its bound for
        `_confirm`) or -1."""
        rows = lower.new_empty(lower.shape[0], self.spec.C.shape[0])
        strong = self._strong(depth)
        slope_rows = torch.full_like(depth, -1)
        parts: list[dict[str, Tensor]] = []
        count = 0
        for use_strong in (False, True):
            index = (strong == use_strong).nonzero().flatten()
            if len(index):
                found: list[dict[str, Tensor]] = []
                rows[index] = self._bound_rows(lower[index], upper[index], use_strong, found)
                if found and found[0]:  # alpha-CROWN: one row of slopes per domain, in order
                    slope_rows[index] = count + torch.arange(len(index), device=self.device)
                    parts, count = parts + found, count + len(index)
        slopes = {a: torch.cat([p[a] for p in parts]) for a in parts[0]} if parts else {}
        margin = min_max(rows - self.tol, self.spec.owner, self.spec.n_polytopes)
        self.stats["domains"] += lower.shape[0]
        return Domains(lower, upper, rows, margin, depth), (slope_rows, slopes)

    def _bound_rows(
        self, lower: Tensor, upper: Tensor, strong: bool, slopes: list | None = None
    ) -> Tensor:
        """Lower bounds of `C y - b` `[N, m]`, in chunks of the batch size (halved on OOM);
        appends each chunk's alpha-CROWN best output slopes to `slopes` (when given)."""
        out, start = [], 0
        while start < lower.shape[0]:
            left = self.deadline - time.monotonic()
            size = min(self.sizer.size, self.sizer.allowed(left))
            if left <= 0 or not self.sizer.fits(min(size, len(lower) - start), left):
                raise DeadlineReachedError  # between chunks: no chunk ends past the deadline
            chunk = slice(start, start + size)
            try:
                out.append(self._call_bounds(lower[chunk], upper[chunk], strong, slopes))
            except RuntimeError as error:
                if not is_out_of_memory(error) or self.sizer.size == 1:
                    raise
                self.sizer.shrink()
                continue
            start += size
        return torch.cat(out)

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
            **options,
        )
        self.stats["batches"] += 1
        self.stats["strong_domains"] += lower.shape[0] if strong else 0
        if slopes is not None and "best_slopes" in result.stats:
            slopes.append(result.stats["best_slopes"])
        return result.lower - self.spec.b

    # ----- the float64 recheck of closing bounds -----

    def _confirm(self, d: Domains, slope_rows: Tensor, slopes: dict[str, Tensor]) -> Domains:
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
                          device=self.device)  # fmt: skip
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

    def _children(self, parents: Domains) -> tuple[Domains, int]:
        """The bounded children of `parents` (left ones first) and how many boxes were bounded.
        With trial_dims k > 1, per parent the split whose children's summed negative margins
        are largest (pruned children count 0) among its top-k dimensions."""
        scores, n, k = self._scores(parents), len(parents), self.k
        dims = scores.topk(k, dim=1).indices
        splits = [self._split(parents, dims[:, j]) for j in range(k)]
        bounded, (slope_rows, slopes) = self._bound(*(torch.cat(parts) for parts in zip(*splits)))
        self.stats["max_depth"] = max(self.stats["max_depth"], int(bounded.depth.max()))
        if k == 1:
            return self._confirm(bounded, slope_rows, slopes), len(bounded)
        margins = bounded.margin.reshape(k, 2, n).clamp(max=0)
        quality = TRIAL_SCORES[self.config.trial_score](margins)
        offset = quality.argmax(0) * 2 * n + torch.arange(n, device=self.device)
        keep = torch.cat([offset, offset + n])
        return self._confirm(bounded.take(keep), slope_rows[keep], slopes), len(bounded)

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
            self.net, lower, upper, self.spec, starts.reshape(lower.shape), attack.steps,
            deadline=self.deadline,
        )  # fmt: skip
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
