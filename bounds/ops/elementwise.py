"""Elementwise affine maps `y = x * scale + shift` (folded BatchNorm, input normalisation,
constant add/sub/mul/div). `scale`/`shift` broadcast to the node's shape (no batch dimension)."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


class ElementwiseAffineOp(UnaryAffineOp):
    """`y = x * scale + shift`; either may be None (1 and 0)."""

    def __init__(self, shape: tuple[int, ...], scale: Tensor | None, shift: Tensor | None) -> None:
        self.in_shape = self.out_shape = tuple(shape)
        self.scale, self.shift = scale, shift

    def linear(self, x: Tensor) -> Tensor:
        return x if self.scale is None else x * self.scale

    def abs_linear(self, x: Tensor) -> Tensor:
        return x if self.scale is None else x * self.scale.abs()

    def bias_vector(self) -> Tensor | None:
        return self.shift

    def adjoint(self, A: Tensor) -> Tensor:
        return self.linear(A)

    cheap_split = True

    def fan_in(self) -> int:
        return 1

    def fan_out(self) -> int:
        return 1

    def sign_split(self, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
        if self.scale is None:
            return low, high
        pos = self.scale >= 0
        a, b = low * self.scale, high * self.scale
        return torch.where(pos, a, b), torch.where(pos, b, a)

    def constants(self) -> tuple[Tensor, ...]:
        return tuple(t for t in (self.scale, self.shift) if t is not None)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> ElementwiseAffineOp:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, dtype)

        return ElementwiseAffineOp(self.in_shape, move(self.scale), move(self.shift))

    def then(self, other: ElementwiseAffineOp) -> ElementwiseAffineOp:
        """The composition `other(self(x))`, as one op."""
        scale, shift = self.scale, self.shift
        if other.scale is not None:
            scale = other.scale if scale is None else scale * other.scale
            shift = None if shift is None else shift * other.scale
        if other.shift is not None:
            shift = other.shift if shift is None else shift + other.shift
        return ElementwiseAffineOp(self.in_shape, scale, shift)
