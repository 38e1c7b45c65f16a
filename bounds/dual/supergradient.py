"""Supergradient ascent on the Lagrangian-decomposition dual (Bunel et al., UAI 2020, Sec. 4.1):
Adam (betas 0.9, 0.999) on `q(rho)` with the supergradient `xhB* - xhA*`, its step decaying
linearly from `initial_step` to `final_step`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.compile import mark_batch_dynamic, should_compile, step_function
from bounds.dual.anytime import (
    Best,
    Clock,
    DecompositionOptions,
    DualResult,
    finalize,
    linear_step,
    problem_tensors,
)
from bounds.dual.decomposition import Problem, evaluate, supergradient
from bounds.dual.duals import Duals
from bounds.dual.intermediate import decomposition_intermediate
from bounds.dual.method_start import decomposition_method
from bounds.optim import adam_ascent, identity
from bounds.registry import Relaxation, register_method
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


class AscentState(NamedTuple):
    """All tensors: the duals, the supergradient at them, Adam's moments and step count
    (0-d), and the best `q` per problem `[B, S]` with the duals achieving it."""

    rho: tuple[Tensor, ...]
    grad: tuple[Tensor, ...]
    m: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    t: Tensor
    best_value: Tensor
    best_rho: tuple[Tensor, ...]


def ascent_step(p: Problem, state: AscentState, step: Tensor) -> AscentState:
    """One Adam ascent step on `q` along the supergradient, then `q` and its supergradient at
    the new duals and the best-so-far update (pure: `torch.compile` fuses it)."""
    projections = (identity,) * len(state.rho)
    params, m, v, t = adam_ascent(
        state.rho, state.grad, state.m, state.v, state.t, step, projections
    )
    rho = Duals(params)
    value, solutions = evaluate(p, rho)
    improved = value > state.best_value
    best = rho.where(improved, Duals(state.best_rho))
    best_value = torch.where(improved, value, state.best_value)
    return AscentState(rho.rho, supergradient(p, solutions).rho, m, v, t, best_value, best.rho)


def initial_state(problem: Problem, init: Duals) -> AscentState:
    """Adam's zero moments at `init`, with `q(init)` as the best so far."""
    value, solutions = evaluate(problem, init)
    m = tuple(torch.zeros_like(r) for r in init.rho)
    v = tuple(torch.zeros_like(r) for r in init.rho)
    t = problem.c.new_zeros(())
    grad = supergradient(problem, solutions).rho
    return AscentState(init.rho, grad, m, v, t, value, init.clone().rho)


def solve(
    problem: Problem, config: SupergradientConfig, init: Duals, budget: Budget | None = None,
    deadline: float | None = None,
) -> DualResult:  # fmt: skip
    """Maximise `q(rho)` from `init`; returns the best bound seen (never below `q(init)`).
    The budget's seconds (from the call) and `deadline` (`time.monotonic()`), whichever comes
    first, are paced every iteration (host clock)."""
    clock = Clock.from_budget(budget, config.iterations, config.check_every, deadline)
    tick = time.monotonic()
    state = initial_state(problem, init)
    clock.pace(reserve=3 * (time.monotonic() - tick))  # the final float64 evaluation
    use = should_compile(config.compile, problem.c.device, cpu_default=False)
    step_fn = step_function(ascent_step, use, deadline=clock.loop_deadline())
    if use:
        mark_batch_dynamic((problem_tensors(problem), state))
    it = 0
    for it in range(clock.iterations):
        size = linear_step(config.initial_step, config.final_step, it, clock.iterations)
        step = torch.full((), size, dtype=problem.c.dtype, device=problem.c.device)
        state = step_fn(problem, state, step)
        if clock.checkpoint(it, Best(state.best_value, Duals(state.best_rho))):
            break
    best = Best(state.best_value, Duals(state.best_rho))
    return finalize(problem, best, clock, it + 1 if clock.iterations else 0)


register_method(
    "supergradient", SupergradientConfig, "Lagrangian decomposition, supergradient ascent",
    intermediate=decomposition_intermediate(solve, SupergradientConfig),
    relaxation=Relaxation.PLANET,
)(decomposition_method(solve))  # fmt: skip
