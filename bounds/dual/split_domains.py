"""Dual bounds on ReLU-split branch-and-bound domains, for the stage that re-bounds the domains
alpha-beta-CROWN leaves open. Each domain's relaxation uses the root's intermediate bounds
clamped by its splits (a split neuron's relaxation is then exact, so the splits need no
multipliers), started from the domain's slopes:
- `prox`: the Planet relaxation by the proximal method from the CROWN duals of the slopes
  (Bunel, De Palma et al., UAI 2020);
- `active-set`: the Anderson relaxation by the dual active set from the Big-M duals of the
  slopes (De Palma et al., ICLR 2021; the OVAL framework bounds its hard subtrees so), on ReLU
  chains.
`HARD_BOUNDERS[name] = (prepare, bound)`: `prepare(graph)` gives the network in the bounder's
form (UnsupportedOperationError when it cannot take the graph), `bound(net, box, intervals, c,
slopes, iterations, deadline, exact)` the domains' bounds."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.dual import active_set
from bounds.dual.anderson import (
    Layers,
    anderson_layers,
    anderson_slopes,
    dual_value,
    problem_from_layers,
)
from bounds.dual.dag import Decomposition, decompose
from bounds.dual.decomposition import evaluate, initial_duals, problem_from_intervals
from bounds.dual.proximal import ProximalConfig, solve
from bounds.types import Interval


def prox_split_bounds(
    net: Decomposition,
    box: Interval,
    intervals: dict[str, Interval],
    c: Tensor,
    slopes: tuple[Tensor, ...],
    iterations: int,
    deadline: float | None = None,
    exact: tuple[Decomposition, dict[str, Interval], Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`[N, S]` lower bounds of `c . y` (`c [N, S, *out_shape]`) on the domains: `box`
    `[N, *in_shape]`, `intervals` per pre-activation node `[N, *shape]` (already clamped by the
    splits), `slopes` per activation `[N, S, *shape]` in `net.acts` order (the start duals).
    `net`: `decompose(graph)` of any graph (chains, residual, concatenating). Any dual point is
    valid; the solver returns its best (float64-checked) within `iterations` sweeps and the
    `deadline` (`time.monotonic()`). `exact = (net64, intervals64, c64)`: the same duals are
    also evaluated in float64 for that objective and those intervals (second result, else
    None): the float64 bound that may close a domain."""
    problem = problem_from_intervals(net, box, intervals, c)
    init = initial_duals(problem, slopes)
    result = solve(problem, ProximalConfig(iterations=iterations), init, deadline=deadline)
    if exact is None:
        return result.lower, None
    net64, intervals64, c64 = exact
    box64 = Interval(box.lower.to(torch.float64), box.upper.to(torch.float64))
    problem64 = problem_from_intervals(net64, box64, intervals64, c64)
    value64, _ = evaluate(problem64, result.duals.to(torch.float64))
    return result.lower, value64


def anderson_split_bounds(
    net: Layers,
    box: Interval,
    intervals: dict[str, Interval],
    c: Tensor,
    slopes: tuple[Tensor, ...],
    iterations: int,
    deadline: float | None = None,
    exact: tuple[Layers, dict[str, Interval], Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`prox_split_bounds` with the active-set solver of the Anderson relaxation (`net`:
    `anderson_layers(graph)` of a ReLU chain; `slopes` per ReLU `[N, S, *shape]` in its order):
    `iterations` Adam steps with the default cut schedule."""
    problem = problem_from_layers(net, box, intervals, c)
    by_name = dict(zip(net.act_names, slopes))
    init = active_set.big_m_from_slopes(problem, anderson_slopes(problem, by_name))
    config = active_set.ActiveSetConfig(iterations=iterations)
    result = active_set.solve(problem, config, init, deadline=deadline)
    if exact is None:
        return result.lower, None
    net64, intervals64, c64 = exact
    box64 = Interval(box.lower.to(torch.float64), box.upper.to(torch.float64))
    p64 = problem_from_layers(net64, box64, intervals64, c64)
    return result.lower, dual_value(p64, result.cuts, result.duals)


HARD_BOUNDERS = {
    "prox": (decompose, prox_split_bounds),
    "active-set": (anderson_layers, anderson_split_bounds),
}
