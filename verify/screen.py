"""Regions proven together before any is searched: one batched float64 CROWN call over the boxes
of many regions.

A VNN-LIB property may be a disjunction of hundreds or thousands of regions (VNN-COMP's nn4sys:
800 to 7,300 boxes, each with its own output rows). Attacking, then branching on, each region
in turn costs a fixed overhead per region (the attack's sampling, a search's set-up) that
dwarfs the bound itself, while most regions close at their root. `screen` bounds the regions'
boxes in chunks, each chunk one call of CROWN on the network in float64 with the rounding of
every step accounted for (`exact=True`, `bounds.rounding`), and returns the regions it could
not prove. A region is proven when every unsafe polytope has a row whose lower bound of
`C y - b` (C, b as in the VNN-LIB file, float64) is > 0 (`verify.specs.region_proven`, batched).

Deadline (`screen`): at most a share of the time left, chunks sized by the seconds per region
measured so far so that none is predicted to end past it; the regions not screened stay open.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from bounds.graph.graph import Graph
from bounds.types import Budget
from verify.api import bounds
from verify.property import Region

CHUNK = 256
"""Most regions bounded per call."""
FIRST_CHUNK = 4
"""Regions in the first call (its time predicts the next ones')."""


def _rows(regions: list[Region], n_out: int) -> tuple[Tensor, Tensor, Tensor]:
    """The regions' unsafe rows padded to the longest: `C [R, M, n_out]`, `b [R, M]` (float64)
    and `owner [R, M]` (each row's polytope, -1 for padding)."""
    width = max(sum(len(p.b) for p in r.unsafe) for r in regions)
    C = np.zeros((len(regions), width, n_out))
    b = np.zeros((len(regions), width))
    owner = np.full((len(regions), width), -1)
    for i, region in enumerate(regions):
        at = 0
        for k, poly in enumerate(region.unsafe):
            m = len(poly.b)
            C[i, at : at + m], b[i, at : at + m], owner[i, at : at + m] = poly.A, poly.b, k
            at += m
    return torch.from_numpy(C), torch.from_numpy(b), torch.from_numpy(owner)


def proven(lower: Tensor, b: Tensor, owner: Tensor, n_polytopes: Tensor) -> Tensor:
    """`[R]` bool: every polytope `k < n_polytopes[r]` of region `r` has a row with `lower -
    b > 0` (`lower`, `b`, `owner` `[R, M]`; padding rows have owner -1)."""
    above = (lower - b > 0) & (owner >= 0)
    width = max(int(n_polytopes.max()) if len(n_polytopes) else 0, int(owner.max()) + 1, 1)
    excluded = torch.zeros(len(lower), width, dtype=torch.bool)
    excluded.scatter_reduce_(1, owner.clamp(min=0), above, reduce="amax")
    wanted = torch.arange(width)[None] < n_polytopes[:, None]
    return ((excluded | ~wanted).all(1)) & (n_polytopes > 0)


def screen(
    graph: Graph, regions: list[Region], deadline: float, share: float = 0.5
) -> list[Region]:
    """The regions (in order) that one float64 CROWN bound of their box does not prove;
    regions with rows over the inputs (`A_x`) or no polytope are kept open unbounded.

    Paced: the screen takes at most `share` of the time left before `deadline` (the attack and
    the searches need the rest), unless it proves most of the regions it bounds (each would
    otherwise cost an attack and a search): then it may go on to the deadline. Chunks start
    at `FIRST_CHUNK` regions and grow fourfold up to `CHUNK`, each no larger than the seconds
    per region measured so far allow before the screen's end; the regions not reached are
    kept open."""
    like = next((t for n in graph.nodes[1:] for t in n.op.constants()), torch.zeros(()))
    graph64, device = graph.to(torch.float64, like.device), like.device
    shape = graph.input.shape
    todo = [r for r in regions if r.unsafe and all(p.A_x is None for p in r.unsafe)]
    if not todo:
        return list(regions)
    keep = {id(r) for r in regions} - {id(r) for r in todo}
    n_out = todo[0].unsafe[0].A.shape[1]
    now = time.monotonic()
    stop = now + share * max(0.0, deadline - now)
    size, per_region, start, closed = FIRST_CHUNK, 0.0, 0, 0
    while start < len(todo):
        limit = deadline if 2 * closed > start else stop  # proving most: worth the time
        if per_region > 0:
            size = min(size, int((limit - time.monotonic()) / per_region))
        if size < 1 or time.monotonic() >= limit:
            break
        tick = time.monotonic()
        part = todo[start : start + size]
        lower, upper = (torch.tensor(np.array([getattr(r, side) for r in part]),
                                     dtype=torch.float64, device=device).reshape(-1, *shape)
                        for side in ("lower", "upper"))  # fmt: skip
        C, b, owner = _rows(part, n_out)
        left = max(1e-3, deadline - time.monotonic())
        result = bounds(graph64, lower=lower, upper=upper, C=C.to(device), method="crown",
                        budget=Budget(seconds=left))  # fmt: skip
        n_poly = torch.tensor([len(r.unsafe) for r in part])
        done = proven(result.lower.cpu(), b, owner, n_poly)
        keep |= {id(r) for r, ok in zip(part, done.tolist()) if not ok}
        start, closed = start + len(part), closed + int(done.sum())
        per_region = max(per_region, (time.monotonic() - tick) / len(part))
        size = min(CHUNK, 4 * len(part))
    keep |= {id(r) for r in todo[start:]}
    return [r for r in regions if id(r) in keep]
