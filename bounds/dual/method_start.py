"""The shared driver of the dual bound methods (each registers itself in its own file:
`bounds.dual.supergradient`, `proximal`, `active_set`, `sp_fw`): intermediate bounds, start
duals from CROWN or alpha-CROWN (Bunel et al. 2020, Sec. 4.3), the solver under the deadline,
and the reported bound certified in floating point (`bounds.dual.certified`,
`bounds.dual.anderson.certified`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bounds.dual.anderson.certified import certified_anderson_value
from bounds.dual.anderson.problem import anderson_layers, anderson_slopes, problem_from_graph
from bounds.dual.anytime import DualResult
from bounds.dual.certified import certified_value
from bounds.dual.dag import decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.graph.graph import Graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.chunks import predicted_past
from bounds.methods.crown import crown_intervals, interval_bound, output_functional, split_output
from bounds.methods.pacing import deadline_of, passed
from bounds.registry import MethodResult, intermediate_intervals
from bounds.types import Interval


def chosen_intervals(
    graph: Graph, box: Interval, C: Tensor, config: Any,
    given: dict[str, Interval] | None, deadline: float | None = None,
) -> dict[str, Interval]:  # fmt: skip
    """The intermediate bounds `config.intermediate` chooses (`intermediate_iterations` for
    a dual solver's), `given` intersected in."""
    return intermediate_intervals(
        graph, box, C, config.intermediate, config.intermediate_iterations, given, deadline
    )


def _initial_slopes(graph, box, C, c, config, given, deadline=None, durations=None):
    """`(intervals, slopes, floor [B, 2S])` to start a dual method from.

    init='crown': the chosen intermediate bounds, no slopes (CROWN's defaults) and no floor.
    init='alpha-crown': alpha-CROWN's final-layer slopes (per activation node, by name) and its
    bounds as the floor; with intermediate='alpha-crown' that one run also optimises the
    intervals, so the result is at least as tight as the `alpha-crown` method's. `durations`
    (appended to): the seconds of CROWN's chunks, which predict the passes after them; when
    the next is predicted to end past `deadline`, the intervals so far and no slopes."""
    durations = [] if durations is None else durations
    if config.init == "crown" or config.init_iterations == 0:
        intervals = chosen_intervals(graph, box, C, config, given, deadline)
        return intervals, None, c.new_full(c.shape[:2], -torch.inf)
    optimise = config.intermediate == "alpha-crown"
    if optimise:
        base = crown_intervals(graph, box, given, deadline, durations=durations)
        iterations = max(config.init_iterations, AlphaCrownConfig().iterations)
    else:
        base = chosen_intervals(graph, box, C, config, given, deadline)
        iterations = config.init_iterations
    if passed(deadline) or predicted_past(deadline, durations):
        return base, None, c.new_full(c.shape[:2], -torch.inf)
    alpha_config = AlphaCrownConfig(iterations=iterations, optimize_intermediate=optimise)
    low, up, intervals, stats = alpha_crown(
        graph, box, C, alpha_config, intervals=base, deadline=deadline, durations=durations
    )
    return intervals, stats["best_slopes"], torch.cat([low, -up], dim=1)


def _start(graph, box, C, net, c, config, given, deadline=None, durations=None):
    """`(problem, intervals, start duals, floor [B, 2S])` of a decomposition method: the
    CROWN or alpha-CROWN duals turned into decomposition multipliers (Bunel et al. 2020,
    Sec. 4.3); see `_initial_slopes`."""
    intervals, slopes, floor = _initial_slopes(graph, box, C, c, config, given, deadline, durations)
    problem = problem_from_intervals(net, box, intervals, c)
    return problem, intervals, initial_duals(problem, slopes), floor


def _floored(graph, C, intervals, result, floor) -> MethodResult:
    """A dual solver's result as a method's: its bound never below `floor` (its start) nor the
    output's interval bound, and its duals in the stats."""
    best = torch.maximum(result.lower, floor)
    best = torch.maximum(best, interval_bound(C, intervals[graph.output.name]))
    lower, upper = split_output(best)
    return lower, upper, intervals, {**result.stats, "duals": result.duals}


def _certified_run(
    graph, C, intervals, floor, init, deadline, solve, certify, start_point, durations=None
):  # fmt: skip
    """A dual method's result with its reported bound certified in floating point: the
    solvers' values hold in exact arithmetic only, so the bound is `certify(point)` at the
    result's `certificate` (`bounds.dual.certified`, `bounds.dual.anderson.certified`), never
    below `floor` nor `certify(start_point)`. That pass is timed once at the start and kept
    back from `solve(deadline)`'s time; when the time is gone (before the solver, or before
    the last pass) the bounds already certified are kept; `durations` (the seconds of the start's
    CROWN chunks) predict the first pass, which is not started past the deadline."""
    if passed(deadline) or predicted_past(deadline, durations):  # the start's bound (sound)
        return _floored(graph, C, intervals, DualResult(floor, init, {"iterations": 0}), floor)
    tick = time.monotonic()
    certified = torch.maximum(floor, certify(start_point))
    cost = time.monotonic() - tick
    result = solve(None if deadline is None else deadline - 1.5 * cost)
    if deadline is None or time.monotonic() + cost < deadline:
        certified = torch.maximum(certified, certify(result.certificate))
    stats = {**result.stats, "dual_value": result.lower}
    return _floored(graph, C, intervals, DualResult(certified, result.duals, stats), floor)


def decomposition_method(solve_fn: Callable[..., Any]) -> Callable[..., MethodResult]:
    """A Lagrangian-decomposition method: intermediate bounds, start duals (CROWN's or
    alpha-CROWN's), then `solve_fn`. The result is never below its start (nor the output's
    interval bound); with `intermediate='alpha-crown'` never below alpha-CROWN's bound."""

    def run(graph, box, C, config, budget, given, exact=True) -> MethodResult:  # always exact
        deadline = deadline_of(budget)  # the whole call, not only the solver, keeps the budget
        c = output_functional(graph, C)
        net = decompose(graph)
        durations: list[float] = []
        problem, intervals, init, start = _start(
            graph, box, C, net, c, config, given, deadline, durations
        )
        return _certified_run(
            graph, C, intervals, start, init, deadline,
            lambda at: solve_fn(problem, config, init, budget, at),
            lambda rho: certified_value(net, box, intervals, c, rho), init.rho, durations,
        )  # fmt: skip

    return run


def anderson_method(
    solve_fn: Callable[..., Any], init_fn: Callable[..., Any]
) -> Callable[..., MethodResult]:
    """A dual method of the Anderson relaxation (`bounds.dual.active_set`, `bounds.dual.sp_fw`)
    from the Big-M duals `init_fn(problem, slopes)` of the starting bound; never below it (nor
    the output's interval bound)."""

    def run(graph, box, C, config, budget, given, exact=True) -> MethodResult:  # always exact
        deadline = deadline_of(budget)
        c = output_functional(graph, C)
        layers = anderson_layers(graph)  # a typed refusal before any bound is computed
        durations: list[float] = []
        intervals, slopes, floor = _initial_slopes(
            graph, box, C, c, config, given, deadline, durations
        )
        problem = problem_from_graph(graph, box, intervals, c, layers)
        init = init_fn(problem, anderson_slopes(problem, slopes))
        return _certified_run(
            graph, C, intervals, floor, init, deadline,
            lambda at: solve_fn(problem, config, init, budget, at),
            lambda point: certified_anderson_value(problem, point[1], point[0]), (init, ()),
            durations,
        )  # fmt: skip

    return run
