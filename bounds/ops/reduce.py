"""Broadcasts and reductions, adjoint to each other: `ExpandOp` (ONNX Expand, torch expand and
the implicit broadcast of Add/Sub/Where operands) and `ReduceOp` (ReduceSum, ReduceMean)."""

from __future__ import annotations

import math

from torch import Tensor

from bounds.ops.base import UnaryAffineOp


def _padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


class ExpandOp(UnaryAffineOp):
    """`y = broadcast_to(x, out_shape)` (numpy rules on the per-sample shapes: `in_shape` is
    padded with leading 1s, then each size-1 axis is repeated)."""

    nonnegative = True
    exact = True  # a broadcast copies (its adjoint sums: `fan_out`)

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        if len(in_shape) > len(out_shape):
            raise ValueError(f"cannot broadcast {tuple(in_shape)} to {tuple(out_shape)}")
        padded = _padded(in_shape, len(out_shape))
        if any(i not in (1, o) for i, o in zip(padded, out_shape)):
            raise ValueError(f"cannot broadcast {tuple(in_shape)} to {tuple(out_shape)}")
        self.in_shape, self.out_shape, self._padded = tuple(in_shape), tuple(out_shape), padded
        self._repeated = tuple(k + 1 for k, (i, o) in enumerate(zip(padded, out_shape)) if i != o)

    def linear(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], *self._padded).expand(x.shape[0], *self.out_shape)

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return None

    def fan_in(self) -> int:
        return 1

    def fan_out(self) -> int:
        return max(1, math.prod(self.out_shape) // max(1, math.prod(self.in_shape)))

    def adjoint(self, A: Tensor) -> Tensor:
        summed = A.sum(dim=self._repeated, keepdim=True) if self._repeated else A
        return summed.reshape(A.shape[0], *self.in_shape)


class ReduceOp(UnaryAffineOp):
    """`y = x.sum(axes)` (times `1 / count` when `mean`) over the per-sample `axes`, kept as
    size-1 dimensions when `keepdim`."""

    nonnegative = True

    def __init__(
        self, in_shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool, mean: bool = False
    ) -> None:
        axes = tuple(sorted({int(a) for a in axes}))
        if not axes or axes[0] < 0 or axes[-1] >= len(in_shape):
            raise ValueError(f"axes {axes} out of range for shape {tuple(in_shape)}")
        self.in_shape, self.axes, self.keepdim, self.mean = tuple(in_shape), axes, keepdim, mean
        kept = tuple(1 if k in axes else d for k, d in enumerate(in_shape))
        self._kept = kept
        self.out_shape = (
            kept if keepdim else tuple(d for k, d in enumerate(in_shape) if k not in axes)
        )
        self.scale = 1.0 / math.prod(in_shape[a] for a in axes) if mean else 1.0

    def linear(self, x: Tensor) -> Tensor:
        y = x.sum(dim=tuple(a + 1 for a in self.axes), keepdim=self.keepdim)
        return y * self.scale if self.mean else y

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return None

    def fan_in(self) -> int:
        return math.prod(self.in_shape[a] for a in self.axes) + 1  # the sum, then the mean's scale

    def fan_out(self) -> int:
        return 2  # a copy, times the mean's scale

    def adjoint(self, A: Tensor) -> Tensor:
        spread = A.reshape(A.shape[0], *self._kept).expand(A.shape[0], *self.in_shape)
        return spread * self.scale if self.mean else spread
