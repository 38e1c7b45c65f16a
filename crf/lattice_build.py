"""Vectorised construction of the permutohedral lattice (Adams, Baek and Davis 2010, Sec. 3-4).

No Python loop over points and no hash table: the per-point arithmetic of the reference C++
code (``permutohedral.cpp`` of densecrf: elevation, nearest remainder-0 point, rank, barycentric
weights) runs on coordinate-major (d+1, P) tensors, and the hash table is replaced by sorting:

1. each point's enclosing simplex is one int64 code, a mixed-radix number of its remainder-0
   vertex (``rem0 / (d+1)``, d coordinates), its rank (d digits) and its image index; this
   per-point stage runs over blocks of points on CPU, so that its temporaries stay in cache
   instead of costing page faults (one block on CUDA);
2. runs of equal codes along the pixel order (neighbouring pixels often share a simplex) are
   collapsed, the R run codes sorted and grouped into the S distinct simplices (R, S < P);
3. the S (d+1) vertex keys ``rem0 + canonical[r][rank]`` of those simplices are encoded as in
   the reference (mixed radix over the key range plus a margin, so that the blur neighbours
   ``key +- (1, ..., 1, -d, 1, ...)`` are plain offsets of the code) and sorted into the V
   vertices; a point's d+1 vertex indices are its simplex's;
4. the blur neighbours are found by binary search among the sorted vertex codes.

Sorting costs O(R log R + S d log(S d)) instead of O(P d log(P d)). The keys, codes and vertex
order are those of a direct encoding of every point's d+1 vertices, so the lattice (vertex
numbering included) is the one the previous unblocked build made, and up to vertex numbering
the C++ hash table's. All of it is torch code that runs on CUDA tensors as well (a few host
syncs for sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crf.errors import CRFInputError

__all__ = ["MAX_COORDINATE", "LatticeStructure", "build_structure"]

#: Largest |elevated coordinate| the build accepts: the rounding to lattice points runs in
#: float64 and converts to int64, exact only well inside 2**53.
MAX_COORDINATE = 2.0**50

#: Codes (of simplices and of vertices) must stay below this, inside int64.
MAX_CODE = 2**62

#: Points per block of the per-point stage on CPU (temporaries of ~1 MB stay in cache).
CHUNK = 16384


@dataclass(frozen=True, eq=False)
class LatticeStructure:
    """``offsets`` (P, d+1) int64 vertex indices; ``weights`` (P, d+1) barycentric weights
    (in the filtering dtype); ``neighbours`` (d+1, 2, V+1) int64; ``n_vertices`` V."""

    offsets: torch.Tensor
    weights: torch.Tensor
    neighbours: torch.Tensor
    n_vertices: int


@dataclass(frozen=True, eq=False)
class _Groups:
    """Points grouped by simplex: ``point_simplex`` (P,) simplex index of each point and
    ``representative`` (S,) one point of each simplex."""

    point_simplex: torch.Tensor
    representative: torch.Tensor


def elevate(features_t: torch.Tensor) -> torch.Tensor:
    """Embed (d, P) features into the hyperplane sum = 0 of R^{d+1}: (d+1, P) (Adams et al.
    p.5, ``E f`` with the reference code's per-axis scales ``sqrt(2/3) (d+1) / sqrt((k+1)
    (k+2))``): ``e_j = sum_{k >= j} cf_k - j cf_{j-1}``. Elementwise, in a fixed order (a
    matrix product's rounding would depend on the block size)."""
    d, p = features_t.shape
    k = torch.arange(d, dtype=features_t.dtype, device=features_t.device)
    scale = (2.0 / 3.0) ** 0.5 * (d + 1) / torch.sqrt((k + 1.0) * (k + 2.0))
    cf = features_t * scale[:, None]
    suffix = torch.flip(torch.cumsum(torch.flip(cf, [0]), 0), [0])  # sum_{k >= j} cf_k
    out = torch.empty(d + 1, p, dtype=cf.dtype, device=cf.device)
    out[0] = suffix[0]
    j = torch.arange(1, d, dtype=cf.dtype, device=cf.device)[:, None]
    out[1:d] = suffix[1:] - j * cf[: d - 1]
    out[d] = -d * cf[d - 1]
    return out


def _rank_matrix(d1: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs ``(i, j)``, i < j, as index rows ``first``, ``second`` and the (d+1, pairs) matrix
    ``A`` with ``rank = A [diff_i < diff_j] + (0, 1, ..., d)`` (the reference's tie-break)."""
    first, second = torch.triu_indices(d1, d1, 1, device=like.device)
    a = torch.zeros(d1, first.numel(), dtype=like.dtype, device=like.device)
    cols = torch.arange(first.numel(), device=like.device)
    a[first, cols] = 1.0
    a[second, cols] = -1.0
    return first, second, a


def simplex(elevated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nearest remainder-0 point, rank and barycentric weights (Adams et al. p.10), for
    (d+1, P) float64 elevated points: ``rem0`` and ``rank`` (d+1, P) (whole numbers, float64)
    and ``bary`` (d+1, P).

    Rank tie-break as the reference: for i < j, ``rank_i += [diff_i < diff_j]``, else
    ``rank_j += 1``; all d (d+1) / 2 comparisons are one tensor and the counts one product.
    """
    d1 = elevated.shape[0]
    d = d1 - 1
    down = torch.div(elevated, d1).floor_().mul_(d1)
    up = down + d1
    rem0 = torch.where((up - elevated) < (elevated - down), up, down)
    diff = elevated - rem0
    first, second, a = _rank_matrix(d1, elevated)
    less = diff.index_select(0, first) < diff.index_select(0, second)  # (pairs, P)
    rank = torch.mm(a, less.to(a.dtype))
    rank += torch.arange(d1, dtype=rank.dtype, device=rank.device)[:, None]
    rank += rem0.sum(0) / d1  # back onto the plane: then wrap ranks into [0, d]
    wrap = torch.div(rank, d1).floor_()
    rank -= d1 * wrap
    rem0 -= d1 * wrap
    contrib = (elevated - rem0).div_(d1)
    by_rank = torch.empty_like(contrib).scatter_(0, rank.long(), contrib)  # contrib by rank
    flipped = torch.flip(by_rank, [0])
    bary = torch.empty_like(contrib)
    bary[0] = by_rank[d] + (1.0 - by_rank[0])
    torch.sub(flipped[1:], flipped[:d], out=bary[1:])
    return rem0, rank, bary


def _overflow(cells: int) -> CRFInputError:
    return CRFInputError(
        f"lattice: the features span {cells:.3g} lattice cells, too many for the 64-bit key "
        "(2**62); use larger sigmas or smaller images"
    )


def _mixed_radix(digits: list[torch.Tensor], spans: list[int]) -> torch.Tensor:
    """int64 code ``sum_k digits[k] prod_{l < k} spans[l]`` of non-negative digits < spans."""
    total = 1
    for s in spans:
        total *= int(s)
    if total >= MAX_CODE:
        raise _overflow(total)
    code, stride = digits[0].clone(), 1
    for digit, span in zip(digits[1:], spans[:-1]):
        stride *= int(span)
        code += digit * stride
    return code


def group_points(codes: torch.Tensor) -> _Groups:
    """Group (P,) simplex codes: collapse runs of equal codes, sort the runs, group them."""
    p = codes.numel()
    is_start = torch.ones(p, dtype=torch.bool, device=codes.device)
    is_start[1:] = codes[1:] != codes[:-1]
    run_start = torch.nonzero(is_start).squeeze(1)
    run_len = torch.diff(run_start, append=run_start.new_full((1,), p))
    sorted_codes, perm = torch.sort(codes.index_select(0, run_start), stable=True)
    _, sorted_simplex, runs_per = torch.unique_consecutive(
        sorted_codes, return_inverse=True, return_counts=True
    )
    run_simplex = torch.empty_like(perm).scatter_(0, perm, sorted_simplex)
    point_simplex = torch.repeat_interleave(run_simplex, run_len, output_size=p)
    first_run = torch.cumsum(runs_per, 0) - runs_per  # sorted position of each first run
    representative = run_start.index_select(0, perm.index_select(0, first_run))
    return _Groups(point_simplex, representative)


def vertex_codes(
    rem0: torch.Tensor, rank: torch.Tensor, batch: torch.Tensor | None, margin: int
) -> tuple[torch.Tensor, list[int]]:
    """(d+1, S) int64 codes of the d+1 vertices of S simplices (their (d+1, S) ``rem0`` and
    ``rank``) and the coordinate strides.

    Vertex r has the key ``k_i = rem0_i + r - (d+1) [rank_i >= d+1-r]`` (i < d; the reference's
    ``rem0 + canonical[r][rank]``), encoded in mixed radix over the key range plus ``margin``
    (as the reference's hash keys, so the blur neighbours are offsets of the code) and the
    image index. Computed without materialising the (d+1, d, S) keys: ``code_r = base + r
    sum(strides) - (d+1) W_r`` with ``W_r`` the strides of the coordinates ranked ``>= d+1-r``.
    """
    d1, s = rem0.shape
    d = d1 - 1
    low = (rem0[:d] - rank[:d]).amin(1) - margin  # k_i ranges over [rem0_i - rank_i, + d]
    high = (rem0[:d] - rank[:d]).amax(1) + d
    span = (high - low + margin + 1).tolist()
    if batch is not None:
        span.append(int(batch.max()) + 1)
    total = 1
    for x in span:
        total *= int(x)
    if total >= MAX_CODE:
        raise _overflow(total)
    strides = [1]
    for x in span[: d - 1]:
        strides.append(strides[-1] * int(x))
    stride_t = torch.tensor(strides, dtype=torch.int64, device=rem0.device)
    base = ((rem0[:d] - low[:, None]) * stride_t[:, None]).sum(0)
    if batch is not None:
        base += batch * (strides[-1] * int(span[d - 1]))
    by_rank = torch.zeros(d1, s, dtype=torch.int64, device=rem0.device)
    by_rank.scatter_(0, rank[:d], stride_t[:, None].expand(d, s).contiguous())
    above = torch.flip(torch.cumsum(torch.flip(by_rank, [0]), 0), [0])  # sum over ranks >= k
    wrap = torch.cat([torch.zeros_like(above[:1]), torch.flip(above, [0])[:d]])  # W_r
    r = torch.arange(d1, device=rem0.device)[:, None]
    return base[None] + r * sum(strides) - d1 * wrap, strides


def _searchsorted(sorted_codes: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``torch.searchsorted``; on CPU numpy's, several times faster on the runs of increasing
    targets that the neighbour lookups are (it reuses the previous position)."""
    if sorted_codes.device.type != "cpu":
        return torch.searchsorted(sorted_codes, targets)
    return torch.from_numpy(np.searchsorted(sorted_codes.numpy(), targets.numpy()))


def neighbours(codes: torch.Tensor, strides: list[int], d: int) -> torch.Tensor:
    """(d+1, 2, V+1) neighbour indices along each lattice axis among sorted vertex ``codes``;
    missing neighbours -> V (the zero row). Axis j moves the key by ``+-(d+1) e_j -+ 1``."""
    n_vert = codes.numel()
    minus_all = -sum(strides)
    steps = [minus_all + ((d + 1) * strides[j] if j < d else 0) for j in range(d + 1)]
    step_t = torch.tensor(steps, dtype=torch.int64, device=codes.device)
    sign = torch.tensor([1, -1], dtype=torch.int64, device=codes.device)
    target = codes + (step_t[:, None] * sign[None, :])[..., None]  # (d+1, 2, V)
    pos = _searchsorted(codes, target.reshape(-1)).clamp_(max=n_vert - 1)
    found = codes.index_select(0, pos) == target.reshape(-1)
    idx = torch.where(found, pos, torch.full_like(pos, n_vert)).view(d + 1, 2, n_vert)
    return torch.cat([idx, idx.new_full((d + 1, 2, 1), n_vert)], 2)


def point_stage(
    flat: torch.Tensor, n_images: int, dtype: torch.dtype, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-point simplex codes (P,) int64 and barycentric weights (P, d+1) in ``dtype`` of
    (P, d) float64 features, ``n_images`` consecutive images of P / n_images points each.

    Runs over blocks of ``chunk`` points (cache-sized temporaries; one block on CUDA). The code
    is a mixed-radix number: the rank (d digits, least significant), ``rem0 / (d+1)`` over its
    exact range (d coordinates), the image index.
    """
    p, d = flat.shape
    d1, dev = d + 1, flat.device
    q = torch.empty(d, p, dtype=torch.int64, device=dev)
    codes = torch.empty(p, dtype=torch.int64, device=dev)
    weights = torch.empty(p, d1, dtype=dtype, device=dev)
    radix = (d1 ** torch.arange(d, device=dev, dtype=torch.float64))[None]  # (1, d)
    tops = []
    for lo in range(0, p, chunk):
        hi = min(lo + chunk, p)
        elevated = elevate(flat[lo:hi].t().contiguous())  # (d+1, chunk)
        tops.append(elevated.abs().amax())
        rem0, rank, bary = simplex(elevated)
        q[:, lo:hi] = rem0[:d] / d1
        codes[lo:hi] = torch.mm(radix, rank[:d])[0]
        weights[lo:hi] = bary.t()
    top = float(torch.stack(tops).max())
    if not top < MAX_COORDINATE:  # also NaN / inf features
        raise CRFInputError(
            f"lattice: elevated feature coordinates reach {top:.3g}, beyond the exact integer "
            f"range {MAX_COORDINATE:.3g} of the lattice keys (features too large)"
        )
    low = q.amin(1)
    spans = [d1**d, *(q.amax(1) - low + 1).tolist()] + ([n_images] if n_images > 1 else [])
    total, stride = 1, []
    for x in spans:
        stride.append(total)
        total *= int(x)
    if total >= MAX_CODE:
        raise _overflow(total)
    for i in range(d):
        digit = q[i] - low[i]
        digit *= stride[i + 1]
        codes += digit
    if n_images > 1:
        images = torch.arange(n_images, device=dev)[:, None] * stride[-1]
        codes.view(n_images, -1).add_(images)
    return codes, weights


def build_structure(
    features: torch.Tensor, dtype: torch.dtype, chunk: int | None = None
) -> LatticeStructure:
    """The lattice of (B, N, d) float64 features (see the module docstring); weights in
    ``dtype``. ``chunk``: points per block of the per-point stage (default: 16384 on CPU, all
    points at once on CUDA)."""
    b, n, d = features.shape
    if b * n == 0:
        raise CRFInputError("lattice: no points (empty features)")
    d1, dev = d + 1, features.device
    flat = features.reshape(b * n, d)
    if chunk is None:
        chunk = b * n if dev.type == "cuda" else CHUNK
    codes, weights = point_stage(flat, b, dtype, chunk)
    groups = group_points(codes)
    rep = groups.representative
    rem0, rank, _ = simplex(elevate(flat.index_select(0, rep).t().contiguous()))
    rem0, rank = rem0.long(), rank.long()
    batch = torch.div(rep, n, rounding_mode="floor") if b > 1 else None
    codes_v, strides = vertex_codes(rem0, rank, batch, margin=d + 2)
    sorted_codes, pair_order = torch.sort(codes_v.reshape(-1), stable=True)
    uniq, sorted_vertex = torch.unique_consecutive(sorted_codes, return_inverse=True)
    pair_vertex = torch.empty_like(pair_order).scatter_(0, pair_order, sorted_vertex)
    simplex_vertices = pair_vertex.view(d1, -1).t().contiguous()  # (S, d+1)
    offsets = simplex_vertices.index_select(0, groups.point_simplex)
    return LatticeStructure(offsets, weights, neighbours(uniq, strides, d), uniq.numel())
