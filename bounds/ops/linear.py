"""Fully connected layers: `y = W x + b` on feature vectors (nn.Linear, Gemm, MatMul by a constant)."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


class LinearOp(UnaryAffineOp):
    """`y = W x + b`, `W` of shape `[out, in]`, inputs `[N, in]`."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight = weight
        self.bias = bias
        self.in_shape = (weight.shape[1],)
        self.out_shape = (weight.shape[0],)

    def linear(self, x: Tensor) -> Tensor:
        return x @ self.weight.T

    def abs_linear(self, x: Tensor) -> Tensor:
        return x @ self.weight_parts[0].T

    def bias_vector(self) -> Tensor | None:
        return self.bias

    def adjoint(self, A: Tensor) -> Tensor:
        return A @ self.weight

    def fan_in(self) -> int:
        return int(self.weight.shape[1])

    def fan_out(self) -> int:
        return int(self.weight.shape[0])

    def sign_split(self, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
        _, pos, neg = self.weight_parts
        pos, neg = pos.T, neg.T
        return low @ pos + high @ neg, high @ pos + low @ neg

    def bias_term(self, A: Tensor) -> Tensor:
        if self.bias is None:
            return A.new_zeros(A.shape[:2])
        return A @ self.bias

    def as_matrix(self) -> tuple[Tensor, Tensor]:
        bias = self.bias if self.bias is not None else self.weight.new_zeros(self.out_shape)
        return self.weight, bias

    def constants(self) -> tuple[Tensor, ...]:
        return (self.weight,) if self.bias is None else (self.weight, self.bias)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> LinearOp:
        bias = None if self.bias is None else self.bias.to(device, dtype)
        return LinearOp(self.weight.to(device, dtype), bias)
