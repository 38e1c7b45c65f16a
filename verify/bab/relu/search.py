"""Branch and bound with ReLU splitting over batches of domains (one VNN-LIB region): a `Search`
(`verify.bab.search`) of a `StratifiedBounder` (alpha-beta-CROWN, `verify.bab.relu.bounder`,
and optionally a hard bounder on the domains predicted hard, `verify.bab.relu.stratified`), a
`ReluBrancher` (`verify.bab.relu.brancher`: BaBSR or FSB) and a `ReluAttacker`.

Each step pops the open domains of smallest margin (best-first), branches and bounds them, prunes
those whose bound excludes their polytope, tries the open children's primal points (the box
minimisers of their bounds) as counterexamples, runs PGD from the worst ones now and then, and
keeps the rest (Bunel et al. 2020, JMLR; Wang et al. 2021, beta-CROWN; De Palma et al. 2021,
FSB). The region holds when no domain is left; a domain with no neuron left to split that its
bound cannot exclude makes the answer "unknown", never "unsat".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bounds.graph.graph import Graph, build_graph
from bounds.types import Interval
from verify.attack import UnsafeSpec, pgd
from verify.bab.common import BatchSizer, Float64Check, Found, outward_box, prune_tolerance
from verify.bab.config import BabConfig
from verify.bab.protocols import Children
from verify.bab.relu.bounder import ReluBounder
from verify.bab.relu.brancher import ReluBrancher
from verify.bab.relu.domains import Layout, Target, polytope_rows
from verify.bab.relu.stratified import HardBounder, StratifiedBounder
from verify.bab.search import Clock, Counterexamples, Search
from verify.property import Region


class ReluAttacker:
    """PGD over the box towards the polytope of the worst open child, from the primal points of
    the worst open children of that polytope."""

    def __init__(self, target: Target, checks: Counterexamples, config: BabConfig) -> None:
        self.t, self.checks, self.config = target, checks, config

    def attack(self, children: Children) -> Found:
        d = children.domains
        worst = d.margin.argsort()[: self.config.attack_domains]
        if not len(worst):
            return None
        t = self.t
        points, poly = children.starts[worst], d.poly[worst]
        target = poly[0]
        starts = points[poly == target].reshape(-1, *self.checks.shape)
        rows = t.rows_of[target]
        owner = torch.zeros(len(rows), dtype=torch.long, device=t.device)
        spec = UnsafeSpec(t.spec.C[rows], t.spec.b[rows], owner, 1)
        steps = self.config.attack.steps
        found, values = pgd(self.checks.net, t.box.lower, t.box.upper, spec, starts, steps,
                            deadline=t.deadline)  # fmt: skip
        return self.checks.validate_best(found, values)


def max_open(target: Target, config: BabConfig) -> int:
    """Open domains allowed: `max_domains`, and `max_memory_gb` of slopes and multipliers."""
    t = target
    rows = 1 if t.rows_of is None else t.rows_of.shape[1]
    size = t.box.lower.element_size()
    per_domain = t.layout.total * (2 * rows * size + 1) + rows * size + 40
    return int(min(config.max_domains, config.relu.max_memory_gb * 1e9 / per_domain))


class ReluBab(Search):
    """ReLU-splitting branch and bound on one region: the `Search` of a `StratifiedBounder`, a
    `ReluBrancher` and a `ReluAttacker` sharing one `Target` (`run(deadline)` returns a
    `RegionOutcome`). `config` is a `verify.bab.BabConfig` (its `relu` field holds the
    ReLU-splitting settings; batch sizes, attacks, `max_domains` and `prune_tol` are shared);
    `graph`: the network's graph when the caller has built it (built here otherwise);
    `bounder_class`, `brancher_class`: the easy bounder's and the brancher's classes (the
    certificate writer's record, `verify.bab.relu.certify`)."""

    bounder_class: type[ReluBounder] = ReluBounder
    brancher_class: type[ReluBrancher] = ReluBrancher

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int = 0,
                 graph: Graph | None = None) -> None:  # fmt: skip
        self.net, self.region, self.config, self.settings = net, region, config, config.relu
        self.shape = tuple(getattr(net, "input_shape", None) or (len(region.lower),))
        param = next(net.parameters())
        self.dtype, self.device = param.dtype, param.device
        stats: dict[str, Any] = {"mode": "relu", "domains": 0, "batches": 0, "max_open": 0}
        stats |= {"max_depth": 0, "attacks": 0, "unsplittable": 0}
        stats |= {"root_seconds": 0.0, "branch_seconds": 0.0, "attack_seconds": 0.0}
        graph = build_graph(net, self.shape) if graph is None else graph
        graph = graph.to(self.dtype, self.device) if self.device.type != "cpu" else graph
        check = Float64Check(graph, region, config, stats, combine=False)
        box = Interval(*(x.to(self.device).reshape(1, *self.shape)
                         for x in outward_box(region, self.dtype)))  # fmt: skip
        dtype64 = check.spec.C.dtype  # float64, or the network's when no recheck
        box64 = Interval(box.lower.to(dtype64), box.upper.to(dtype64))
        self.spec = UnsafeSpec.of(region, self.dtype, self.device)
        tol = prune_tolerance(config, self.spec.b)  # per row
        layout = Layout.of(graph, graph.split_pairs())
        clock, sizer = Clock(), BatchSizer(config)
        self.target = Target(graph, layout, box, box64, self.spec, polytope_rows(self.spec), tol,
                             check, sizer, stats, clock)  # fmt: skip
        checks = Counterexamples(net, region, self.shape, self.spec)
        self.value_tol = checks.value_tol
        easy = self.bounder_class(self.target, self.settings)
        super().__init__(
            StratifiedBounder(easy, HardBounder.of(easy)),
            self.brancher_class(self.target, self.settings), ReluAttacker(self.target, checks, config),
            clock, checks=checks, sizer=sizer, stats=stats,
            max_open=max_open(self.target, config), attack_every=config.attack_every,
        )  # fmt: skip
