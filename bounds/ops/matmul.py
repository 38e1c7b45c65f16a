"""Products with a constant matrix on either side of the per-sample tensor (ONNX MatMul and
Gemm on inputs of rank > 2, torch matmul / nn.Linear on such inputs, separable linear Resize):
`y = x @ W + b` (`right`) or `y = W @ x + b` (left), batched over the leading axes."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


class MatMulOp(UnaryAffineOp):
    """`right`: `x [N, ..., k]`, `weight [k, m]`, `y [N, ..., m]`. Left: `x [N, ..., k, n]`
    (per-sample rank >= 2), `weight [m, k]`, `y [N, ..., m, n]`. `bias` broadcasts to
    `out_shape` (or is None)."""

    def __init__(
        self,
        weight: Tensor,
        in_shape: tuple[int, ...],
        right: bool = True,
        bias: Tensor | None = None,
    ) -> None:
        if weight.dim() != 2:
            raise ValueError(f"the weight must be a matrix, got shape {tuple(weight.shape)}")
        in_shape = tuple(in_shape)
        axis = -1 if right else -2
        if len(in_shape) < (1 if right else 2):
            raise ValueError(
                f"input of shape {in_shape} for a {'right' if right else 'left'} product"
            )
        inner = weight.shape[0] if right else weight.shape[1]
        if in_shape[axis] != inner:
            raise ValueError(f"input {in_shape} does not fit the weight {tuple(weight.shape)}")
        out = list(in_shape)
        out[axis] = weight.shape[1] if right else weight.shape[0]
        self.weight, self.bias, self.right = weight, bias, right
        self.in_shape, self.out_shape = in_shape, tuple(out)

    def _apply(self, x: Tensor, weight: Tensor) -> Tensor:
        return x @ weight if self.right else weight @ x

    def linear(self, x: Tensor) -> Tensor:
        return self._apply(x, self.weight)

    def abs_linear(self, x: Tensor) -> Tensor:
        return self._apply(x, self.weight_parts[0])

    def bias_vector(self) -> Tensor | None:
        return self.bias

    def fan_in(self) -> int:
        return int(self.weight.shape[0] if self.right else self.weight.shape[1])

    def fan_out(self) -> int:
        return int(self.weight.shape[1] if self.right else self.weight.shape[0])

    def sign_split(self, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
        _, pos, neg = self.weight_parts
        lo = self._apply(low, pos) + self._apply(high, neg)
        return lo, self._apply(high, pos) + self._apply(low, neg)

    def adjoint(self, A: Tensor) -> Tensor:
        return A @ self.weight.T if self.right else self.weight.T @ A

    def constants(self) -> tuple[Tensor, ...]:
        return (self.weight,) if self.bias is None else (self.weight, self.bias)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> MatMulOp:
        bias = None if self.bias is None else self.bias.to(device, dtype)
        return MatMulOp(self.weight.to(device, dtype), self.in_shape, self.right, bias)
