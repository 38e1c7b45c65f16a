"""Transposed 2-D convolutions (ONNX ConvTranspose, nn.ConvTranspose2d). The adjoint is the
convolution with the same kernel (never a dense matrix)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bounds.ops.conv import ChannelBiasConv

Pair = tuple[int, int]


def conv_transpose_output_size(
    size: int, kernel: int, stride: int, padding: int, output_padding: int, dilation: int
) -> int:
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


class ConvTransposeOp(ChannelBiasConv):
    """`y = conv_transpose2d(x, weight, bias)` on `[N, C_in, H, W]`; `weight [C_in,
    C_out / groups, kh, kw]`."""

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        in_shape: tuple[int, int, int],
        stride: Pair = (1, 1),
        padding: Pair = (0, 0),
        output_padding: Pair = (0, 0),
        dilation: Pair = (1, 1),
        groups: int = 1,
    ) -> None:
        fits = len(in_shape) == 3 and weight.dim() == 4 and in_shape[0] == weight.shape[0]
        if not fits or groups < 1 or weight.shape[0] % groups:
            raise ValueError(
                f"input {tuple(in_shape)} does not fit the kernel {tuple(weight.shape)}"
            )
        self.weight, self.bias = weight, bias
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)
        self.output_padding, self.groups = tuple(output_padding), groups
        self.in_shape = tuple(in_shape)
        sizes = [
            conv_transpose_output_size(in_shape[1 + i], weight.shape[2 + i], self.stride[i],
                                       self.padding[i], self.output_padding[i], self.dilation[i])
            for i in range(2)
        ]  # fmt: skip
        if min(sizes) <= 0:
            raise ValueError(f"the padding {padding} leaves an empty output")
        self.out_shape = (weight.shape[1] * groups, *sizes)

    def fan_in(self) -> int:  # weight [C_in, C_out / groups, kh, kw]
        kh, kw = self.weight.shape[2:]
        return int(self.weight.shape[0] // self.groups * kh * kw)

    def fan_out(self) -> int:
        return int(self.weight[0].numel())

    def _apply(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.conv_transpose2d(x, weight, None, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)  # fmt: skip

    def adjoint(self, A: Tensor) -> Tensor:
        out = F.conv2d(A, self.weight, None, self.stride, self.padding, self.dilation, self.groups)
        # An output padding >= the stride adds outputs that no input row reaches back to.
        return out[..., : self.in_shape[1], : self.in_shape[2]]

    def to(self, dtype: torch.dtype, device: torch.device | str) -> ConvTransposeOp:
        bias = None if self.bias is None else self.bias.to(device, dtype)
        return ConvTransposeOp(self.weight.to(device, dtype), bias, self.in_shape, self.stride,
                               self.padding, self.output_padding, self.dilation, self.groups)  # fmt: skip
