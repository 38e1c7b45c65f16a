"""Bound methods by name (the only place strings choose code). Each entry has a frozen config
dataclass and a function `(graph, box, C, config, budget) -> (lower, upper, intervals, stats)`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bounds.dual import proximal, supergradient
from bounds.dual.dag import decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.dual.intermediate import intermediate_intervals
from bounds.dual.proximal import ProximalConfig
from bounds.dual.supergradient import SupergradientConfig
from bounds.lp import LpConfig, milp, planet_lp
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import (
    crown,
    crown_intervals,
    interval_bound,
    output_functional,
    split_output,
)
from bounds.methods.ibp import ibp
from bounds.methods.pacing import deadline_of
from bounds.types import Interval

MethodResult = tuple[Tensor, Tensor, dict[str, Interval], dict[str, Any]]


@dataclass(frozen=True)
class NoConfig:
    """Methods without options."""


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[..., MethodResult]  # (graph, box, C, config, budget, given)
    config_type: type
    description: str


_METHODS: dict[str, Method] = {}


def register_method(name: str, config_type: type, description: str):
    def wrap(fn):
        _METHODS[name] = Method(name, fn, config_type, description)
        return fn

    return wrap


def get_method(name: str) -> Method:
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def available_methods() -> list[str]:
    return list(_METHODS)


@register_method("ibp", NoConfig, "interval bound propagation")
def _ibp(graph, box, C, config, budget, given) -> MethodResult:
    return (*ibp(graph, box, C, given), {})


@register_method("crown", NoConfig, "CROWN / Wong-Kolter backward linear bounds")
def _crown(graph, box, C, config, budget, given) -> MethodResult:
    return (*crown(graph, box, C, given, deadline=deadline_of(budget)), {})


@register_method("alpha-crown", AlphaCrownConfig, "CROWN with optimised slopes (Adam)")
def _alpha_crown(graph, box, C, config, budget, given) -> MethodResult:
    deadline = deadline_of(budget)
    base = crown_intervals(graph, box, given, deadline) if given else None
    return alpha_crown(graph, box, C, config, budget, intervals=base, deadline=deadline)


def _intervals(graph, box, C, config, given, deadline=None) -> dict[str, Interval]:
    return intermediate_intervals(
        graph, box, C, config.intermediate, config.intermediate_iterations, given, deadline
    )


def _reference(solve):
    """The LP or MILP method: intermediate bounds, then one solve per spec and side. With a
    seconds budget, the solves left when it runs out keep the interval bound of the output
    (sound, looser); `stats['unsolved']` counts them."""

    def run(graph, box, C, config, budget, given) -> MethodResult:
        start = time.monotonic()
        deadline = start + budget.seconds if budget is not None and budget.seconds else None
        intervals = _intervals(graph, box, C, config, given, deadline)
        fallback = interval_bound(C, intervals[graph.output.name])
        lower, upper, stats = solve(
            graph, box, C, intervals, config, deadline=deadline, fallback=fallback
        )
        return lower, upper, intervals, {"solves": stats["solves"], "unsolved": stats["unsolved"]}

    return run


register_method("lp", LpConfig, "LP of the relaxations for the chosen intermediate bounds (cvxpy)")(
    _reference(planet_lp)
)
register_method("milp", LpConfig, "exact MILP from the relaxations' pieces (tiny nets)")(
    _reference(milp)
)


def _start(graph, box, C, net, c, config, given, deadline=None):
    """`(problem, intervals, start duals, floor [B, 2S])` of a decomposition method.

    init='crown': the chosen intermediate bounds and CROWN's duals (no floor). init='alpha-crown':
    alpha-CROWN's final-layer slopes turned into duals (Bunel et al. 2020, Sec. 4.3) and its bounds
    as the floor; with intermediate='alpha-crown' that one run also optimises the intervals, so
    the result is at least as tight as the `alpha-crown` method's."""
    if config.init == "crown" or config.init_iterations == 0:
        intervals = _intervals(graph, box, C, config, given, deadline)
        problem = problem_from_intervals(net, box, intervals, c)
        return problem, intervals, initial_duals(problem), c.new_full(c.shape[:2], -torch.inf)
    optimise = config.intermediate == "alpha-crown"
    if optimise:
        base = crown_intervals(graph, box, given, deadline)
        iterations = max(config.init_iterations, AlphaCrownConfig().iterations)
    else:
        base = _intervals(graph, box, C, config, given, deadline)
        iterations = config.init_iterations
    alpha_config = AlphaCrownConfig(iterations=iterations, optimize_intermediate=optimise)
    low, up, intervals, stats = alpha_crown(
        graph, box, C, alpha_config, intervals=base, deadline=deadline
    )
    problem = problem_from_intervals(net, box, intervals, c)
    slopes = stats["final_slopes"]  # per activation node, by name
    return problem, intervals, initial_duals(problem, slopes), torch.cat([low, -up], dim=1)


def _decomposition(solve_fn):
    """A Lagrangian-decomposition method: intermediate bounds, start duals (CROWN's or
    alpha-CROWN's), then `solve_fn`. The result is never below its start (nor the output's
    interval bound); with `intermediate='alpha-crown'` never below alpha-CROWN's bound."""

    def run(graph, box, C, config, budget, given) -> MethodResult:
        deadline = deadline_of(budget)  # the whole call, not only the solver, keeps the budget
        c = output_functional(graph, C)
        net = decompose(graph)
        problem, intervals, init, start = _start(graph, box, C, net, c, config, given, deadline)
        result = solve_fn(problem, config, init, budget, deadline)
        best = torch.maximum(result.lower, start)
        best = torch.maximum(best, interval_bound(C, intervals[graph.output.name]))
        lower, upper = split_output(best)
        return lower, upper, intervals, {**result.stats, "duals": result.duals}

    return run


register_method(
    "supergradient", SupergradientConfig, "Lagrangian decomposition, supergradient ascent"
)(_decomposition(supergradient.solve))
register_method("prox", ProximalConfig, "Lagrangian decomposition, proximal method")(
    _decomposition(proximal.solve)
)
