"""Supergradient ascent on the Lagrangian-decomposition dual (Bunel et al., UAI 2020, Sec. 4.1):
Adam (betas 0.9, 0.999) on `q(rho)` with the supergradient `xhB* - xhA*`, its step decaying
linearly from `initial_step` to `final_step`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bounds.dual.anytime import Best, Clock, DecompositionOptions, DualResult, finalize
from bounds.dual.decomposition import Problem, evaluate, supergradient
from bounds.dual.duals import Duals
from bounds.types import Budget


@dataclass(frozen=True)
class SupergradientConfig(DecompositionOptions):
    """iterations: ascent steps (a budget overrides); steps: Adam's step, linearly decayed from
    `initial_step` to `final_step`; shared options: see `DecompositionOptions`."""

    iterations: int = 100
    initial_step: float = 1e-2
    final_step: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.iterations < 0:
            raise ValueError("iterations must be >= 0")
        if not (self.initial_step > 0 and self.final_step > 0):
            raise ValueError("steps must be > 0")


def _step_size(config: SupergradientConfig, it: int, total: int) -> float:
    frac = it / max(1, total - 1)
    return config.initial_step + frac * (config.final_step - config.initial_step)


def solve(
    problem: Problem, config: SupergradientConfig, init: Duals, budget: Budget | None = None
) -> DualResult:
    """Maximise `q(rho)` from `init`; returns the best bound seen (never below `q(init)`)."""
    clock = Clock.from_budget(budget, config.iterations, config.check_every)
    duals = init.clone()
    m = [torch.zeros_like(r) for r in duals.rho]
    v = [torch.zeros_like(r) for r in duals.rho]
    value, solutions = evaluate(problem, duals)
    best = Best(value, duals)
    it = 0
    for it in range(clock.iterations):
        grad = supergradient(solutions)
        step = _step_size(config, it, clock.iterations)
        c1, c2 = 1 - 0.9 ** (it + 1), 1 - 0.999 ** (it + 1)
        rho = []
        for r, g, m_i, v_i in zip(duals.rho, grad.rho, m, v):
            m_i.mul_(0.9).add_(g, alpha=0.1)
            v_i.mul_(0.999).addcmul_(g, g, value=0.001)
            rho.append(r + step * (m_i / c1) / ((v_i / c2).sqrt() + 1e-8))
        duals = Duals(tuple(rho))
        value, solutions = evaluate(problem, duals)
        best.update(value, duals)
        if clock.checkpoint(it, best):
            break
    return finalize(problem, best, clock, it + 1 if clock.iterations else 0)
