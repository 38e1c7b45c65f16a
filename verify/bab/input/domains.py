"""The domains of input splitting: boxes (`Domains`) and their candidate counterexamples
(`box_points`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from verify.bab.common import DomainBatch


@dataclass
class Domains(DomainBatch):
    """Open boxes, flattened: `lower`, `upper` `[N, n_in]`; `rows [N, m]` lower bounds of
    `C y - b`; `margin [N]`; `depth [N]` (number of splits from the region's box)."""

    lower: Tensor
    upper: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor


def box_points(domains: Domains, corner_domains: int) -> Tensor:
    """Candidate counterexamples of open boxes `[M, n_in]`: the centres, and the corners of the
    `corner_domains` worst boxes when the input has at most 6 dimensions."""
    points = [(domains.lower + domains.upper) / 2]
    n_in = domains.lower.shape[1]
    if n_in <= 6 and len(domains):
        worst = domains.pop(corner_domains)[0]
        bits = torch.arange(2**n_in, device=worst.lower.device)[:, None] >> torch.arange(
            n_in, device=worst.lower.device
        )
        mask = (bits & 1).bool()  # [2^n, n_in]
        points.append(torch.where(mask, worst.upper[:, None], worst.lower[:, None]).flatten(0, 1))
    return torch.cat(points)
