"""Reshapes (Flatten, Reshape, View) of the non-batch dimensions."""

from __future__ import annotations

from torch import Tensor

from bounds.ops.base import UnaryAffineOp


class ReshapeOp(UnaryAffineOp):
    """`y = x.reshape(N, *out_shape)`, same number of elements."""

    nonnegative = True
    exact = True  # data movement: no rounding

    def fan_out(self) -> int:
        return 1

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)

    def linear(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], *self.out_shape)

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return None

    def adjoint(self, A: Tensor) -> Tensor:
        return A.reshape(A.shape[0], *self.in_shape)
