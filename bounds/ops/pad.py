"""Constant padding (ONNX Pad in constant mode, torch F.pad); negative widths crop."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


def _torch_pads(widths: tuple[tuple[int, int], ...]) -> list[int]:
    """F.pad's order: last axis first, (before, after) per axis."""
    return [w for before_after in reversed(widths) for w in before_after]


class PadOp(UnaryAffineOp):
    """`y = pad(x)`: `widths[k] = (before, after)` elements added on per-sample axis `k` (a
    negative width removes elements), new entries equal to `value`."""

    nonnegative = True
    exact = True  # data movement: no rounding

    def fan_out(self) -> int:
        return 1

    def __init__(
        self,
        in_shape: tuple[int, ...],
        widths: tuple[tuple[int, int], ...],
        value: float = 0.0,
        dtype: torch.dtype = torch.float32,
        bias: Tensor | None = None,
    ) -> None:
        widths = tuple((int(b), int(a)) for b, a in widths)
        if len(widths) != len(in_shape):
            raise ValueError(f"{len(widths)} pad widths for the {len(in_shape)} axes")
        out = tuple(d + b + a for d, (b, a) in zip(in_shape, widths))
        if min(out, default=1) <= 0:
            raise ValueError(f"padding {widths} leaves no element of {tuple(in_shape)}")
        self.in_shape, self.out_shape, self.widths = tuple(in_shape), out, widths
        self.value = float(value)
        self._pads, self._crop = _torch_pads(widths), [-w for w in _torch_pads(widths)]
        if bias is None and self.value != 0.0:
            zeros = torch.zeros(1, *in_shape, dtype=dtype)
            bias = F.pad(zeros, self._pads, value=self.value)[0]
        self.bias = bias

    def linear(self, x: Tensor) -> Tensor:
        return F.pad(x, self._pads)

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return self.bias

    def adjoint(self, A: Tensor) -> Tensor:
        return F.pad(A, self._crop)

    def constants(self) -> tuple[Tensor, ...]:
        return () if self.bias is None else (self.bias,)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> PadOp:
        bias = None if self.bias is None else self.bias.to(device, dtype)
        return PadOp(self.in_shape, self.widths, self.value, dtype, bias)
