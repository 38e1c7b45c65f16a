"""Branch and bound with input splitting over batches of boxes (one VNN-LIB region): a `Search`
(`verify.bab.search`) of an `InputBounder`, an `InputBrancher` and an `InputAttacker`.

Each step pops the open domains with the smallest margin (best-first: the likeliest to hold a
counterexample), splits each in two along one input dimension, bounds all children with one
bound-method call per chunk, prunes the children whose bounds exclude every unsafe polytope,
tries the centres (and corners, for small inputs) of the open children as counterexamples, runs
PGD on the worst ones now and then, and keeps the rest. The region holds when no domain is left
(Bunel et al. 2020, "Branch and bound for piecewise linear neural network verification"; input
splitting with a smear-like heuristic as in Wang et al. 2018, "Efficient formal safety
analysis").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bounds.graph.graph import Graph, build_graph
from verify.attack import AttackConfig, UnsafeSpec, pgd
from verify.bab.common import BatchSizer, Float64Check, Found
from verify.bab.config import BabConfig
from verify.bab.input.bounder import InputBounder, root_box
from verify.bab.input.branching import InputBrancher
from verify.bab.protocols import Children
from verify.bab.search import Clock, Counterexamples, Search
from verify.property import Region


class InputAttacker:
    """PGD from random points of the worst open children, each inside its own box."""

    def __init__(self, checks: Counterexamples, config: AttackConfig, domains: int, seed: int,
                 clock: Clock) -> None:  # fmt: skip
        self.checks, self.config, self.domains, self.clock = checks, config, domains, clock
        self.generator = torch.Generator().manual_seed(seed)

    def attack(self, children: Children) -> Found:
        open_ = children.domains
        if not len(open_):
            return None
        worst = open_.pop(self.domains)[0]
        lower0 = worst.lower
        noise = torch.rand(lower0.shape, generator=self.generator, dtype=lower0.dtype)
        starts = worst.lower + noise.to(lower0.device) * (worst.upper - worst.lower)
        shape = self.checks.shape
        lower, upper = (t.reshape(-1, *shape) for t in (worst.lower, worst.upper))
        points, values = pgd(
            self.checks.net, lower, upper, self.checks.spec, starts.reshape(lower.shape),
            self.config.steps, deadline=self.clock.deadline,
        )  # fmt: skip
        return self.checks.validate_best(points, values)


class RegionBab(Search):
    """Input-splitting branch and bound on one region: the `Search` of an `InputBounder`, an
    `InputBrancher` and an `InputAttacker` (`run(deadline)` returns a `RegionOutcome`);
    `graph`: the network's graph when the caller has built it (built here otherwise)."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int = 0,
                 graph: Graph | None = None) -> None:  # fmt: skip
        self.net, self.region, self.config = net, region, config
        self.shape = tuple(getattr(net, "input_shape", None) or (len(region.lower),))
        param = next(net.parameters())
        self.dtype, self.device = param.dtype, param.device
        graph = build_graph(net, self.shape) if graph is None else graph
        graph = graph.to(self.dtype, self.device) if self.device.type != "cpu" else graph
        self.root = root_box(region, self.dtype, self.device)
        spec = UnsafeSpec.of(region, self.dtype, self.device)
        self.spec = spec.with_combinations() if config.combine_rows else spec
        stats: dict[str, Any] = {"domains": 0, "batches": 0, "max_open": 0, "max_depth": 0}
        stats |= {"attacks": 0, "strong_domains": 0, "attack_seconds": 0.0}
        check = Float64Check(graph, region, config, stats, config.combine_rows)
        sizer, clock = BatchSizer(config), Clock()
        checks = Counterexamples(net, region, self.shape, self.spec)
        self.value_tol = checks.value_tol
        bounder = InputBounder(graph, self.spec, config, check, sizer, stats, clock, self.root)
        brancher = InputBrancher(net, self.root, self.spec, config, stats)
        attacker = InputAttacker(checks, config.attack, config.attack_domains, seed, clock)
        super().__init__(
            bounder, brancher, attacker, clock, checks=checks, sizer=sizer, stats=stats,
            max_open=config.max_domains, attack_every=config.attack_every,
        )  # fmt: skip
