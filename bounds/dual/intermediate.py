"""Pre-activation bounds for the decomposition methods, chosen by name: `ibp`, `crown`,
`alpha-crown`, or tightened by a dual solver (`prox`, `supergradient`; `active-set` and
`sp-fw`, the Anderson relaxation's, on ReLU chains): for each node
that feeds a nonlinearity, in topological order, the problem truncated at that node (its
ancestors) is solved with objectives `+-e_j` for every neuron j whose relaxation is not exact
(Bunel et al., UAI 2020, Sec. 5), batched as specs and chunked to bound memory.

The dual solvers start from alpha-CROWN's intervals (its slopes optimised for `C`, the
intermediate bounds with them) and intersect each layer's result with them: their bounds are
never looser than alpha-CROWN's, and the neurons that alpha-CROWN already makes stable are not
re-bounded."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from bounds.dual import active_set, proximal, sp_fw, supergradient
from bounds.dual.anderson.problem import anderson_layers, anderson_slopes, problem_from_layers
from bounds.dual.dag import Decomposition, decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.graph.graph import Graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.chunks import bound_in_chunks, unit_functionals
from bounds.methods.crown import crown_intervals, scatter_bounds, unstable_indices
from bounds.methods.pacing import passed
from bounds.types import Budget, Interval

INTERMEDIATE = ("ibp", "crown", "alpha-crown", "prox", "supergradient", "active-set", "sp-fw")


def _tighten(
    graph: Graph, truncated: Decomposition, box: Interval, intervals: dict[str, Interval],
    bound, deadline: float | None = None,
) -> Interval:  # fmt: skip
    """Dual bounds of the neurons of `truncated`'s output node that need refinement:
    `bound(truncated, intervals, c) -> [B, S]` lower bounds of `c . node`."""
    name = truncated.graph.output.name
    index = unstable_indices(graph, name, intervals[name])
    current = intervals[name]
    if not index.numel():
        return current

    batch = box.lower.shape[0]
    shape = graph[name].shape

    def lower_bound(part: Tensor, offset: int) -> Tensor:
        return bound(truncated, intervals, unit_functionals(part, shape, batch, box.lower))

    low, up = bound_in_chunks(graph, name, index, batch, box.lower, lower_bound, None, deadline)
    return scatter_bounds(current, index, low, up)


def decomposition_intervals(
    graph: Graph,
    net: Decomposition,
    box: Interval,
    bound: Callable[..., Tensor],
    given: dict[str, Interval] | None = None,
    deadline: float | None = None,
) -> dict[str, Interval]:
    """CROWN intervals, then each node that feeds a nonlinearity and has one among its
    ancestors tightened in turn (topological order) by `bound(truncated, intervals, c) ->
    [B, S] lower bounds` (a dual solver with its own budget); past `deadline`
    (`time.monotonic()`) the neurons left keep the intervals they have."""
    intervals = crown_intervals(graph, box, given, deadline)
    for name in dict.fromkeys(net.pre_names):
        if passed(deadline):
            break
        if graph[name].op is None:
            continue
        truncated = net.truncated(name)
        if truncated.acts:
            intervals[name] = _tighten(graph, truncated, box, intervals, bound, deadline)
    return intervals


def _decomposition_bound(solve_fn, config, box: Interval, budget: Budget, deadline):
    def bound(truncated: Decomposition, intervals: dict[str, Interval], c: Tensor) -> Tensor:
        problem = problem_from_intervals(truncated, box, intervals, c)
        return solve_fn(problem, config, initial_duals(problem), budget, deadline).lower

    return bound


ANDERSON_SOLVERS = {
    "active-set": (active_set.solve, active_set.ActiveSetConfig),
    "sp-fw": (sp_fw.solve, sp_fw.SpFwConfig),
}


def _anderson_bound(solve_fn, config, box: Interval, budget: Budget, deadline):
    """A dual solver of the Anderson relaxation (ReLU chains) from CROWN's Big-M duals."""

    def bound(truncated: Decomposition, intervals: dict[str, Interval], c: Tensor) -> Tensor:
        p = problem_from_layers(anderson_layers(truncated.graph), box, intervals, c)
        init = active_set.big_m_from_slopes(p, anderson_slopes(p, None))
        return solve_fn(p, config, init, budget, deadline).lower

    return bound


def intermediate_intervals(
    graph: Graph,
    box: Interval,
    C: Tensor,
    kind: str,
    iterations: int = 50,
    given: dict[str, Interval] | None = None,
    deadline: float | None = None,
    start: str = "alpha-crown",
) -> dict[str, Interval]:
    """Intervals of every node by the method `kind` (see module docstring); `iterations` is
    the decomposition solvers' budget per layer; `given` intervals are intersected in;
    `deadline` (`time.monotonic()`): every stage stops by then, keeping valid intervals. The
    dual solvers start from (and intersect with) the intervals of `start`: "alpha-crown"
    (module docstring) or "crown" (for `given` intervals that are alpha-CROWN's already)."""
    if start not in ("crown", "alpha-crown"):
        raise ValueError(f"start must be 'crown' or 'alpha-crown', got {start!r}")
    if kind == "ibp":
        return graph.interval(box, given)
    if kind == "crown":
        return crown_intervals(graph, box, given, deadline)
    if kind == "alpha-crown":
        durations: list[float] = []  # CROWN's chunks predict alpha-CROWN's first pass
        base = crown_intervals(graph, box, given, deadline, durations=durations)
        config = AlphaCrownConfig()
        return alpha_crown(
            graph, box, C, config, intervals=base, deadline=deadline, durations=durations
        )[2]
    if kind not in INTERMEDIATE:
        raise ValueError(f"intermediate must be one of {INTERMEDIATE}, got {kind!r}")
    budget = Budget(iterations=iterations)
    if kind in ANDERSON_SOLVERS:
        anderson_layers(graph)  # a typed refusal up front for graphs it cannot take
        solve_fn, config_type = ANDERSON_SOLVERS[kind]
        bound = _anderson_bound(solve_fn, config_type(), box, budget, deadline)
    else:
        solve_fn, config = {
            "prox": (proximal.solve, proximal.ProximalConfig()),
            "supergradient": (supergradient.solve, supergradient.SupergradientConfig()),
        }[kind]
        bound = _decomposition_bound(solve_fn, config, box, budget, deadline)
    if start == "alpha-crown":
        given = intermediate_intervals(graph, box, C, start, given=given, deadline=deadline)
    return decomposition_intervals(graph, decompose(graph), box, bound, given, deadline)
