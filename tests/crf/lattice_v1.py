"""The previous lattice build (before issue 15), kept as a test oracle for the new one.

One vectorised pass over all P (d+1) vertex keys: elevation, nearest remainder-0 point and rank
by pairwise comparisons of (P, d+1, d+1), every vertex key encoded and ``torch.unique``-d, blur
neighbours by ``torch.searchsorted``. Slow (it sorts P (d+1) keys) but direct: the new build
(:mod:`crf.lattice_build`) must give the same lattice.
"""

from __future__ import annotations

import torch

from crf.errors import CRFInputError
from crf.lattice import Permutohedral


def _elevate(features: torch.Tensor) -> torch.Tensor:
    """Embed (P, d) features into the hyperplane sum = 0 of R^{d+1} (Adams et al. p.5, E f)."""
    d = features.shape[1]
    idx = torch.arange(d, dtype=features.dtype, device=features.device)
    inv_std = (2.0 / 3.0) ** 0.5 * (d + 1)
    cf = features * (inv_std / torch.sqrt((idx + 1.0) * (idx + 2.0)))
    suffix = torch.flip(torch.cumsum(torch.flip(cf, [1]), 1), [1])  # sum_{k >= j} cf_k
    suffix = torch.cat([suffix, torch.zeros_like(suffix[:, :1])], 1)  # (P, d+1), S_d = 0
    j = torch.arange(1, d + 1, dtype=features.dtype, device=features.device)
    elevated = suffix.clone()
    elevated[:, 1:] = suffix[:, 1:] - j * cf
    return elevated


def _simplex(elevated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest remainder-0 point, rank and barycentric weights (Adams et al. p.10).

    Returns ``rem0`` (P, d+1) int64, ``rank`` (P, d+1) int64, ``bary`` (P, d+1).
    """
    p, d1 = elevated.shape
    v = elevated / d1
    up = torch.ceil(v) * d1
    down = torch.floor(v) * d1
    rem0 = torch.where(up - elevated < elevated - down, up, down)
    total = torch.round(rem0.sum(1, keepdim=True) / d1).long()
    diff = elevated - rem0
    # rank_i = #{j > i: diff_j > diff_i} + #{j < i: diff_j >= diff_i} (reference tie-break)
    greater = diff[:, None, :] > diff[:, :, None]
    geq = diff[:, None, :] >= diff[:, :, None]
    upper = torch.triu(torch.ones(d1, d1, dtype=torch.bool, device=elevated.device), 1)
    rank = (greater & upper).sum(2) + (geq & upper.T).sum(2)
    rank = rank + total
    rem0 = rem0.long()
    low, high = rank < 0, rank > d1 - 1
    rank = rank + d1 * low.long() - d1 * high.long()
    rem0 = rem0 + d1 * low.long() - d1 * high.long()
    contrib = (elevated - rem0.to(elevated.dtype)) / d1
    bary = torch.zeros(p, d1 + 1, dtype=elevated.dtype, device=elevated.device)
    bary.scatter_add_(1, d1 - 1 - rank, contrib)
    bary.scatter_add_(1, d1 - rank, -contrib)
    bary[:, 0] += 1.0 + bary[:, d1]
    return rem0, rank, bary[:, :d1]


def _vertex_keys(rem0: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """Keys (P, d+1, d+1) of the d+1 simplex vertices: ``rem0 + canonical[r][rank]``."""
    d1 = rem0.shape[1]
    r = torch.arange(d1, device=rem0.device)[:, None]
    col = torch.arange(d1, device=rem0.device)[None, :]
    canonical = torch.where(col <= d1 - 1 - r, r, r - d1)  # (d+1 remainders, d+1 ranks)
    return rem0[:, None, :] + canonical[:, rank].permute(1, 0, 2)


def _encode(keys: torch.Tensor, batch: torch.Tensor, margin: int) -> tuple[torch.Tensor, list]:
    """Mixed-radix int64 codes of (K, d) keys plus batch index; returns codes and strides."""
    low = keys.amin(0) - margin
    span = keys.amax(0) - low + margin + 1
    strides, acc = [], 1
    for s in span.tolist():
        strides.append(acc)
        acc *= int(s)
    if acc * (int(batch.max()) + 1) >= 2**62:
        raise CRFInputError(
            f"lattice: the features span {acc * (int(batch.max()) + 1):.3g} lattice cells, too "
            "many for the 64-bit key (2**62); use larger sigmas or smaller images"
        )
    stride_t = torch.tensor(strides, dtype=torch.int64, device=keys.device)
    codes = ((keys - low) * stride_t).sum(1) + batch * acc
    return codes, strides


def _neighbours(codes: torch.Tensor, strides: list, d: int) -> torch.Tensor:
    """(d+1, 2, V+1) neighbour indices along each lattice axis; missing -> V (zero row)."""
    n_vert = codes.numel()
    minus_all = -sum(strides)
    rows = []
    for j in range(d + 1):
        step = minus_all + ((d + 1) * strides[j] if j < d else 0)
        pair = []
        for sign in (1, -1):
            target = codes + sign * step
            pos = torch.searchsorted(codes, target).clamp(max=n_vert - 1)
            found = codes[pos] == target
            idx = torch.where(found, pos, torch.full_like(pos, n_vert))
            pair.append(torch.cat([idx, idx.new_full((1,), n_vert)]))
        rows.append(torch.stack(pair))
    return torch.stack(rows)


def build_reference(features: torch.Tensor, dtype: torch.dtype = torch.float32) -> Permutohedral:
    """The previous build of (B, N, d) or (N, d) features, as a :class:`Permutohedral`."""
    if features.dim() == 2:
        features = features[None]
    b, n, d = features.shape
    flat = features.reshape(b * n, d).to(torch.float64)
    rem0, rank, bary = _simplex(_elevate(flat))
    keys = _vertex_keys(rem0, rank)[..., :d].reshape(-1, d)
    batch = torch.arange(b, device=features.device).repeat_interleave(n * (d + 1))
    codes, strides = _encode(keys, batch, margin=d + 2)
    uniq, inverse = torch.unique(codes, sorted=True, return_inverse=True)
    offsets = inverse.reshape(b * n, d + 1)
    weights = bary.to(dtype)
    slice_weights = weights * (1.0 / (1.0 + 2.0 ** (-d)))
    neighbours = _neighbours(uniq, strides, d)
    return Permutohedral(d, b * n, uniq.numel(), offsets, weights, slice_weights, neighbours)
