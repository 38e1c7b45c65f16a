"""Permutohedral-lattice Gaussian filtering, vectorised in torch (CPU and CUDA).

Adams, Baek and Davis, "Fast high-dimensional filtering using the permutohedral lattice"
(Eurographics 2010), as used by Krahenbuhl and Koltun, "Efficient inference in fully connected
CRFs with Gaussian edge potentials" (NIPS 2011), Sec. 4. For features ``f`` (already divided by
their standard deviations) the filter approximates

    out_a = sum_b exp(-|f_a - f_b|^2 / 2) v_b          (the pixel itself included, k_aa = 1)

in O(N d C) for N points, d feature dimensions and C value channels. The lattice (vertex keys,
barycentric weights, blur neighbours) is built once per image and reused for every filtering.
The construction reproduces the reference C++ implementation (``permutohedral.cpp`` of the
densecrf code): per-axis scales ``sqrt(2/3) (d+1) / sqrt((i+1)(i+2))``, rounding to the nearest
remainder-0 point, rank by sorting the residual, barycentric weights, blur ``v + (n1 + n2)/2``
along the d+1 lattice axes in order 0..d, slicing with the factor ``1 / (1 + 2^-d)``.

Batching: points of several images are embedded into one lattice whose keys carry the image
index, so a batch is filtered with one splat / blur / slice pass.

Implementations: eager CPU filtering multiplies by the precomputed sparse CSR splat / slice
matrices (MKL; 3-5x faster than index_add there). Inside ``torch.compile`` and whenever
:mod:`kernels.backend` selects Triton (CUDA tensors by default), the splat / blur / slice of
:mod:`kernels.lattice_filter` run instead (Triton, or their torch references, which Inductor
compiles); both compute the same sums.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from crf.errors import CRFInputError
from kernels import backend
from kernels.lattice_filter import lattice_blur, lattice_slice, lattice_splat

__all__ = ["MAX_COORDINATE", "Permutohedral", "build_lattice", "gaussian_filter_exact"]

#: Largest |elevated coordinate| the build accepts: the rounding to lattice points runs in
#: float64 and converts to int64, exact only well inside 2**53.
MAX_COORDINATE = 2.0**50


@dataclass(frozen=True)
class Permutohedral:
    """A built lattice. ``n_points = B * N`` points, ``n_vertices = V`` lattice vertices.

    Fields: ``offsets`` (P, d+1) vertex index of each point's enclosing-simplex vertices;
    ``weights`` (P, d+1) barycentric weights; ``slice_weights`` (P, d+1) the same scaled by
    ``alpha = 1 / (1 + 2^-d)``; ``neighbours`` (d+1, 2, V+1) the two blur neighbours of every
    vertex along each axis (index V = the always-zero padding row); ``splat_matrix`` (V+1, P)
    and ``slice_matrix`` (P, V+1) the sparse CSR matrices of the splat and (scaled) slice.
    """

    dim: int
    n_points: int
    n_vertices: int
    offsets: torch.Tensor
    weights: torch.Tensor
    slice_weights: torch.Tensor
    neighbours: torch.Tensor
    splat_matrix: torch.Tensor
    slice_matrix: torch.Tensor

    def filter(self, values: torch.Tensor) -> torch.Tensor:
        """Gaussian-filter ``values`` (P, C) -> (P, C): splat, blur (axes 0..d), slice."""
        if values.shape[0] != self.n_points:
            raise CRFInputError(
                f"lattice filter: values have {values.shape[0]} rows, lattice has "
                f"{self.n_points} points"
            )
        return self.slice(self.blur(self.splat(values)))

    def blur(self, lat: torch.Tensor) -> torch.Tensor:
        """Blur (V+1, C) lattice values along each of the d+1 axes: ``v + (n1 + n2) / 2``."""
        return lattice_blur(lat, self.neighbours)

    def splat(self, values: torch.Tensor) -> torch.Tensor:
        """Splat (P, C) point values onto the (V+1, C) lattice with barycentric weights."""
        if _sparse_path(values):
            return torch.sparse.mm(self.splat_matrix, values)
        return lattice_splat(values, self.offsets, self.weights, self.n_vertices + 1)

    def slice(self, lat: torch.Tensor) -> torch.Tensor:
        """Slice (V+1, C) blurred lattice values back to the (P, C) points (barycentric weights
        times ``alpha = 1 / (1 + 2^-d)``)."""
        if _sparse_path(lat):
            return torch.sparse.mm(self.slice_matrix, lat)
        return lattice_slice(lat, self.offsets, self.slice_weights)


def _sparse_path(x: torch.Tensor) -> bool:
    """Eager and not on the Triton path: use the CSR matrices (see the module docstring)."""
    return not torch.compiler.is_compiling() and not backend.use_triton(x)


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


def build_lattice(features: torch.Tensor, dtype: torch.dtype = torch.float32) -> Permutohedral:
    """Build the permutohedral lattice of (B, N, d) or (N, d) features (already / sigma).

    The build runs in float64 for stable rounding; filtering runs in ``dtype``.
    """
    if features.dim() == 2:
        features = features[None]
    if features.dim() != 3 or not torch.isfinite(features).all():
        raise CRFInputError("lattice: features must be a finite (B, N, d) or (N, d) tensor")
    b, n, d = features.shape
    dev = features.device
    flat = features.reshape(b * n, d).to(torch.float64)
    elevated = _elevate(flat)
    top = float(elevated.abs().max()) if elevated.numel() else 0.0
    if top >= MAX_COORDINATE:
        raise CRFInputError(
            f"lattice: elevated feature coordinates reach {top:.3g}, beyond the exact integer "
            f"range {MAX_COORDINATE:.3g} of the lattice keys (features too large)"
        )
    rem0, rank, bary = _simplex(elevated)
    keys = _vertex_keys(rem0, rank)[..., :d].reshape(-1, d)
    batch = torch.arange(b, device=dev).repeat_interleave(n * (d + 1))
    codes, strides = _encode(keys, batch, margin=d + 2)
    uniq, inverse = torch.unique(codes, sorted=True, return_inverse=True)
    n_vert = uniq.numel()
    offsets = inverse.reshape(b * n, d + 1)
    weights = bary.to(dtype)
    slice_weights = weights * (1.0 / (1.0 + 2.0 ** (-d)))
    neighbours = _neighbours(uniq, strides, d)
    splat, slc = _sparse_maps(offsets, weights, slice_weights, n_vert)
    return Permutohedral(d, b * n, n_vert, offsets, weights, slice_weights, neighbours, splat, slc)


def _csr(crow, cols, vals, size) -> torch.Tensor:
    """A CSR tensor built from valid indices (checks off; silences the beta-state warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, vals, size, check_invariants=False)


