"""Soundness helpers: sampled points and box corners must lie inside the bounds."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor


def box_samples(lower: Tensor, upper: Tensor, n: int, seed: int = 0) -> Tensor:
    """`[batch, n + corners, *shape]`: uniform samples, plus every corner when the input has at
    most 10 elements (else 64 random corners)."""
    gen = torch.Generator().manual_seed(seed)
    batch, shape = lower.shape[0], lower.shape[1:]
    numel = lower[0].numel()
    u = torch.rand(batch, n, *shape, generator=gen, dtype=lower.dtype)
    if numel <= 10:
        bits = torch.tensor(list(itertools.product([0.0, 1.0], repeat=numel)), dtype=lower.dtype)
        corners = bits.reshape(-1, *shape).expand(batch, -1, *shape)
    else:
        corners = torch.randint(0, 2, (batch, 64, *shape), generator=gen).to(lower.dtype)
    t = torch.cat([u, corners], dim=1)
    return lower.unsqueeze(1) + t * (upper - lower).unsqueeze(1)


def spec_values(net, points: Tensor, C: Tensor) -> Tensor:
    """`C @ net(x)` for `points` `[batch, n, *shape]`: `[batch, n, n_specs]`."""
    batch, n = points.shape[:2]
    with torch.no_grad():
        y = net(points.reshape(batch * n, *points.shape[2:])).reshape(batch, n, -1)
    return torch.einsum("bso,bno->bns", C, y)


def assert_contains(lower: Tensor, upper: Tensor, values: Tensor, tol: float = 1e-9) -> None:
    """Every sampled value `[batch, n, S]` within `[lower, upper]` (`[batch, S]`)."""
    below = (lower.unsqueeze(1) - values).max()
    above = (values - upper.unsqueeze(1)).max()
    assert below <= tol, f"a lower bound exceeds a sampled value by {float(below):.3g}"
    assert above <= tol, f"an upper bound is below a sampled value by {float(above):.3g}"
