"""Concatenation along a per-sample axis (ONNX Concat, torch.cat), of activations and constant
blocks (e.g. a class token). A multi-input affine op: the functional on the output splits into
one block per input, and the constant blocks give the bias term."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.ops.base import BoundOp
from bounds.rounding import error_bound
from bounds.types import Interval

Part = int | Tensor  # the index of an activation input, or a constant block (per-sample shape)


class ConcatOp(BoundOp):
    """`y = cat(parts, axis + 1)` on `[N, *shape]` blocks: `parts[j]` is either an `int` (the
    index of one of the op's `n_inputs` activation inputs, in order) or a constant tensor of
    per-sample shape. `in_shapes[i]` is the shape of activation input `i`."""

    def __init__(self, in_shapes: list[tuple[int, ...]], axis: int, parts: list[Part]) -> None:
        self.in_shapes = [tuple(s) for s in in_shapes]
        self.axis, self.parts = axis, list(parts)
        self.n_inputs = len(self.in_shapes)
        shapes = [self.in_shapes[p] if isinstance(p, int) else tuple(p.shape) for p in self.parts]
        ranks = {len(s) for s in shapes}
        if len(ranks) != 1 or not 0 <= axis < len(shapes[0]):
            raise ValueError(f"cannot concatenate shapes {shapes} on axis {axis}")
        rest = {s[:axis] + s[axis + 1 :] for s in shapes}
        if len(rest) != 1:
            raise ValueError(f"shapes {shapes} differ outside axis {axis}")
        if not self.n_inputs or sorted(p for p in self.parts if isinstance(p, int)) != list(
            range(self.n_inputs)
        ):
            raise ValueError("each activation input must appear exactly once among the parts")
        self.sizes = [s[axis] for s in shapes]
        out = list(shapes[0])
        out[axis] = sum(self.sizes)
        self.out_shape = tuple(out)

    def _cat(self, inputs: tuple[Tensor, ...]) -> Tensor:
        batch = inputs[0].shape[0]
        blocks = [
            inputs[p] if isinstance(p, int) else p.expand(batch, *p.shape) for p in self.parts
        ]
        return torch.cat(blocks, dim=self.axis + 1)

    def forward(self, *inputs: Tensor) -> Tensor:
        return self._cat(inputs)

    def interval(self, *inputs: Interval) -> Interval:
        lower = self._cat(tuple(iv.lower for iv in inputs))
        upper = self._cat(tuple(iv.upper for iv in inputs))
        return Interval(lower, upper)

    def _blocks(self, A: Tensor) -> tuple[Tensor, ...]:
        return torch.split(A, self.sizes, dim=self.axis + 2)

    def vjp(self, A: Tensor) -> tuple[Tensor, ...]:
        by_input = {p: b for p, b in zip(self.parts, self._blocks(A)) if isinstance(p, int)}
        return tuple(by_input[i] for i in range(self.n_inputs))

    def bias_term(self, A: Tensor) -> Tensor:
        total = A.new_zeros(A.shape[:2])
        for p, block in zip(self.parts, self._blocks(A)):
            if not isinstance(p, int):
                total = total + (block * p).flatten(2).sum(-1)
        return total

    def backward_error(self, A: Tensor, sizes: list[Tensor]) -> Tensor:
        """The split is exact; `bias_term` sums the constant blocks' products."""
        if all(isinstance(p, int) for p in self.parts):
            return A.new_zeros(A.shape[:2])
        mag = A.new_zeros(A.shape[:2])
        for p, block in zip(self.parts, self._blocks(A.abs())):
            if not isinstance(p, int):
                mag = mag + (block * p.abs()).flatten(2).sum(-1)
        n = int(A[0, 0].numel())
        return error_bound(mag, n + 2, n)

    def constants(self) -> tuple[Tensor, ...]:
        return tuple(p for p in self.parts if not isinstance(p, int))

    def to(self, dtype: torch.dtype, device: torch.device | str) -> ConcatOp:
        parts = [p if isinstance(p, int) else p.to(device, dtype) for p in self.parts]
        return ConcatOp(self.in_shapes, self.axis, parts)
