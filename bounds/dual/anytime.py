"""Anytime bookkeeping shared by the dual solvers: the best valid bound per problem with its
duals, budget checks every few iterations (host time only, no device sync in between), the
(time, bound) trajectory, and the final float64 re-evaluation."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from bounds.compile import CompileMode, check_mode
from bounds.dual.decomposition import Problem, evaluate
from bounds.dual.duals import Duals
from bounds.methods.pacing import Pacer, deadline_of
from bounds.types import Budget, rounded_down


@dataclass(frozen=True)
class DecompositionOptions:
    """Options shared by the decomposition solvers: check_every: iterations between time
    checks; intermediate: how pre-activation bounds are computed (ibp, crown, alpha-crown, prox,
    supergradient; the last two with `intermediate_iterations` per layer); init: start from the
    duals of `crown` or of `alpha-crown` (its final-layer slopes after `init_iterations` steps);
    compile: torch.compile the solver step (True / False / "auto": on CUDA only; see
    `bounds.compile`)."""

    check_every: int = 10
    intermediate: str = "alpha-crown"
    intermediate_iterations: int = 50
    init: str = "alpha-crown"
    init_iterations: int = 20
    compile: CompileMode = "auto"

    def __post_init__(self) -> None:
        check_mode(self.compile)
        if self.init not in ("crown", "alpha-crown") or self.init_iterations < 0:
            raise ValueError(f"init must be 'crown' or 'alpha-crown', got {self.init!r}")
        if self.check_every < 1 or self.intermediate_iterations < 0:
            raise ValueError("check_every must be >= 1 and intermediate_iterations >= 0")


def linear_step(initial: float, final: float, it: int, total: int) -> float:
    """Adam's step at iteration `it` of `total`, decayed linearly from `initial` to `final`
    (Bunel et al., UAI 2020, Sec. 4.1; De Palma et al., ICLR 2021, Sec. 5)."""
    frac = it / max(1, total - 1)
    return initial + frac * (final - initial)


@dataclass(frozen=True)
class DualResult:
    """lower: `[B, S]` valid bounds (float64-checked); duals: the duals achieving them."""

    lower: Tensor
    duals: Duals
    stats: dict

    @property
    def certificate(self) -> tuple[Tensor, ...]:
        """The multipliers to certify this bound from (`bounds.dual.certified`)."""
        return self.duals.rho


@dataclass
class Best:
    """Best dual value per problem and the duals achieving it."""

    value: Tensor
    duals: Duals

    def update(self, value: Tensor, duals: Duals) -> None:
        improved = value > self.value
        self.value = torch.where(improved, value, self.value)
        self.duals = duals.where(improved, self.duals)


@dataclass
class Clock:
    """Iteration / time budget: the trajectory is recorded every `check_every` iterations; the
    time (`deadline`, a `time.monotonic()` instant) is paced every iteration on the host clock
    (`Pacer`: no iteration starts that would end past it, keeping `reserve` seconds for the
    final float64 evaluation)."""

    iterations: int
    deadline: float | None
    check_every: int
    start: float = field(default_factory=time.perf_counter)
    trajectory: list[tuple[float, Tensor]] = field(default_factory=list)
    pacer: Pacer | None = None

    @staticmethod
    def from_budget(
        budget: Budget | None, iterations: int, check_every: int, deadline: float | None = None
    ) -> Clock:
        if budget is not None and budget.iterations is not None:
            iterations = budget.iterations
        return Clock(iterations, deadline_of(budget, deadline), check_every)

    def pace(self, reserve: float) -> None:
        """Start pacing now, keeping `reserve` seconds after the loop."""
        self.pacer = Pacer(self.deadline, reserve)

    def loop_deadline(self) -> float | None:
        """The deadline less the reserve kept after the loop (the steps' own deadline, e.g.
        for a compile: `step_function`); None without a deadline."""
        if self.deadline is None:
            return None
        return self.deadline - (self.pacer.reserve if self.pacer is not None else 0.0)

    def checkpoint(self, it: int, best: Best) -> bool:
        """Record the trajectory every `check_every` iterations; True when the time is up."""
        if not (it + 1) % self.check_every:
            self.record(best)
        return self.pacer is not None and self.pacer.done()

    def record(self, best: Best) -> bool:
        """Record `(elapsed, best value)` now; True when the deadline has passed."""
        elapsed = time.perf_counter() - self.start
        self.trajectory.append((elapsed, best.value.clone()))
        return self.deadline is not None and time.monotonic() >= self.deadline

    def stats(self, iterations: int) -> dict:
        return {
            "iterations": iterations,
            "trajectory": [(t, v.detach().cpu()) for t, v in self.trajectory],
            "solver_seconds": time.perf_counter() - self.start,
        }


def problem_tensors(p: Problem) -> tuple[Tensor, ...]:
    """The problem's tensors whose dimension 0 is the batch (to mark dynamic when compiling)."""
    return (p.box.lower, p.box.upper, *p.lower, *p.upper, p.c)


def finalize(problem: Problem, best: Best, clock: Clock, iterations: int) -> DualResult:
    """Re-evaluate the best duals in float64 (the reported value is `q` at those duals, never a
    running accumulator) and package the result in the problem's dtype, rounded down."""
    dtype = problem.c.dtype
    value, _ = evaluate(problem.to(torch.float64), best.duals.to(torch.float64))
    return DualResult(rounded_down(value, dtype), best.duals, clock.stats(iterations))
