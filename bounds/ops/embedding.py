"""Embedding lookups: `y[..., :] = table[trunc(x[...]), :]` for a constant table `[rows, dim]`
and a variable index `x` (torch `F.embedding` / `nn.Embedding` of `x.long()`; ONNX `Gather`
on axis 0 of a constant table with a variable index, after a `Cast` to an integer type).

The index is held as a float activation (the graph has one float input: a recommendation
model's sparse ids are columns of it, integers stored exactly in float up to 2^24 in float32)
and truncated towards zero, as `Tensor.long()` and ONNX `Cast` do. An index interval
`[lo, hi]` reaches the rows `floor(max(lo, 0)) .. floor(max(hi, 0))`; it must lie in the
table (`lo > -1`, `hi < rows`): an index that can leave the table is `IndexOutOfTableError` naming
the node, raised by `interval` (every method computes it first: before any other work on the
node); torch raises on such an index, and ONNX gives negative indices another meaning.

Bounds (the lookup is data movement: exact in floating point).
- Interval: per index position, the per-dimension minimum and maximum over the reachable rows
  (a sound box, exact: the stored values themselves).
- Backward (CROWN): the lookup is not affine in the index; its value lies in the finite set of
  the table's rows, independent of the rest of the network's input, so a functional `A` on it
  is bounded below by `sum_p min_r A_p . table[r]` (exact over the set, tighter than the box
  `A+ . lo + A- . hi`) and nothing is passed on to the index (`vjp` is zero). Over all rows
  (an op holds constants only, not the index's interval): valid since every index lies in the
  table. Tables of more than `FINITE_ROWS` rows use the box (a `[specs, rows]` product per
  position would not pay). The float64 rounding of the pairing is `backward_error`.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

from bounds.errors import IndexOutOfTableError
from bounds.ops.base import BoundOp, numel
from bounds.rounding import error_bound
from bounds.types import Interval

FINITE_ROWS = 1 << 16  # tables up to this many rows are bounded by their finite set of rows

__all__ = ["FINITE_ROWS", "EmbeddingOp", "IndexOutOfTableError", "index_rows"]


def index_rows(lower: Tensor, upper: Tensor, rows: int, node: str) -> tuple[Tensor, Tensor]:
    """`(first, last)` rows reached by truncated indices in `[lower, upper]`;
    `IndexOutOfTableError` naming `node` when an index can leave the table."""
    bad = ~((lower > -1) & (upper < rows))  # NaN is bad too
    if bool(bad.any()):
        at = tuple(bad.nonzero()[0].tolist())
        raise IndexOutOfTableError(
            f"embedding lookup at node {node!r}: the index interval [{float(lower[at])}, "
            f"{float(upper[at])}] (batch element and position {at}) can leave the table of "
            f"{rows} rows: truncated indices must lie in [0, {rows - 1}] (restrict the domain "
            "of the index input to the table's rows)"
        )
    first = lower.clamp(min=0).floor().long()
    last = upper.clamp(min=0).floor().long()
    return first, last


class EmbeddingOp(BoundOp):
    """`y = table[trunc(x)]` on `x [N, *index_shape]`, `y [N, *index_shape, dim]`; see the
    module docstring."""

    is_affine = False
    exact = True  # data movement

    def __init__(self, table: Tensor, index_shape: tuple[int, ...], node: str = "") -> None:
        if table.dim() != 2 or table.shape[0] == 0:
            raise ValueError(f"an embedding table must be [rows, dim], got {tuple(table.shape)}")
        self.table = table
        self.rows, self.dim = int(table.shape[0]), int(table.shape[1])
        self.in_shape = tuple(index_shape)
        self.node = node  # the graph node's name, for error messages
        self.out_shape = (*self.in_shape, self.dim)

    @cached_property
    def _columns(self) -> tuple[Tensor, Tensor, Tensor]:
        """Per dimension over all rows: minimum, maximum, largest magnitude."""
        low, high = self.table.amin(0), self.table.amax(0)
        return low, high, torch.maximum(low.abs(), high.abs())

    def forward(self, x: Tensor) -> Tensor:
        """The rows (a negative index counts from the end, as `table[i]` and ONNX `Gather`
        do; the bounds refuse such indices)."""
        return self.table[x.detach().trunc().long()]

    def interval(self, x: Interval) -> Interval:
        """Per position, the extremes of the reachable rows (exact); `IndexOutOfTableError`
        when an index can leave the table (`index_rows`)."""
        first, last = index_rows(x.lower, x.upper, self.rows, self.node)
        low, high = self._columns[:2]
        full = (first == 0) & (last == self.rows - 1)
        shape = (*first.shape, self.dim)
        lower = low.expand(shape).clone()
        upper = high.expand(shape).clone()
        if not bool(full.all()):
            pairs = torch.stack([first[~full], last[~full]], 1)
            unique, inverse = pairs.unique(dim=0, return_inverse=True)
            spans = [self.table[a : b + 1] for a, b in unique.tolist()]
            mins = torch.stack([s.amin(0) for s in spans])[inverse]
            maxs = torch.stack([s.amax(0) for s in spans])[inverse]
            lower[~full], upper[~full] = mins, maxs
        return Interval(lower, upper)

    def vjp(self, A: Tensor) -> tuple[Tensor]:
        """No functional reaches the index (see the module docstring)."""
        return (A.new_zeros(*A.shape[:2], *self.in_shape),)

    def bias_term(self, A: Tensor) -> Tensor:
        """A lower bound `[batch, specs]` of `A . y` over every lookup: `sum_p min_r A_p .
        table[r]` (the box's `A+ . lo + A- . hi` for tables over `FINITE_ROWS` rows)."""
        batch, specs = A.shape[:2]
        rows = A.reshape(batch, specs, -1, self.dim)
        table = self.table.to(A)
        if self.rows > FINITE_ROWS:
            low, high = (t.to(A) for t in self._columns[:2])
            value = rows.clamp(min=0) @ low + rows.clamp(max=0) @ high
            return value.sum(-1)
        return (rows @ table.T).amin(-1).sum(-1)

    def backward_error(self, A: Tensor, sizes: list[Tensor]) -> Tensor:
        """The rounding of `bias_term`: each pairing is a sum of `dim` products, the positions'
        minima a sum of `P` more terms, each at most `|A_p| . max_r |table[r]|`:
        `error_bound(|A| . m, dim + P + 1, dim P)`."""
        mags = self._columns[2].to(A)
        batch, specs = A.shape[:2]
        total = (A.abs().reshape(batch, specs, -1, self.dim) @ mags).sum(-1)
        positions = numel(self.in_shape)
        return error_bound(total, self.dim + positions + 1, self.dim * positions)

    def constants(self) -> tuple[Tensor, ...]:
        return (self.table,)

    def to(self, dtype: torch.dtype, device: torch.device | str) -> EmbeddingOp:
        return EmbeddingOp(self.table.to(dtype=dtype, device=device), self.in_shape, self.node)
