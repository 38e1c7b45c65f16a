"""Value types shared by the bound methods.

Shapes: batch first. A linear functional on a node of shape `shape` (without batch) is a tensor
`A` of shape `[batch, n_specs, *shape]`; we lower-bound `min_x A . f(x)` (upper bounds are lower
bounds of `-A`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Interval:
    """Elementwise bounds `lower <= v <= upper`, each `[batch, *shape]`."""

    lower: Tensor
    upper: Tensor

    @property
    def center(self) -> Tensor:
        return (self.upper + self.lower) / 2

    @property
    def radius(self) -> Tensor:
        return (self.upper - self.lower) / 2

    def intersect(self, other: Interval) -> Interval:
        """Both intervals are valid, so their intersection is valid (never empty for sound inputs)."""
        return Interval(
            torch.maximum(self.lower, other.lower), torch.minimum(self.upper, other.upper)
        )


@dataclass(frozen=True)
class Bounds:
    """Result of `verify.bounds`.

    lower, upper: `[batch, n_specs]` bounds on `C @ y` (or on the outputs `y` when no `C`).
    intermediate: per pre-activation node name, its `Interval` (`[batch, *shape]`).
    stats: method, iterations, seconds and method-specific entries.
    """

    lower: Tensor
    upper: Tensor
    intermediate: dict[str, Interval] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Budget:
    """An anytime budget: stop after `iterations` and/or `seconds`, whichever comes first."""

    iterations: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.iterations is not None and self.iterations < 0:
            raise ValueError(f"budget iterations must be >= 0, got {self.iterations}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"budget seconds must be > 0, got {self.seconds}")
