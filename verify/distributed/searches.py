"""The serial branch-and-bound searches, one step at a time over a given set of open domains:
what a shard worker (and the coordinator, until the workers are up) runs.

`InputShard` is `verify.bab.RegionBab` and `ReluShard` is `verify.relu_bab.ReluBab`; they add no
bounding, pruning or counterexample logic of their own. A step is the body of the serial loop
(`RegionBab._search`, `ReluBab._search`): pop the parents of smallest margin, `_children` /
`_step` (bound the children, confirm every closing bound in float64, keep the open ones), try
the open children's points, PGD now and then. So a domain is pruned by exactly the serial
procedure, wherever it runs, and a shard's "no open domain left" means what the serial "unsat"
means. Domains travel between processes as the searches' own dataclasses (`Domains`,
`ReluDomains`: boxes, bounds, depths, and for ReLU splitting the splits with their warm-start
slopes and multipliers), moved to the CPU (`portable`).

ReLU splitting needs the root's intermediate bounds (`base`, `base64`) on every worker: the
coordinator computes the root once (`ReluShard.begin`) and ships them (`context`), so every
domain is bounded against the same intervals as in the serial search.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from bounds.types import Interval
from verify.bab import BabConfig, Domains, RegionBab, splitting_mode
from verify.bab_common import DomainBatch
from verify.property import Polytope, Region, VnnlibProperty
from verify.relu_bab import ReluBab, ReluDomains
from verify.verifier import verify

Found = tuple[Tensor, Tensor] | None


def portable(d: DomainBatch) -> DomainBatch:
    """`d` with every tensor on the CPU (to ship between processes)."""
    return type(d)(*(t.detach().cpu() for t in d._fields()))


def moved(d: DomainBatch, device: torch.device) -> DomainBatch:
    """`d` with every tensor on `device`."""
    return type(d)(*(t.to(device) for t in d._fields()))


def shards_of(d: DomainBatch, n: int) -> list[DomainBatch]:
    """`d` dealt into `min(n, len(d))` shards by margin order (shard j gets the j-th, (j+n)-th,
    ... smallest margins), so each shard holds some of the hardest domains."""
    order = d.margin.argsort()
    n = max(1, min(n, len(d)))
    return [d.take(order[j::n]) for j in range(n)]


def donation(d: DomainBatch, pieces: int) -> tuple[DomainBatch, list[DomainBatch]]:
    """What a worker keeps and what it gives to `pieces` hungry workers: `d` dealt by margin
    order into `pieces + 1` parts (needs `len(d) >= 2`; at most `len(d) - 1` pieces)."""
    parts = shards_of(d, min(pieces + 1, len(d)))
    return parts[0], parts[1:]


@dataclass(frozen=True)
class Context:
    """What every worker of one region shares: the first per-domain cost estimate (the batch
    sizer's seed) and, for ReLU splitting, the root's flat intervals `[1, n]` (`base` in the
    network's dtype, `base64` its float64 twin)."""

    seed_cost: float | None
    base: Interval | None = None
    base64: Interval | None = None


class InputShard(RegionBab):
    """Input splitting, steppable (see the module docstring)."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int = 0):
        super().__init__(net, region, config, seed)
        self.last_attack = time.monotonic()

    def begin(self) -> tuple[Domains, Found]:
        """The region's box bounded, confirmed and tried (the serial root): its open domains
        (none or the root) and a validated counterexample, if one was found."""
        depth = torch.zeros(1, dtype=torch.long, device=self.device)
        tick = time.perf_counter()
        root, slopes = self._bound(*self.root, depth)
        self.sizer.seed(time.perf_counter() - tick)
        root = self._confirm(root, *slopes)
        self.last_attack = time.monotonic()
        return root.open(), self._try_points(root)

    def context(self) -> Context:
        return Context(self.sizer.per_domain())

    def adopt(self, context: Context) -> None:
        if context.seed_cost is not None:
            self.sizer.seed(context.seed_cost)

    def receive(self, shard: Domains) -> Domains:
        return moved(shard, self.device)

    def step(self, open_: Domains) -> tuple[Domains, Found]:
        """One step of `RegionBab._search`'s loop on `open_` (the deadline must not have
        passed): the open domains after it, and a validated counterexample if one was found."""
        parents, rest = open_.pop(self._batch(self.deadline - time.monotonic()))
        tick = time.perf_counter()
        children, n_bounded = self._children(parents)
        found = self._try_points(children)
        if found is None and time.monotonic() - self.last_attack >= self.config.attack_every:
            found, self.last_attack = self._pgd(children), time.monotonic()
        if found is not None:
            return open_, found
        self.sizer.record(n_bounded, time.perf_counter() - tick)
        open_ = Domains.cat([rest, children.open()])
        self.stats["max_open"] = max(self.stats["max_open"], len(open_))
        return open_, None

    def too_many(self, open_: Domains) -> bool:
        """Past the domain limit (the serial answer there is "unknown")."""
        return len(open_) > self.config.max_domains

    def unproven(self) -> int:
        """Domains dropped without a proof (none in input splitting)."""
        return 0


class ReluShard(ReluBab):
    """ReLU splitting, steppable (see the module docstring)."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int = 0):
        super().__init__(net, region, config)
        self.last_attack = self.started = time.monotonic()

    def begin(self) -> tuple[ReluDomains, Found]:
        """The serial root (`ReluBab._root`: intermediate bounds, root bounds, their float64
        confirmation and primal points): the open root domains and a counterexample or None."""
        tick = time.perf_counter()
        open_, found = self._root()
        self.stats["root_seconds"] = round(time.perf_counter() - tick, 3)
        self.last_attack = self.started = time.monotonic()
        return open_, found

    def context(self) -> Context:
        return Context(self.sizer.per_domain(), self.base, self.base64)

    def adopt(self, context: Context) -> None:
        """Bound against the coordinator's root intervals, as the serial search does."""
        if context.base is None or context.base64 is None:
            raise ValueError("a ReLU-splitting shard needs the root's intervals")
        device = self.device
        self.base = Interval(context.base.lower.to(device), context.base.upper.to(device))
        self.base64 = Interval(context.base64.lower.to(device), context.base64.upper.to(device))
        if context.seed_cost is not None:
            self.sizer.seed(context.seed_cost)

    def receive(self, shard: ReluDomains) -> ReluDomains:
        return moved(shard, self.device)

    def step(self, open_: ReluDomains) -> tuple[ReluDomains, Found]:
        """One step of `ReluBab._search`'s loop on `open_` (see `InputShard.step`)."""
        left = self.deadline - time.monotonic()
        parents, rest = open_.pop(max(1, self.sizer.allowed(left) // 2))
        tick = time.perf_counter()
        children, found = self._step(parents)
        if found is None and self._attack_due(self.last_attack, self.started):
            tick_attack = time.monotonic()
            found, self.last_attack = self._pgd(), time.monotonic()
            self.stats["attack_seconds"] += self.last_attack - tick_attack
        if found is not None:
            return open_, found
        self.sizer.record(2 * len(parents), time.perf_counter() - tick)
        open_ = ReluDomains.cat([rest, children])
        self.stats["max_open"] = max(self.stats["max_open"], len(open_))
        return open_, None

    def too_many(self, open_: ReluDomains) -> bool:
        return len(open_) > self.max_open

    def unproven(self) -> int:
        """Domains with nothing left to split that their bound did not exclude: dropped from
        the search, so the answer cannot be "unsat" (as in the serial search)."""
        return int(self.stats["unsplittable"])


def warm_up() -> None:
    """Verify a tiny property once: a fresh worker process pays torch's and the verifier's
    first-call costs here, not inside an instance's time limit."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1)).eval()
    unsafe = (Polytope(np.ones((1, 1)), np.array([-100.0])),)
    prop = VnnlibProperty("<warm-up>", 2, 1, (Region(-np.ones(2), np.ones(2), unsafe),))
    verify(net, prop, timeout=10.0)


def make_search(net: nn.Module, region: Region, config: BabConfig, seed: int):
    """The steppable search `splitting_mode` picks for `region`, and its mode name."""
    mode = splitting_mode(net, region, config)
    if mode == "relu":
        return ReluShard(net, region, config, seed), mode
    return InputShard(net, region, config, seed), mode


def search_for(mode: str, net: nn.Module, region: Region, config: BabConfig, seed: int):
    """The steppable search of `mode` ("input" or "relu")."""
    return (ReluShard if mode == "relu" else InputShard)(net, region, config, seed)
