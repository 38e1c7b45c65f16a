"""Dual variables of the Lagrangian decomposition: one tensor `rho[i]` per hidden layer
(`[batch, specs, *shape_{i+1}]`), with vector-space operations and the batch surgery that
branch and bound needs to warm-start children from a parent (select / repeat)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Duals:
    """`rho[i]` multiplies the constraint `xhA_{i+1} = xhB_{i+1}` (Bunel et al., UAI 2020, Eq. 5)."""

    rho: tuple[Tensor, ...]

    def __add__(self, other: Duals) -> Duals:
        return Duals(tuple(a + b for a, b in zip(self.rho, other.rho)))

    def __sub__(self, other: Duals) -> Duals:
        return Duals(tuple(a - b for a, b in zip(self.rho, other.rho)))

    def scale(self, factor: float | Tensor) -> Duals:
        return Duals(tuple(factor * r for r in self.rho))

    def dot(self, other: Duals) -> Tensor:
        """Per-problem inner product `[batch, specs]`."""
        return sum((a * b).flatten(2).sum(-1) for a, b in zip(self.rho, other.rho))

    def norm(self) -> Tensor:
        return self.dot(self).sqrt()

    def select(self, index: Tensor) -> Duals:
        """The problems `index` of the batch dimension (e.g. the domains kept by BaB)."""
        return Duals(tuple(r.index_select(0, index) for r in self.rho))

    def repeat(self, k: int) -> Duals:
        """Each batch element repeated k times consecutively (children of a split)."""
        return Duals(tuple(r.repeat_interleave(k, dim=0) for r in self.rho))

    def where(self, mask: Tensor, other: Duals) -> Duals:
        """Per problem (`mask [batch, specs]`): self where True, other elsewhere."""

        def pick(a: Tensor, b: Tensor) -> Tensor:
            m = mask.reshape(*mask.shape, *([1] * (a.dim() - 2)))
            return torch.where(m, a, b)

        return Duals(tuple(pick(a, b) for a, b in zip(self.rho, other.rho)))

    def to(self, dtype: torch.dtype) -> Duals:
        return Duals(tuple(r.to(dtype) for r in self.rho))

    def clone(self) -> Duals:
        return Duals(tuple(r.clone() for r in self.rho))
