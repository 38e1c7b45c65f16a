"""Deadlines for the iterative bound methods and the search loops around them.

A deadline is an instant of `time.monotonic()` (None: no limit). It is read on the host only:
no tensor is synchronised to check it, so a check costs a clock read and can sit in every
iteration. `Pacer` stops a loop *before* an iteration that would end past the deadline, from
the measured duration of the previous ones; stages without a loop (one bound pass) check it
between their chunks or layers and keep the bounds they have (`crown_intervals`) or raise.
"""

from __future__ import annotations

import math
import time

from bounds.types import Budget


def deadline_of(
    budget: Budget | None, deadline: float | None = None, start: float | None = None
) -> float | None:
    """The earlier of `deadline` and `start + budget.seconds` (`start`: now by default), as a
    `time.monotonic()` instant; None when neither limits the time."""
    if budget is not None and budget.seconds is not None:
        start = time.monotonic() if start is None else start
        own = start + budget.seconds
        deadline = own if deadline is None else min(deadline, own)
    return deadline


def passed(deadline: float | None) -> bool:
    """Whether the deadline (None: never) has passed."""
    return deadline is not None and time.monotonic() >= deadline


def seconds_left(deadline: float | None) -> float:
    """Seconds until the deadline (`inf` without one; negative once passed)."""
    return math.inf if deadline is None else deadline - time.monotonic()


class Pacer:
    """Paces a loop against a deadline. Call `done()` after each iteration: True when the next
    iteration, predicted to take as long as the slower of the last two (plus `reserve`
    seconds for the work after the loop), would end past the deadline. Host clock only."""

    def __init__(self, deadline: float | None, reserve: float = 0.0) -> None:
        self.deadline, self.reserve = deadline, reserve
        self.last = time.monotonic()
        self.durations: list[float] = []

    def done(self) -> bool:
        now = time.monotonic()
        self.durations = [*self.durations[-1:], now - self.last]
        self.last = now
        if self.deadline is None:
            return False
        return now + max(self.durations) + self.reserve > self.deadline
