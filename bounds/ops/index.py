"""Selections along one axis: `y = x.index_select(axis, index)` with a constant integer index
(ONNX Slice, Split, Gather with constant indices, nearest-neighbour Resize; torch slicing and
indexing). The adjoint scatters the functional back (`index_add`: repeated indices add up)."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.ops.base import UnaryAffineOp


class IndexOp(UnaryAffineOp):
    """`y = x.index_select(axis + 1, index)` on `[N, *in_shape]`; `axis` counts the per-sample
    dimensions (0 is the first one after the batch), `index` is 1-D with entries in
    `[0, in_shape[axis])` (repeats allowed)."""

    nonnegative = True
    exact = True  # data movement: no rounding

    def fan_out(self) -> int:
        """The most times one input element is selected (the adjoint adds the copies)."""
        if self.index.numel() == 0:
            return 1
        return int(torch.bincount(self.index).max())

    def __init__(self, in_shape: tuple[int, ...], axis: int, index: Tensor | list[int]) -> None:
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if not 0 <= axis < len(in_shape):
            raise ValueError(f"axis {axis} is out of range for shape {tuple(in_shape)}")
        size = in_shape[axis]
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
            raise ValueError(f"indices outside [0, {size}) on axis {axis} of {tuple(in_shape)}")
        self.in_shape, self.axis, self.index = tuple(in_shape), axis, index
        out = list(in_shape)
        out[axis] = index.numel()
        self.out_shape = tuple(out)
        first = int(index[0]) if index.numel() else 0
        contiguous = torch.equal(index, torch.arange(first, first + index.numel()))
        self._span = (first, index.numel()) if contiguous else None

    def _index(self, like: Tensor) -> Tensor:
        return self.index if self.index.device == like.device else self.index.to(like.device)

    def linear(self, x: Tensor) -> Tensor:
        if self._span is not None:
            return x.narrow(self.axis + 1, *self._span)
        return x.index_select(self.axis + 1, self._index(x))

    def abs_linear(self, x: Tensor) -> Tensor:
        return self.linear(x)

    def bias_vector(self) -> Tensor | None:
        return None

    def adjoint(self, A: Tensor) -> Tensor:
        out = A.new_zeros(A.shape[0], *self.in_shape)
        if self._span is not None:
            out.narrow(self.axis + 1, *self._span).copy_(A)
            return out
        return out.index_add(self.axis + 1, self._index(A), A)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> IndexOp:
        return IndexOp(self.in_shape, self.axis, self.index.to(device))
