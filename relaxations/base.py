"""Value types and the protocol every convex relaxation of an elementwise nonlinearity follows.

A relaxation bounds `x = sigma(xh)` for `xh` in `[lower, upper]` (elementwise, plain tensors).
It supplies
- `linear_bounds(lower, upper, alpha)`: lines `a_l xh + b_l <= x <= a_u xh + b_u` (CROWN);
- `argmin(coeff_pre, coeff_post, lower, upper)`: closed-form minimiser of
  `coeff_pre * xh + coeff_post * x` over the relaxed set (the Lagrangian-decomposition oracle);
- `constraints(lower, upper)`: the relaxed set as explicit linear inequalities (the LP).
This package imports nothing of ours, so `bounds` can build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class LinearBounds:
    """Elementwise lines: `lower_slope * xh + lower_intercept <= x <= upper_slope * xh + upper_intercept`."""

    lower_slope: Tensor
    lower_intercept: Tensor
    upper_slope: Tensor
    upper_intercept: Tensor


@dataclass(frozen=True)
class LinearConstraints:
    """The relaxed set as inequalities, each over `(xh, x)` elementwise:

    `x >= slope_k * xh + intercept_k` for each k in `lower_*` (stacked on dim 0), and
    `x <= upper_slope * xh + upper_intercept`. Together with `lower <= xh <= upper`.
    """

    lower_slopes: Tensor
    lower_intercepts: Tensor
    upper_slope: Tensor
    upper_intercept: Tensor


class Relaxation(Protocol):
    """Convex relaxation of an elementwise function (see module docstring)."""

    name: str
    convex: bool
    monotone: bool

    def forward(self, xh: Tensor) -> Tensor: ...

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]: ...

    def default_alpha(self, lower: Tensor, upper: Tensor) -> Tensor: ...

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, alpha: Tensor | None = None
    ) -> LinearBounds: ...

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]: ...

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints: ...


_REGISTRY: dict[str, Relaxation] = {}


def register(name: str):
    """Class decorator: instantiate and register a relaxation under `name`."""

    def wrap(cls):
        _REGISTRY[name] = cls()
        return cls

    return wrap


def get_relaxation(name: str) -> Relaxation:
    """The registered relaxation called `name` (KeyError with the known names otherwise)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no relaxation {name!r}; known: {sorted(_REGISTRY)}") from None


def as_tensor_like(value: float, like: Tensor) -> Tensor:
    return torch.full_like(like, value)
