"""Pre-activation bounds tightened by a dual solver: the intermediate-bounds capabilities
(`bounds.registry.IntermediateBounds`) of the dual methods (`prox`, `supergradient`;
`active-set` and `sp-fw`, the Anderson relaxation's, on ReLU chains; `ibp`, `crown` and
`alpha-crown` declare theirs in their own files): for each node
that feeds a nonlinearity, in topological order, the problem truncated at that node (its
ancestors) is solved with objectives `+-e_j` for every neuron j whose relaxation is not exact
(Bunel et al., UAI 2020, Sec. 5), batched as specs and chunked to bound memory.

The dual solvers start from alpha-CROWN's intervals (its slopes optimised for `C`, the
intermediate bounds with them) and intersect each layer's result with them: their bounds are
never looser than alpha-CROWN's, and the neurons that alpha-CROWN already makes stable are not
re-bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from bounds.dual.anderson.problem import anderson_layers, anderson_slopes, problem_from_layers
from bounds.dual.dag import Decomposition, decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.graph.graph import Graph
from bounds.methods.chunks import bound_in_chunks, unit_functionals
from bounds.methods.crown import crown_intervals, scatter_bounds, unstable_indices
from bounds.methods.pacing import passed
from bounds.registry import IntermediateBounds
from bounds.types import Budget, Interval


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


def _anderson_bound(solve_fn, init_fn, config, box: Interval, budget: Budget, deadline):
    """A dual solver of the Anderson relaxation (ReLU chains) from CROWN's Big-M duals
    (`init_fn(problem, slopes)`)."""

    def bound(truncated: Decomposition, intervals: dict[str, Interval], c: Tensor) -> Tensor:
        p = problem_from_layers(anderson_layers(truncated.graph), box, intervals, c)
        init = init_fn(p, anderson_slopes(p, None))
        return solve_fn(p, config, init, budget, deadline).lower

    return bound


def _dual_intermediate(make_bound: Callable[..., Any], refuse: Callable[[Graph], Any] | None):
    """The `IntermediateBounds` of a dual solver: `make_bound(box, budget, deadline)` gives the
    bound of a truncated problem (see `decomposition_intervals`); `refuse(graph)` raises a
    typed refusal up front for graphs the solver cannot take."""

    def intermediate(
        graph: Graph, box: Interval, C: Tensor, iterations: int = 50,
        given: dict[str, Interval] | None = None, deadline: float | None = None,
        start: IntermediateBounds | None = None,
    ) -> dict[str, Interval]:  # fmt: skip
        budget = Budget(iterations=iterations)
        if refuse is not None:
            refuse(graph)
        bound = make_bound(box, budget, deadline)
        if start is not None:
            given = start(graph, box, C, given=given, deadline=deadline)
        return decomposition_intervals(graph, decompose(graph), box, bound, given, deadline)

    return intermediate


def decomposition_intermediate(
    solve_fn: Callable[..., Any], config_type: type
) -> IntermediateBounds:
    """The intermediate bounds of a Lagrangian-decomposition solver (Planet relaxation; `prox`,
    `supergradient`) with its default config (module docstring)."""
    return _dual_intermediate(
        lambda box, budget, deadline: _decomposition_bound(
            solve_fn, config_type(), box, budget, deadline
        ),
        None,
    )


def anderson_intermediate(
    solve_fn: Callable[..., Any], config_type: type, init_fn: Callable[..., Any]
) -> IntermediateBounds:
    """The intermediate bounds of a dual solver of the Anderson relaxation (`active-set`,
    `sp-fw`; ReLU chains: a typed refusal up front for other graphs) with its default config,
    from the Big-M duals `init_fn(problem, slopes)`."""
    return _dual_intermediate(
        lambda box, budget, deadline: _anderson_bound(
            solve_fn, init_fn, config_type(), box, budget, deadline
        ),
        anderson_layers,
    )
