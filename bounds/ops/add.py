"""Sums of two activations (residual connections): `y = c_1 x_1 + c_2 x_2`, `c_i` in {+1, -1}."""

from __future__ import annotations

from torch import Tensor

from bounds.ops.base import BoundOp
from bounds.rounding import error_bound, magnitude, widen
from bounds.types import Interval


class SumOp(BoundOp):
    """`y = sum_i sign_i x_i` over inputs of one shape (residual Add, Sub of two activations)."""

    n_inputs = 2

    def __init__(self, shape: tuple[int, ...], signs: tuple[float, float] = (1.0, 1.0)) -> None:
        self.in_shape = self.out_shape = tuple(shape)
        self.signs = signs

    def forward(self, *inputs: Tensor) -> Tensor:
        return sum(s * x for s, x in zip(self.signs, inputs))

    def interval(self, *inputs: Interval) -> Interval:
        """From the endpoints, widened by the rounding of the `k - 1` additions
        (`bounds.rounding`)."""
        lower = sum(x.lower if s > 0 else -x.upper for s, x in zip(self.signs, inputs))
        upper = sum(x.upper if s > 0 else -x.lower for s, x in zip(self.signs, inputs))
        size = sum(magnitude(x) for x in inputs)
        return widen(Interval(lower, upper), error_bound(size, len(inputs), len(inputs)))

    def backward_error(self, A: Tensor, sizes: list[Tensor]) -> Tensor:
        """Negations and copies: exact."""
        return A.new_zeros(A.shape[:2])

    def vjp(self, A: Tensor) -> tuple[Tensor, ...]:
        return tuple(A if s > 0 else -A for s in self.signs)

    def bias_term(self, A: Tensor) -> Tensor:
        return A.new_zeros(A.shape[:2])
