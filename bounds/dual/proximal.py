"""Proximal method for the Lagrangian-decomposition dual (Bunel, De Palma et al., UAI 2020,
Sec. 4.2): maximise `q(rho) - ||rho - anchor||^2 / (2 eta)` by block-coordinate Frank-Wolfe on
its primal QP

    min  c . xhA_n + sum_i anchor_i . (xhB_i - xhA_i) + (1 / (2 eta)) sum_i ||xhB_i - xhA_i||^2

over the subproblems' sets. The conditional gradient of block j is the oracle's minimiser under
`rho = anchor + (xhB - xhA) / eta`; the exact line search is closed form and clipped to [0, 1].
The anchor moves every `inner` sweeps (to the current `rho`, with momentum); `eta` grows
linearly over the run. Only `q` at an anchor's `rho` is ever reported (evaluated by the oracle).

Scale: with `rho = anchor + (xhB - xhA) / eta` the proximal term is `(1 / (2 eta)) ||.||^2` in
the primal and `(eta / 2) ||rho - anchor||^2` in the dual, so a larger eta takes shorter steps.
`eta` is relative: layer i uses `eta * ||xhB_i - xhA_i|| / ||rho_i||` measured at the start, which
makes the defaults independent of the network's and the objective's scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.dual.anytime import Best, Clock, DecompositionOptions, DualResult, finalize
from bounds.dual.decomposition import Problem, evaluate, solve_block
from bounds.dual.duals import Duals
from bounds.types import Budget


@dataclass(frozen=True)
class ProximalConfig(DecompositionOptions):
    """iterations: Frank-Wolfe sweeps over all blocks (a budget overrides); inner: sweeps
    between anchor moves; eta_start/eta_end: the (relative) proximal weight, grown linearly;
    momentum: on the anchor moves; shared options: see `DecompositionOptions`."""

    iterations: int = 100
    inner: int = 2
    eta_start: float = 3.0
    eta_end: float = 30.0
    momentum: float = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.iterations < 0 or self.inner < 1:
            raise ValueError("iterations >= 0 and inner >= 1 are required")
        if not (self.eta_start > 0 and self.eta_end > 0) or not 0 <= self.momentum < 1:
            raise ValueError("eta must be > 0 and momentum in [0, 1)")


def _sum(t: Tensor) -> Tensor:
    return t.flatten(2).sum(-1)


def _gamma(num: Tensor, den: Tensor) -> Tensor:
    """Exact line-search step per problem, clipped to [0, 1]; a linear objective (den = 0)
    takes the full step when it descends."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    step = torch.where(den > 0, num / safe, (num > 0).to(num.dtype))
    return step.clamp(0.0, 1.0)


def _expand(gamma: Tensor, like: Tensor) -> Tensor:
    return gamma.reshape(*gamma.shape, *([1] * (like.dim() - 2)))


@dataclass
class _Primal:
    """Current QP point: `xhB[i]` (hidden layer i+1) and `xhA[j]` (block j's output)."""

    xhB: list[Tensor]
    xhA: list[Tensor]

    def rho(self, anchor: Duals, eta: list[Tensor], i: int) -> Tensor:
        return anchor.rho[i] + (self.xhB[i] - self.xhA[i]) / _expand(eta[i], self.xhB[i])

    def duals(self, anchor: Duals, eta: list[Tensor]) -> Duals:
        return Duals(tuple(self.rho(anchor, eta, i) for i in range(len(self.xhB))))


def _block_step(p: Problem, x: _Primal, anchor: Duals, eta: list[Tensor], j: int) -> None:
    """One Frank-Wolfe step on block j: conditional gradient, exact step, convex combination."""
    last = j == p.n_blocks - 1
    rho: list[Tensor | None] = [None] * len(x.xhB)
    if j >= 1:
        rho[j - 1] = x.rho(anchor, eta, j - 1)
    if not last:
        rho[j] = x.rho(anchor, eta, j)
    cg = solve_block(p, rho, j)
    d_a = cg.xhA - x.xhA[j]
    num = _sum(p.c * -d_a) if last else _sum(rho[j] * d_a)
    den = torch.zeros_like(num) if last else _sum(d_a * d_a) / eta[j]
    if j >= 1:
        d_b = cg.xhB - x.xhB[j - 1]
        num = num - _sum(rho[j - 1] * d_b)
        den = den + _sum(d_b * d_b) / eta[j - 1]
    gamma = _gamma(num, den)
    x.xhA[j] = x.xhA[j] + _expand(gamma, d_a) * d_a
    if j >= 1:
        x.xhB[j - 1] = x.xhB[j - 1] + _expand(gamma, d_b) * d_b


def _eta(config: ProximalConfig, scale: list[Tensor], sweep: int, total: int) -> list[Tensor]:
    """`eta_i = eta(t) * scale_i`, `eta(t)` linear from `eta_start` to `eta_end`."""
    frac = sweep / max(1, total - 1)
    factor = config.eta_start + frac * (config.eta_end - config.eta_start)
    return [factor * s for s in scale]


def _eta_scale(duals: Duals, solutions) -> list[Tensor]:
    """Per layer and problem `||xhB - xhA|| / ||rho||` at the start: makes `eta` invariant to
    the scales of the network's activations and of the objective."""
    scale = []
    for i, rho in enumerate(duals.rho):
        gap = (solutions[i + 1].xhB - solutions[i].xhA).flatten(2).norm(dim=-1)
        size = rho.flatten(2).norm(dim=-1)
        ratio = gap / size.clamp(min=1e-12)
        scale.append(torch.where((gap > 0) & (size > 0), ratio, torch.ones_like(ratio)))
    return scale


def solve(
    problem: Problem, config: ProximalConfig, init: Duals, budget: Budget | None = None
) -> DualResult:
    """Maximise `q(rho)` from `init`; returns the best bound seen (never below `q(init)`)."""
    clock = Clock.from_budget(budget, config.iterations, config.check_every)
    anchor = init.clone()
    value, solutions = evaluate(problem, anchor)
    best = Best(value, anchor)
    primal = _Primal([s.xhB for s in solutions[1:]], [s.xhA for s in solutions])
    scale = _eta_scale(anchor, solutions)
    previous = anchor
    sweep = 0
    for sweep in range(clock.iterations):
        eta = _eta(config, scale, sweep, clock.iterations)
        for j in range(problem.n_blocks):
            _block_step(problem, primal, anchor, eta, j)
        if (sweep + 1) % config.inner == 0 or sweep == clock.iterations - 1:
            rho = primal.duals(anchor, eta)
            value, _ = evaluate(problem, rho)
            best.update(value, rho)
            anchor, previous = rho + (rho - previous).scale(config.momentum), rho
        if clock.checkpoint(sweep, best):
            break
    return finalize(problem, best, clock, sweep + 1 if clock.iterations else 0)
