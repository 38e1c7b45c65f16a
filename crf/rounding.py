"""Rounding of relaxed labellings: argmax per pixel, keeping the best labelling seen.

All bookkeeping stays on tensors (``torch.where`` instead of Python branches), so tracking
costs one filtering per update and no host synchronisation.
"""

from __future__ import annotations

import numpy as np
import torch

from crf.energy import labelling_energy
from crf.model import CRFModel

__all__ = ["BestLabelling", "argmax_labels"]


def argmax_labels(y: torch.Tensor) -> torch.Tensor:
    """(..., M) -> (...) int64 index of the largest label (the first on ties). Eager on CPU by
    numpy, twice as fast as ``torch.argmax`` over a short last dimension."""
    if y.device.type == "cpu" and not torch.compiler.is_compiling() and not y.requires_grad:
        return torch.from_numpy(y.contiguous().numpy().argmax(-1).astype(np.int64, copy=False))
    return y.argmax(-1)


class BestLabelling:
    """Best integer labelling (B, N) seen so far and its model energy (B,) float64."""

    def __init__(self, model: CRFModel) -> None:
        b, n, _ = model.unary.shape
        self.model = model
        dev = model.unary.device
        self.labels = torch.zeros(b, n, dtype=torch.long, device=dev)
        self.energy = torch.full((b,), float("inf"), dtype=torch.float64, device=dev)
        self.updates = 0

    def update(self, y: torch.Tensor) -> torch.Tensor:
        """Round (B, N, M) ``y`` by argmax, keep it where its energy is lower; return energies."""
        return self.update_labels(argmax_labels(y))

    def update_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Offer an integer labelling (B, N); keep it per image where it lowers the energy."""
        energy = labelling_energy(self.model, labels, raw=False)
        better = energy < self.energy
        self.labels = torch.where(better[:, None], labels, self.labels)
        self.energy = torch.where(better, energy, self.energy)
        self.updates += 1
        return energy
