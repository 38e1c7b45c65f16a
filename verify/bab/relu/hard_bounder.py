"""Dual bounds on ReLU-split branch-and-bound domains, for the stage that re-bounds the domains
alpha-beta-CROWN leaves open. Each domain's relaxation uses the root's intermediate bounds
clamped by its splits (a split neuron's relaxation is then exact, so the splits need no
multipliers), started from the domain's slopes:
- `prox`: the Planet relaxation by the proximal method from the CROWN duals of the slopes
  (Bunel, De Palma et al., UAI 2020);
- `active-set`: the Anderson relaxation by the dual active set from the Big-M duals of the
  slopes (De Palma et al., ICLR 2021; the OVAL framework bounds its hard subtrees so), on ReLU
  chains.
`HARD_BOUNDERS[name] = HardBound(prepare, bound)`, for the bound methods registered as hard
bounders (`bounds.registry.methods_with("hard_bounder")`), by the relaxation they solve:
`prepare(graph)` gives the network in the bounder's form (UnsupportedOperationError when it
cannot take the graph), `bound(net, box, intervals, c, slopes, iterations, deadline, exact,
warm)` the domains' bounds (`SplitBounds`).

Warm starts (the bounders of `WARM_STARTS`, the methods registered with `warm_start`): `bound` returns the duals it ended at
(`SplitBounds.start`), and takes such duals of an earlier, larger domain (`warm`: the parent's,
in branch and bound; De Palma et al. 2021, Sec. 5, "children inherit the parent's duals and
active sets"). A child's relaxation is its parent's with some intervals narrowed (the split
neurons', clamped at 0): every nonnegative dual point of the parent is a dual point of the
child, its Anderson constraints are valid there, and their terms (`kappa`, `zeta`: functions of
the input box) are recomputed from the stored masks with the child's intervals, so its value is
a valid bound of the child. Per domain and spec the solver starts from the better (by dual
value) of that point and the slopes' Big-M duals, so its bound is never below the cold start's
starting bound."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from bounds.dual import active_set
from bounds.dual.anderson.certified import certified_anderson_value
from bounds.dual.anderson.cuts import Cuts
from bounds.dual.anderson.evaluation import AndersonDuals, dual_value
from bounds.dual.anderson.problem import (
    AndersonProblem,
    Layers,
    anderson_layers,
    anderson_slopes,
    problem_from_layers,
)
from bounds.dual.certified import certified_value
from bounds.dual.dag import Decomposition, decompose
from bounds.dual.decomposition import initial_duals, problem_from_intervals
from bounds.dual.proximal import ProximalConfig, solve
from bounds.registry import Relaxation, get_method, methods_with
from bounds.types import Interval


class AndersonStart(NamedTuple):
    """Anderson duals per domain and spec (`[N, S, ...]`, `AndersonDuals`), the cuts they go
    with (per hidden layer, `[N, S, R_k, ...]`), and `given [N]` bool (False: no start for
    that domain; its duals are zeros and its cuts padding)."""

    duals: AndersonDuals
    cuts: tuple[Cuts, ...]
    given: Tensor


class SplitBounds(NamedTuple):
    """What a hard bounder returns: `lower [N, S]`, its float64 twin certified in floating point
    (`bounds.dual.certified`, `bounds.dual.anderson.certified`; None unless asked), the
    duals it ended at as a warm start for the domains' children (None: the bounder keeps none),
    and `warm [N, S]` bool, where it started from the `warm` start given (None: none given)."""

    lower: Tensor
    lower64: Tensor | None
    start: AndersonStart | None = None
    warm: Tensor | None = None


def prox_split_bounds(
    net: Decomposition,
    box: Interval,
    intervals: dict[str, Interval],
    c: Tensor,
    slopes: tuple[Tensor, ...],
    iterations: int,
    deadline: float | None = None,
    exact: tuple[Decomposition, dict[str, Interval], Tensor] | None = None,
    warm: AndersonStart | None = None,
) -> SplitBounds:
    """`[N, S]` lower bounds of `c . y` (`c [N, S, *out_shape]`) on the domains: `box`
    `[N, *in_shape]`, `intervals` per pre-activation node `[N, *shape]` (already clamped by the
    splits), `slopes` per activation `[N, S, *shape]` in `net.acts` order (the start duals).
    `net`: `decompose(graph)` of any graph (chains, residual, concatenating). Any dual point is
    valid; the solver returns its best (float64-checked) within `iterations` sweeps and the
    `deadline` (`time.monotonic()`). `exact = (net64, intervals64, c64)`: the same duals'
    bound certified in float64 for that objective and those intervals (`certified_value`;
    second result, else None): the bound that may close a domain. No warm start (`warm` must be None)."""
    if warm is not None:
        raise ValueError("the proximal bounder takes no warm start")
    problem = problem_from_intervals(net, box, intervals, c)
    init = initial_duals(problem, slopes)
    result = solve(problem, ProximalConfig(iterations=iterations), init, deadline=deadline)
    if exact is None:
        return SplitBounds(result.lower, None)
    net64, intervals64, c64 = exact
    box64 = Interval(box.lower.to(torch.float64), box.upper.to(torch.float64))
    every = net64.graph.interval(box64, intervals64)  # the tracked pass reads every node's
    return SplitBounds(result.lower, certified_value(net64, box64, every, c64, result.duals.rho))


def anderson_split_bounds(
    net: Layers,
    box: Interval,
    intervals: dict[str, Interval],
    c: Tensor,
    slopes: tuple[Tensor, ...],
    iterations: int,
    deadline: float | None = None,
    exact: tuple[Layers, dict[str, Interval], Tensor] | None = None,
    warm: AndersonStart | None = None,
) -> SplitBounds:
    """`prox_split_bounds` with the active-set solver of the Anderson relaxation (`net`:
    `anderson_layers(graph)` of a ReLU chain; `slopes` per ReLU `[N, S, *shape]` in its order):
    `iterations` Adam steps with the default cut schedule. `warm` (module docstring): per
    domain and spec, the start is the better of its duals (where given) and the slopes'; its
    cuts are kept (their multipliers 0 in a slope start) and `WARM_ROUNDS` cut rounds start at
    once (the child's relaxation is not the parent's: the oracle finds the constraints it
    violates). Returns the best duals and their cuts (`start`)."""
    problem = problem_from_layers(net, box, intervals, c)
    by_name = dict(zip(net.act_names, slopes))
    init = active_set.big_m_from_slopes(problem, anderson_slopes(problem, by_name))
    config = active_set.ActiveSetConfig(iterations=iterations)
    cuts, used = None, None
    if warm is not None:
        init, cuts, used = _better_start(problem, init, warm)
    rounds = 0 if warm is None else max(0, config.max_cuts - WARM_ROUNDS)
    result = active_set.solve(problem, config, init, deadline=deadline, cuts=cuts, rounds=rounds)
    given = torch.ones(problem.c.shape[0], dtype=torch.bool, device=problem.c.device)
    start = AndersonStart(result.duals, result.cuts, given)
    if exact is None:
        return SplitBounds(result.lower, None, start, used)
    net64, intervals64, c64 = exact
    box64 = Interval(box.lower.to(torch.float64), box.upper.to(torch.float64))
    p64 = problem_from_layers(net64, box64, intervals64, c64)
    value64 = certified_anderson_value(p64, result.cuts, result.duals)
    return SplitBounds(result.lower, value64, start, used)


def _better_start(
    p: AndersonProblem, cold: AndersonDuals, warm: AndersonStart
) -> tuple[AndersonDuals, tuple[Cuts, ...], Tensor]:
    """Per domain and spec the better start by `d` on `p` (the child's relaxation; the warm
    cuts' terms computed with its intervals): the warm duals where given and better, else the
    `cold` ones (no cut multiplier). Returns the start, its cuts and `[N, S]` where warm."""
    slots = tuple(c.rows.shape[2] for c in warm.cuts)
    cold = cold.padded(slots)
    value_cold = dual_value(p, warm.cuts, cold, sparse=True)
    value_warm = dual_value(p, warm.cuts, warm.duals, sparse=True)
    use = warm.given.unsqueeze(1) & (value_warm > value_cold)

    def pick(a: Tensor, b: Tensor) -> Tensor:
        return torch.where(use.reshape(*use.shape, *([1] * (a.dim() - 2))), a, b)

    init = AndersonDuals.unflat(tuple(pick(a, b) for a, b in zip(warm.duals.flat(), cold.flat())))
    return init, warm.cuts, use


# cut rounds of a warm-started solve (on top of the parent's cuts): with 60 iterations, 2 cost
# what a cold start's 4 do and gave most of the 4's gain on mnist_fc children
# (`benchmarks/warm_children.py`, `benchmarks/results/vnncomp_mnist_fc_warm.md`)
WARM_ROUNDS = 2


class HardBound(NamedTuple):
    """A hard bounder: `prepare(graph)` the network in its form, `bound(...)` the domains'
    bounds (module docstring)."""

    prepare: Callable[[Any], Any]
    bound: Callable[..., SplitBounds]


# how split domains are bounded in each relaxation a bound method may declare
BY_RELAXATION = {
    Relaxation.PLANET: HardBound(decompose, prox_split_bounds),
    Relaxation.ANDERSON: HardBound(anderson_layers, anderson_split_bounds),
}
HARD_BOUNDERS = {
    name: BY_RELAXATION[get_method(name).relaxation] for name in methods_with("hard_bounder")
}
WARM_STARTS = methods_with("warm_start")  # the hard bounders that return and take warm starts
