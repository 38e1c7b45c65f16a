"""The serial branch-and-bound searches, one step at a time over a given set of open domains:
what a shard worker (and the coordinator, until the workers are up) runs.

`InputShard` is `verify.bab.RegionBab` and `ReluShard` is `verify.bab.ReluBab`; they add no
bounding, pruning or counterexample logic of their own. A step is the serial search's own
`step` (`verify.bab.search.Search.step`): pop the parents of smallest margin, branch and
bound them (every closing bound confirmed in float64, the open children kept), try the open
children's points, PGD now and then. So a domain is pruned by exactly the serial
procedure, wherever it runs, and a shard's "no open domain left" means what the serial "unsat"
means. Domains travel between processes as the searches' own dataclasses (`Domains`,
`ReluDomains`: boxes, bounds, depths, and for ReLU splitting the splits with their warm-start
slopes and multipliers), moved to the CPU (`portable`). The hard bounder's stored warm starts
(`verify.bab.relu.warm`) do not travel: a ReLU domain arriving at a worker has its id dropped
(`ReluShard.receive`) and its hard bound starts from its slopes, as without warm starts.

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

from bounds.graph.graph import build_graph
from bounds.types import Interval
from verify.attack import find_counterexample
from verify.bab import (
    BabConfig,
    Domains,
    RegionBab,
    ReluBab,
    ReluDomains,
    input_shape,
    solve_region,
    splitting_mode,
)
from verify.bab.common import DomainBatch
from verify.property import Polytope, Region

Found = tuple[Tensor, Tensor] | None


def portable(d: DomainBatch) -> DomainBatch:
    """`d` with every tensor on the CPU (to ship between processes)."""
    return type(d)(*(None if t is None else t.detach().cpu() for t in d._fields()))


def moved(d: DomainBatch, device: torch.device) -> DomainBatch:
    """`d` with every tensor on `device`."""
    return type(d)(*(None if t is None else t.to(device) for t in d._fields()))


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
    """Input splitting, steppable (see the module docstring): the serial search's own
    `begin`, `step`, `too_many` and `unproven`, plus what a shard needs to join a run."""

    def context(self) -> Context:
        return Context(self.sizer.per_domain())

    def adopt(self, context: Context) -> None:
        if context.seed_cost is not None:
            self.sizer.seed(context.seed_cost)

    def receive(self, shard: Domains) -> Domains:
        return moved(shard, self.device)


class ReluShard(ReluBab):
    """ReLU splitting, steppable (see the module docstring)."""

    def context(self) -> Context:
        easy = self.bounder.easy
        return Context(self.sizer.per_domain(), easy.base, easy.base64)

    def adopt(self, context: Context) -> None:
        """Bound against the coordinator's root intervals, as the serial search does."""
        if context.base is None or context.base64 is None:
            raise ValueError("a ReLU-splitting shard needs the root's intervals")
        device, easy = self.device, self.bounder.easy
        easy.base = Interval(context.base.lower.to(device), context.base.upper.to(device))
        easy.base64 = Interval(context.base64.lower.to(device), context.base64.upper.to(device))
        if context.seed_cost is not None:
            self.sizer.seed(context.seed_cost)

    def receive(self, shard: ReluDomains) -> ReluDomains:
        """`shard` on this search's device, without warm-start ids (they name entries of the
        sender's store, not of this one)."""
        d = moved(shard, self.device)
        none = torch.full_like(d.warm, -1)
        return ReluDomains(d.splits, d.alpha, d.beta, d.poly, d.rows, d.margin, d.depth, d.stall,
                           none)  # fmt: skip


def warm_up() -> None:
    """Decide a tiny region once, as the verifier does (attack, then branch and bound, called
    directly): a fresh worker process pays torch's and the search's first-call costs here, not
    inside an instance's time limit."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1)).eval()
    unsafe = (Polytope(np.ones((1, 1)), np.array([-100.0])),)
    region = Region(-np.ones(2), np.ones(2), unsafe)
    config = BabConfig()
    deadline = time.monotonic() + 10.0
    if find_counterexample(net, region, config=config.attack, seed=0, deadline=deadline) is None:
        solve_region(net, region, deadline, config, 0)


def make_search(
    net: nn.Module, region: Region, config: BabConfig, seed: int
) -> tuple[InputShard | ReluShard, str]:
    """The steppable search `splitting_mode` picks for `region`, and its mode name (the
    network's graph built once, for both)."""
    graph = build_graph(net, input_shape(net, region))
    mode = splitting_mode(net, region, config, graph)
    return (ReluShard if mode == "relu" else InputShard)(net, region, config, seed, graph), mode


def search_for(
    mode: str, net: nn.Module, region: Region, config: BabConfig, seed: int
) -> InputShard | ReluShard:
    """The steppable search of `mode` ("input" or "relu")."""
    return (ReluShard if mode == "relu" else InputShard)(net, region, config, seed)