def _sparse_maps(
    offsets: torch.Tensor, weights: torch.Tensor, slice_weights: torch.Tensor, n_vert: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Splat (V+1, P) and slice (P, V+1) CSR matrices from offsets and (scaled) weights.

    Built directly in CSR form (no COO coalescing): the slice matrix has d+1 entries per row;
    the splat matrix is its transpose, grouped by vertex with one stable sort.
    """
    p, d1 = offsets.shape
    dev = offsets.device
    cols = offsets.reshape(-1)
    vals = weights.reshape(-1)
    crow = torch.arange(0, p * d1 + 1, d1, device=dev)
    slice_matrix = _csr(crow, cols, slice_weights.reshape(-1), (p, n_vert + 1))
    order = torch.sort(cols, stable=True).indices
    counts = torch.bincount(cols, minlength=n_vert + 1)
    crow_t = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    rows = torch.div(order, d1, rounding_mode="floor")
    splat_matrix = _csr(crow_t, rows, vals[order], (n_vert + 1, p))
    return splat_matrix, slice_matrix


def gaussian_filter_exact(features: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Brute-force reference: ``out_a = sum_b exp(-|f_a - f_b|^2 / 2) v_b`` for (N, d), (N, C).

    O(N^2): for tests and tiny instances only.
    """
    dist2 = torch.cdist(features, features).pow(2)
    return torch.exp(-0.5 * dist2) @ values
