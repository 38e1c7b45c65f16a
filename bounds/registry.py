"""Bound methods by name (the only place strings choose code). Each entry has a frozen config
dataclass, a function `(graph, box, C, config, budget) -> (lower, upper, intervals, stats)` (its
final bounds) and its other capabilities, declared in its one registration (`register_method`):
- `intermediate`: how it computes intermediate bounds (`bounds.dual.intermediate`);
- `hard_bounder`: it bounds branch-and-bound split domains (of its `relaxation`) as the hard
  bounder of ReLU splitting (`verify.bab.relu.hard_bounder`); `warm_start`: that hard bounder
  returns and takes warm starts;
- `root_intermediate`: it may tighten the root's intermediate bounds in ReLU splitting.
`methods_with(capability)` lists the methods that have one (`CAPABILITIES`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from bounds.dual import active_set, proximal, sp_fw, supergradient
from bounds.dual.active_set import ActiveSetConfig, BigMConfig, big_m_from_slopes
from bounds.dual.anderson.certified import certified_anderson_value
from bounds.dual.anderson.problem import anderson_layers, anderson_slopes, problem_from_graph
from bounds.dual.anytime import DualResult
from bounds.dual.certified import certified_value
from bounds.dual.dag import decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.dual.intermediate import (
    IntermediateBounds,
    alpha_crown_intermediate,
    anderson_intermediate,
    crown_intermediate,
    decomposition_intermediate,
    ibp_intermediate,
)
from bounds.dual.proximal import ProximalConfig
from bounds.dual.sp_fw import SpFwConfig
from bounds.dual.supergradient import SupergradientConfig
from bounds.graph.graph import Graph
from bounds.lp.lp import LpConfig, milp, planet_lp
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.chunks import predicted_past
from bounds.methods.crown import (
    crown,
    crown_intervals,
    interval_bound,
    output_functional,
    split_output,
)
from bounds.methods.ibp import ibp
from bounds.methods.pacing import deadline_of, passed
from bounds.types import Interval

MethodResult = tuple[Tensor, Tensor, dict[str, Interval], dict[str, Any]]


@dataclass(frozen=True)
class NoConfig:
    """Methods without options."""


class Relaxation(Enum):
    """The convex relaxation a dual method solves (what a hard bounder of split domains needs
    to know about it)."""

    PLANET = "planet"  # Lagrangian decomposition of the Planet relaxation
    ANDERSON = "anderson"  # the Anderson relaxation (ReLU chains)


CAPABILITIES = ("final", "intermediate", "hard_bounder", "warm_start", "root_intermediate")


@dataclass(frozen=True)
class Method:
    """A registered bound method: `run` its final bounds, `config_type` its frozen options, and
    its capabilities (module docstring): `intermediate` (None: it gives no intermediate bounds
    of its own), `hard_bounder`, `warm_start` and `root_intermediate`; `relaxation`: the
    relaxation a dual method solves (None for the others)."""

    name: str
    run: Callable[..., MethodResult]  # (graph, box, C, config, budget, given, exact)
    config_type: type
    description: str
    intermediate: IntermediateBounds | None = None
    hard_bounder: bool = False
    warm_start: bool = False
    root_intermediate: bool = False
    relaxation: Relaxation | None = None

    def can(self, capability: str) -> bool:
        """Whether the method has `capability` (one of `CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; one of {CAPABILITIES}")
        if capability == "final":
            return True
        return bool(getattr(self, capability))


_METHODS: dict[str, Method] = {}


def register_method(
    name: str, config_type: type, description: str, *,
    intermediate: IntermediateBounds | None = None, hard_bounder: bool = False,
    warm_start: bool = False, root_intermediate: bool = False,
    relaxation: Relaxation | None = None,
) -> Callable[[Callable[..., MethodResult]], Callable[..., MethodResult]]:  # fmt: skip
    """Register the method `name` (its run function decorated) with its config and
    capabilities."""

    def wrap(fn: Callable[..., MethodResult]) -> Callable[..., MethodResult]:
        _METHODS[name] = Method(
            name, fn, config_type, description, intermediate, hard_bounder, warm_start,
            root_intermediate, relaxation,
        )  # fmt: skip
        return fn

    return wrap


def get_method(name: str) -> Method:
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def available_methods() -> list[str]:
    return list(_METHODS)


def methods_with(capability: str) -> tuple[str, ...]:
    """The names of the methods that have `capability` (`CAPABILITIES`), in registration
    order."""
    return tuple(name for name, method in _METHODS.items() if method.can(capability))


@register_method("ibp", NoConfig, "interval bound propagation", intermediate=ibp_intermediate)
def _ibp(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    return (*ibp(graph, box, C, given, exact), {})


@register_method(
    "crown",
    NoConfig,
    "CROWN / Wong-Kolter backward linear bounds",
    intermediate=crown_intermediate,
)
def _crown(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    return (*crown(graph, box, C, given, deadline=deadline_of(budget), exact=exact), {})


@register_method(
    "alpha-crown",
    AlphaCrownConfig,
    "CROWN with optimised slopes (Adam)",
    intermediate=alpha_crown_intermediate,
)
def _alpha_crown(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    deadline = deadline_of(budget)
    base = crown_intervals(graph, box, given, deadline, exact=exact) if given else None
    return alpha_crown(
        graph, box, C, config, budget, intervals=base, deadline=deadline, exact=exact
    )


def _intervals(graph, box, C, config, given, deadline=None) -> dict[str, Interval]:
    return intermediate_intervals(
        graph, box, C, config.intermediate, config.intermediate_iterations, given, deadline
    )


def _reference(solve):
    """The LP or MILP method: intermediate bounds, then one solve per spec and side. With a
    seconds budget, the solves left when it runs out keep the interval bound of the output
    (sound, looser); `stats['unsolved']` counts them."""

    def run(graph, box, C, config, budget, given, exact=True) -> MethodResult:  # always exact
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
        intervals = _intervals(graph, box, C, config, given, deadline)
        return intervals, None, c.new_full(c.shape[:2], -torch.inf)
    optimise = config.intermediate == "alpha-crown"
    if optimise:
        base = crown_intervals(graph, box, given, deadline, durations=durations)
        iterations = max(config.init_iterations, AlphaCrownConfig().iterations)
    else:
        base = _intervals(graph, box, C, config, given, deadline)
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
    graph, C, intervals, floor, init, deadline, solve, certify, start_point, durations=()
):  # fmt: skip
    """A dual method's result with its reported bound certified in floating point: the
    solvers' values hold in exact arithmetic only, so the bound is `certify(point)` at the
    result's `certificate` (`bounds.dual.certified`, `bounds.dual.anderson.certified`), never
    below `floor` nor `certify(start_point)`. That pass is timed once at the start and kept
    back from `solve(deadline)`'s time; when the time is gone (before the solver, or before
    the last pass) the bounds already certified are kept."""
    if passed(deadline):  # the start took the time: its bound (sound)
        return _floored(graph, C, intervals, DualResult(floor, init, {"iterations": 0}), floor)
    tick = time.monotonic()
    certified = torch.maximum(floor, certify(start_point))
    cost = time.monotonic() - tick
    result = solve(None if deadline is None else deadline - 1.5 * cost)
    if deadline is None or time.monotonic() + cost < deadline:
        certified = torch.maximum(certified, certify(result.certificate))
    stats = {**result.stats, "dual_value": result.lower}
    return _floored(graph, C, intervals, DualResult(certified, result.duals, stats), floor)


def _decomposition(solve_fn):
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


register_method(
    "supergradient",
    SupergradientConfig,
    "Lagrangian decomposition, supergradient ascent",
    intermediate=decomposition_intermediate(supergradient.solve, SupergradientConfig),
    relaxation=Relaxation.PLANET,
)(_decomposition(supergradient.solve))
register_method(
    "prox",
    ProximalConfig,
    "Lagrangian decomposition, proximal method",
    intermediate=decomposition_intermediate(proximal.solve, ProximalConfig),
    hard_bounder=True,
    root_intermediate=True,
    relaxation=Relaxation.PLANET,
)(_decomposition(proximal.solve))


def _anderson(solve_fn):
    """A dual method of the Anderson relaxation (`bounds.dual.active_set`, `bounds.dual.sp_fw`)
    from the Big-M duals of the starting bound; never below it (nor the output's interval
    bound)."""

    def run(graph, box, C, config, budget, given, exact=True) -> MethodResult:  # always exact
        deadline = deadline_of(budget)
        c = output_functional(graph, C)
        layers = anderson_layers(graph)  # a typed refusal before any bound is computed
        durations: list[float] = []
        intervals, slopes, floor = _initial_slopes(
            graph, box, C, c, config, given, deadline, durations
        )
        problem = problem_from_graph(graph, box, intervals, c, layers)
        init = big_m_from_slopes(problem, anderson_slopes(problem, slopes))
        return _certified_run(
            graph, C, intervals, floor, init, deadline,
            lambda at: solve_fn(problem, config, init, budget, at),
            lambda point: certified_anderson_value(problem, point[1], point[0]), (init, ()),
            durations,
        )  # fmt: skip

    return run


register_method(
    "big-m", BigMConfig, "Big-M dual (Planet-equivalent), projected Adam on the Anderson dual"
)(_anderson(active_set.solve))
register_method(
    "active-set",
    ActiveSetConfig,
    "Anderson relaxation by the dual active-set method (ReLU chains)",
    intermediate=anderson_intermediate(active_set.solve, ActiveSetConfig),
    hard_bounder=True,
    warm_start=True,
    root_intermediate=True,
    relaxation=Relaxation.ANDERSON,
)(_anderson(active_set.solve))
register_method(
    "sp-fw",
    SpFwConfig,
    "Anderson relaxation by saddle-point Frank-Wolfe, linear memory (ReLU chains)",
    intermediate=anderson_intermediate(sp_fw.solve, SpFwConfig),
    root_intermediate=True,
    relaxation=Relaxation.ANDERSON,
)(_anderson(sp_fw.solve))


def intermediate_intervals(
    graph: Graph, box: Interval, C: Tensor, kind: str, iterations: int = 50,
    given: dict[str, Interval] | None = None, deadline: float | None = None,
    start: str = "alpha-crown",
) -> dict[str, Interval]:  # fmt: skip
    """Intervals of every node by the intermediate-bounds capability of the method `kind`
    (`bounds.dual.intermediate`); `iterations` is the decomposition solvers' budget per layer;
    `given` intervals are intersected in; `deadline` (`time.monotonic()`): every stage stops by
    then, keeping valid intervals. The dual solvers start from (and intersect with) the
    intervals of `start`: "alpha-crown" (`bounds.dual.intermediate`) or "crown" (for `given`
    intervals that are alpha-CROWN's already)."""
    if start not in ("crown", "alpha-crown"):
        raise ValueError(f"start must be 'crown' or 'alpha-crown', got {start!r}")
    capable = methods_with("intermediate")
    if kind not in capable:
        raise ValueError(f"intermediate must be one of {capable}, got {kind!r}")
    begin = None if start == "crown" else get_method(start).intermediate
    compute = get_method(kind).intermediate
    return compute(graph, box, C, iterations, given, deadline, begin)
