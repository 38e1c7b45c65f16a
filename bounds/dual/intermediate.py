"""Pre-activation bounds for the decomposition methods, chosen by name: `ibp`, `crown`,
`alpha-crown`, or tightened by the decomposition itself (`prox`, `supergradient`): for each node
that feeds a nonlinearity, in topological order, the problem truncated at that node (its
ancestors) is solved with objectives `+-e_j` for every neuron j whose relaxation is not exact
(Bunel et al., UAI 2020, Sec. 5), batched as specs and chunked to bound memory."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from bounds.dual import proximal, supergradient
from bounds.dual.dag import Decomposition, decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.graph import Graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import (
    bound_in_chunks,
    crown_intervals,
    scatter_bounds,
    unit_functionals,
    unstable_indices,
)
from bounds.methods.pacing import passed
from bounds.types import Budget, Interval

INTERMEDIATE = ("ibp", "crown", "alpha-crown", "prox", "supergradient")


def _tighten(
    graph: Graph, truncated: Decomposition, box: Interval, intervals: dict[str, Interval],
    solve, deadline: float | None = None,
) -> Interval:  # fmt: skip
    """LD bounds of the neurons of `truncated`'s output node that need refinement."""
    name = truncated.graph.output.name
    index = unstable_indices(graph, name, intervals[name])
    current = intervals[name]
    if not index.numel():
        return current

    batch = box.lower.shape[0]
    shape = graph[name].shape

    def lower_bound(part: Tensor, offset: int) -> Tensor:
        c = unit_functionals(part, shape, batch, box.lower)
        problem = problem_from_intervals(truncated, box, intervals, c)
        return solve(problem, initial_duals(problem))

    low, up = bound_in_chunks(graph, name, index, batch, box.lower, lower_bound, None, deadline)
    return scatter_bounds(current, index, low, up)


def decomposition_intervals(
    graph: Graph,
    net: Decomposition,
    box: Interval,
    solve: Callable[..., Tensor],
    given: dict[str, Interval] | None = None,
    deadline: float | None = None,
) -> dict[str, Interval]:
    """CROWN intervals, then each node that feeds a nonlinearity and has one among its
    ancestors tightened in turn (topological order) by `solve(problem, init) -> [B, S] lower
    bounds` (a decomposition solver with its own budget); past `deadline`
    (`time.monotonic()`) the neurons left keep the intervals they have."""
    intervals = crown_intervals(graph, box, given, deadline)
    for name in dict.fromkeys(net.pre_names):
        if passed(deadline):
            break
        if graph[name].op is None:
            continue
        truncated = net.truncated(name)
        if truncated.acts:
            intervals[name] = _tighten(graph, truncated, box, intervals, solve, deadline)
    return intervals


def intermediate_intervals(
    graph: Graph,
    box: Interval,
    C: Tensor,
    kind: str,
    iterations: int = 50,
    given: dict[str, Interval] | None = None,
    deadline: float | None = None,
) -> dict[str, Interval]:
    """Intervals of every node by the method `kind` (see module docstring); `iterations` is
    the decomposition solvers' budget per layer; `given` intervals are intersected in;
    `deadline` (`time.monotonic()`): every stage stops by then, keeping valid intervals."""
    if kind == "ibp":
        return graph.interval(box, given)
    if kind == "crown":
        return crown_intervals(graph, box, given, deadline)
    if kind == "alpha-crown":
        base = crown_intervals(graph, box, given, deadline)
        config = AlphaCrownConfig()
        return alpha_crown(graph, box, C, config, intervals=base, deadline=deadline)[2]
    solvers = {
        "prox": (proximal.solve, proximal.ProximalConfig()),
        "supergradient": (supergradient.solve, supergradient.SupergradientConfig()),
    }
    if kind not in solvers:
        raise ValueError(f"intermediate must be one of {INTERMEDIATE}, got {kind!r}")
    solve_fn, config = solvers[kind]

    def solve(problem, init):
        return solve_fn(problem, config, init, Budget(iterations=iterations), deadline).lower

    return decomposition_intervals(graph, decompose(graph), box, solve, given, deadline)
