"""Adaptive average pooling of any output size (`nn.AdaptiveAvgPool2d`, `F.adaptive_avg_pool2d`).

Along an axis of `n` inputs pooled to `m` outputs, output `i` averages the inputs
`[floor(i n / m), ceil((i + 1) n / m))` (torch's `start_index` / `end_index` in
`aten/src/ATen/native/AdaptivePooling.h`); the windows of neighbouring outputs overlap when
`m` does not divide `n`, and repeat one input when `m > n`. The 2-D pooling is separable:
`y[c, i, j] = (R x[c] C^T)[i, j] / (|w_i| |w_j|)` with `R [oh, H]`, `C [ow, W]` the 0/1 window
indicators and `|w|` the window lengths. A single linear op (not two products along the axes)
so that each output's rounding is that of one sum of `|w_i| |w_j|` terms, as torch computes it
(`fan_in`). Where `m` divides `n` along both axes the graph builder uses the equivalent strided
average pooling (`avg_pool_as_conv`) instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


def adaptive_windows(n: int, m: int) -> list[tuple[int, int]]:
    """`[(start, end)]` of the `m` windows of adaptive pooling over `n` inputs."""
    return [((i * n) // m, -((-(i + 1) * n) // m)) for i in range(m)]


def window_matrix(n: int, m: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """`[m, n]`: 1 where input `j` lies in output `i`'s window, else 0."""
    out = torch.zeros(m, n, dtype=dtype)
    for i, (start, end) in enumerate(adaptive_windows(n, m)):
        out[i, start:end] = 1
    return out


class AdaptiveAvgPoolOp(UnaryAffineOp):
    """`y = adaptive_avg_pool2d(x, (oh, ow))` on `[N, C, H, W]` inputs (module docstring)."""

    nonnegative = True

    def __init__(self, in_shape: tuple[int, int, int], out_size: tuple[int, int],
                 dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        channels, height, width = (int(d) for d in in_shape)
        oh, ow = (int(d) for d in out_size)
        if min(height, width, oh, ow) < 1:
            raise ValueError(f"adaptive pooling of {tuple(in_shape)} to {(oh, ow)}")
        self.in_shape, self.out_size = (channels, height, width), (oh, ow)
        self.out_shape = (channels, oh, ow)
        self.rows = window_matrix(height, oh, dtype)
        self.cols = window_matrix(width, ow, dtype)
        area = self.rows.sum(1)[:, None] * self.cols.sum(1)[None, :]  # exact small integers
        self.scale = 1.0 / area  # [oh, ow]

    def linear(self, x: Tensor) -> Tensor:
        return torch.einsum("ih,nchw,jw->ncij", self.rows, x, self.cols) * self.scale

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return None

    def adjoint(self, A: Tensor) -> Tensor:
        return torch.einsum("ih,ncij,jw->nchw", self.rows, A * self.scale, self.cols)

    def fan_in(self) -> int:
        return int(self.rows.sum(1).max() * self.cols.sum(1).max())

    def fan_out(self) -> int:
        return int(self.rows.sum(0).max() * self.cols.sum(0).max())

    def constants(self) -> tuple[Tensor, ...]:
        return (self.rows, self.cols, self.scale)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> AdaptiveAvgPoolOp:
        op = AdaptiveAvgPoolOp(self.in_shape, self.out_size, dtype)
        op.rows, op.cols, op.scale = (t.to(device) for t in (op.rows, op.cols, op.scale))
        return op
