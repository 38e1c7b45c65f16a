"""Value types shared by the bound methods.

Shapes: batch first. A linear functional on a node of shape `shape` (without batch) is a tensor
`A` of shape `[batch, n_specs, *shape]`; we lower-bound `min_x A . f(x)` (upper bounds are lower
bounds of `-A`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from bounds.errors import InvalidLimitError


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
        iterations, seconds = self.iterations, self.seconds
        if iterations is not None and (
            isinstance(iterations, bool)
            or not isinstance(iterations, numbers.Integral)
            or iterations < 0
        ):
            raise InvalidLimitError(f"budget iterations must be an int >= 0, got {iterations!r}")
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
                raise InvalidLimitError(f"budget seconds must be a number, got {seconds!r}")
            if not seconds > 0:  # also NaN
                raise InvalidLimitError(f"budget seconds must be > 0, got {seconds!r}")


def rounded_down(t: Tensor, dtype: torch.dtype) -> Tensor:
    """`t` in `dtype`, every value rounded towards -inf (never above `t`)."""
    low = t.to(dtype)
    return torch.where(low.to(t.dtype) > t, torch.nextafter(low, low.new_tensor(-torch.inf)), low)


def rounded_up(t: Tensor, dtype: torch.dtype) -> Tensor:
    """`t` in `dtype`, every value rounded towards +inf (never below `t`)."""
    up = t.to(dtype)
    return torch.where(up.to(t.dtype) < t, torch.nextafter(up, up.new_tensor(torch.inf)), up)
