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
    `C y - b`; `margin [N]`; `depth [N]` (number of splits from the region's box); `coeff`
    `[N, n_in]`: the input functional of the critical row's linear lower bound (the best row of
    the polytope least excluded) when the bound method gives one and the branching uses it
    (`smart` branching), else None."""

    lower: Tensor
    upper: Tensor
    rows: Tensor
    margin: Tensor
    depth: Tensor
    coeff: Tensor | None = None


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


def critical_rows(rows: Tensor, owner: Tensor, n_polytopes: int) -> Tensor:
    """`[N]` per domain the index of its critical row: the best row (largest lower bound of
    `C y - b`) of the polytope least excluded. `rows [N, m]`, `owner [m]` each row's polytope."""
    init = rows.new_full((rows.shape[0], n_polytopes), -torch.inf)
    index = owner.unsqueeze(0).expand_as(rows)
    per_poly = init.scatter_reduce(1, index, rows, reduce="amax", include_self=True)
    worst = per_poly.argmin(dim=1)
    mine = owner.unsqueeze(0) == worst.unsqueeze(1)
    return rows.masked_fill(~mine, -torch.inf).argmax(dim=1)
