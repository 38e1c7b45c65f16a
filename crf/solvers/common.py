"""Shared solver pieces: the result type, the budget (iterations / seconds) and the registry."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from crf.errors import ConfigError

__all__ = ["SOLVERS", "Budget", "SolverResult", "check_flags", "check_positive", "register"]

SOLVERS: dict[str, tuple[Callable, type]] = {}


def register(name: str, config_cls: type) -> Callable:
    """Decorator: register ``solve(model, init, config)`` under ``name`` with its config type."""

    def wrap(fn: Callable) -> Callable:
        SOLVERS[name] = (fn, config_cls)
        return fn

    return wrap


def check_positive(obj: object, names: tuple[str, ...], *, allow_zero: bool = False) -> None:
    """Raise :class:`ConfigError` unless each named field is a finite number > 0 (or >= 0)."""
    for name in names:
        v = getattr(obj, name)
        ok = isinstance(v, int | float) and v == v and abs(v) != float("inf")
        ok = ok and (v >= 0 if allow_zero else v > 0)
        if not ok:
            bound = ">= 0" if allow_zero else "> 0"
            raise ConfigError(f"{type(obj).__name__}.{name} must be finite and {bound}, got {v!r}")


def check_flags(obj: object, names: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` unless each named field is a bool."""
    for name in names:
        v = getattr(obj, name)
        if not isinstance(v, bool):
            raise ConfigError(f"{type(obj).__name__}.{name} must be True or False, got {v!r}")


@dataclass
class SolverResult:
    """Relaxed solution ``q`` (B, N, M), best rounded ``labels`` (B, N), their model ``energy``
    (B,) float64, the iteration count, wall time, and method-specific ``stats``."""

    q: torch.Tensor
    labels: torch.Tensor
    energy: torch.Tensor
    iterations: int
    seconds: float
    stats: dict = field(default_factory=dict)


class Budget:
    """Iteration and wall-clock budget.

    With a seconds budget the solver stops *before* an iteration that would end past it: the
    next iteration is predicted to take as long as the longest one so far (``first_step_s``,
    if given, before any has run), so a budget is kept to within the variation of one
    iteration's time rather than overrun by a whole one. Reading the clock costs no device sync
    (on CUDA the queued work is not waited for, so the prediction is approximate there).
    ``check_every`` is kept for the solvers' convergence checks.
    """

    def __init__(
        self,
        iterations: int,
        seconds: float | None,
        check_every: int = 1,
        first_step_s: float = 0.0,
    ) -> None:
        self.iterations = iterations
        self.seconds = seconds
        self.check_every = max(1, check_every)
        self.start = time.perf_counter()
        self.step_s = first_step_s
        self._last: tuple[int, float] | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def deadline(self) -> float | None:
        """The end of the seconds budget as a `time.monotonic()` instant (None without one),
        for `step_function`: a step whose compile would end past it runs eagerly."""
        if self.seconds is None:
            return None
        return time.monotonic() + self.seconds - self.elapsed()

    def out_of_time(self) -> bool:
        """True once the seconds budget is spent (reads the clock; no device sync)."""
        return self.seconds is not None and self.elapsed() >= self.seconds

    def exhausted(self, it: int) -> bool:
        """True once ``it`` (completed iterations) reaches the limit, or the next iteration
        would not end within the seconds budget."""
        if it >= self.iterations:
            return True
        if self.seconds is None:
            return False
        now = time.perf_counter()
        if self._last is not None and it > self._last[0]:
            self.step_s = max(self.step_s, (now - self._last[1]) / (it - self._last[0]))
        self._last = (it, now)
        return now - self.start + self.step_s > self.seconds
