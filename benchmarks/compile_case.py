"""One benchmark case of ``benchmarks/compile_bench.py``: a pure solver step and its start state.

Case modules (``benchmarks/compile_cases_*.py``) each expose ``cases(quick: bool) -> list[Case]``;
the bench times ``case.step`` eagerly and through ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Case"]


@dataclass(frozen=True)
class Case:
    """``step(state) -> state`` over tensors (a tensor or a tuple of tensors, the same
    structure in and out), run ``iterations`` times from ``state`` per timing.

    ``cpu_default``: whether the library compiles this step by default on CPU
    (``compile="auto"``); None for cases that are not a library step (micro-benchmarks).
    ``default_iterations``: how many times one default solver call runs the step (used for
    the break-even column: does a warm compile pay for itself within one call?).
    """

    name: str
    step: Callable[[Any], Any]
    state: Any
    iterations: int
    cpu_default: bool | None = None
    default_iterations: int | None = None
