"""2-D convolutions (and average pooling, a depthwise convolution with constant weights).

The adjoint is a transposed convolution (never a dense matrix); `output_padding` restores the
input's exact spatial size when the stride does not divide it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class ChannelBiasConv(UnaryAffineOp):
    """What convolutions and transposed convolutions share: `y = K(x; weight) + bias[c]`, with
    `|L| x = K(x; |weight|)`. Subclasses give `_apply(x, weight)` and hold `weight`, `bias`."""

    weight: Tensor
    bias: Tensor | None

    def _apply(self, x: Tensor, weight: Tensor) -> Tensor:
        raise NotImplementedError

    def linear(self, x: Tensor) -> Tensor:
        return self._apply(x, self.weight)

    def abs_linear(self, x: Tensor) -> Tensor:
        return self._apply(x, self.weight_parts[0])

    def bias_vector(self) -> Tensor | None:
        return None if self.bias is None else self.bias.reshape(-1, 1, 1)

    def sign_split(self, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
        _, pos, neg = self.weight_parts
        lo = self._apply(low, pos) + self._apply(high, neg)
        return lo, self._apply(high, pos) + self._apply(low, neg)

    def bias_term(self, A: Tensor) -> Tensor:
        if self.bias is None:
            return A.new_zeros(A.shape[:2])
        return A.sum(dim=(-2, -1)) @ self.bias

    def constants(self) -> tuple[Tensor, ...]:
        return (self.weight,) if self.bias is None else (self.weight, self.bias)


class ConvOp(ChannelBiasConv):
    """`y = conv2d(x, weight, bias)` on `[N, C, H, W]` inputs."""

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        in_shape: tuple[int, int, int],
        stride: tuple[int, int] = (1, 1),
        padding: tuple[int, int] = (0, 0),
        dilation: tuple[int, int] = (1, 1),
        groups: int = 1,
    ) -> None:
        self.weight, self.bias = weight, bias
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.in_shape = tuple(in_shape)
        kh, kw = weight.shape[2:]
        out_h = conv_output_size(in_shape[1], kh, stride[0], padding[0], dilation[0])
        out_w = conv_output_size(in_shape[2], kw, stride[1], padding[1], dilation[1])
        self.out_shape = (weight.shape[0], out_h, out_w)
        # Rows/columns of the input that no output reads; conv_transpose must re-create them.
        self.output_padding = tuple(
            in_shape[1 + i]
            - ((self.out_shape[1 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + 1)
            for i, k in enumerate((kh, kw))
        )

    def fan_in(self) -> int:
        return int(self.weight[0].numel())  # C_in / groups x kh x kw

    def fan_out(self) -> int:
        kh, kw = self.weight.shape[2:]
        return int(self.weight.shape[0] // self.groups * kh * kw)

    def _apply(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.conv2d(x, weight, None, self.stride, self.padding, self.dilation, self.groups)

    def adjoint(self, A: Tensor) -> Tensor:
        return F.conv_transpose2d(
            A,
            self.weight,
            None,
            self.stride,
            self.padding,
            self.output_padding,
            self.groups,
            self.dilation,
        )

    def adjoint_window(self, A: Tensor) -> Tensor:
        """`L^T` on a functional `A [N, C_out, Mh, Mw]` on a window of the output, without
        cropping: the functional on the input window `window_below` gives; positions outside
        the input are kept (the caller masks them). `1 x 1` windows (a convolution's own
        neurons) take a combination of the kernels, a matrix product: the transposed convolution
        of the identity gives the kernels, far faster than one of a large batch of points."""

        def transposed(x: Tensor) -> Tensor:
            return F.conv_transpose2d(
                x, self.weight, None, self.stride, 0, 0, self.groups, self.dilation
            )

        if tuple(A.shape[-2:]) != (1, 1):
            return transposed(A)
        channels = self.weight.shape[0]
        eye = torch.eye(channels, dtype=A.dtype, device=A.device)
        kernels = transposed(eye.reshape(channels, channels, 1, 1))
        return (A.flatten(1) @ kernels.flatten(1)).reshape(A.shape[0], *kernels.shape[1:])

    def window_below(
        self, rows: Tensor, cols: Tensor, size: tuple[int, int]
    ) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """The input windows `(rows, cols, size)` that output windows of `size` at `rows`,
        `cols` read: origin `o s - p`, size `(M - 1) s + d (k - 1) + 1` per axis."""
        kernel = self.weight.shape[2:]
        grown = tuple(
            (m - 1) * s + d * (k - 1) + 1
            for m, s, d, k in zip(size, self.stride, self.dilation, kernel)
        )
        origin = (rows * self.stride[0] - self.padding[0], cols * self.stride[1] - self.padding[1])
        return *origin, grown

    def to(self, dtype: torch.dtype, device: torch.device | str) -> ConvOp:
        bias = None if self.bias is None else self.bias.to(device, dtype)
        return ConvOp(
            self.weight.to(device, dtype),
            bias,
            self.in_shape,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )


def avg_pool_as_conv(
    in_shape: tuple[int, int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dtype: torch.dtype = torch.float32,
) -> ConvOp:
    """AvgPool2d (count_include_pad=True, floor mode) as a depthwise convolution with 1/(kh kw)."""
    channels = in_shape[0]
    weight = torch.full((channels, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), dtype=dtype)
    return ConvOp(weight, None, in_shape, stride, padding, (1, 1), groups=channels)
