"""Lagrangian-decomposition bounds on ReLU-split branch-and-bound domains: each domain's Planet
relaxation is the root's intermediate bounds clamped by its splits (a split neuron's relaxation
is then exact, so the splits need no multipliers), solved by the proximal method from the CROWN
duals of the domain's slopes (Bunel, De Palma et al., UAI 2020)."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.dual.dag import Decomposition
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
