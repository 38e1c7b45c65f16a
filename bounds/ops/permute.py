"""Permutations of the per-sample axes (ONNX Transpose, torch permute/transpose)."""

from __future__ import annotations

from torch import Tensor

from bounds.ops.base import UnaryAffineOp


class PermuteOp(UnaryAffineOp):
    """`y = x.permute(0, *(p + 1 for p in perm))`: output axis `i` is input axis `perm[i]`
    (axes count the per-sample dimensions; the batch stays first)."""

    nonnegative = True
    exact = True  # data movement: no rounding

    def fan_out(self) -> int:
        return 1

    def __init__(self, in_shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(len(in_shape))):
            raise ValueError(f"{perm} is not a permutation of the axes of {tuple(in_shape)}")
        self.in_shape, self.perm = tuple(in_shape), perm
        self.out_shape = tuple(in_shape[p] for p in perm)
        self.inverse = tuple(perm.index(i) for i in range(len(perm)))

    def linear(self, x: Tensor) -> Tensor:
        return x.permute(0, *(p + 1 for p in self.perm))

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return None

    def adjoint(self, A: Tensor) -> Tensor:
        return A.permute(0, *(p + 1 for p in self.inverse))
