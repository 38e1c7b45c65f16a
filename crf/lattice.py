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

**Build**: sort-based and vectorised, see :mod:`crf.lattice_build` (the same lattice as a
direct encoding of every point's vertices; the same torch code runs on CUDA tensors).

Batching: points of several images are embedded into one lattice whose keys carry the image
index, so a batch is filtered with one splat / blur / slice pass.

Implementations of splat and slice, per call:

- inside ``torch.compile`` and whenever :mod:`kernels.backend` selects Triton (CUDA tensors by
  default): :mod:`kernels.lattice_filter` (Triton, or its torch references, which Inductor
  compiles);
- eager on CPU: ``scipy.sparse`` products with two matrices sharing one index structure (row p
  = point p's d+1 vertices): the slice as CSR (P, V+1), the splat as the CSC (V+1, P) of the
  same arrays, whose product is a scatter that reads the points in order into the small, cached
  lattice (the access pattern of the C++ code; 2-3x faster than a CSR gather over the points,
  MKL's included). No sort or transpose is needed to build them;
- eager on CUDA without Triton: torch CSR matrices (cuSPARSE), built on first use.

All compute the same sums (in different orders).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from crf.errors import CRFInputError
from crf.lattice_build import MAX_COORDINATE, build_structure
from kernels import backend
from kernels.lattice_filter import lattice_blur, lattice_slice, lattice_splat

__all__ = [
    "MAX_COORDINATE",
    "Permutohedral",
    "build_lattice",
    "csr_matrix",
    "eager_path",
    "gaussian_filter_exact",
    "scipy_accumulate",
    "scipy_pair",
    "scipy_product",
]


@dataclass(frozen=True, eq=False)
class Permutohedral:
    """A built lattice. ``n_points = B * N`` points, ``n_vertices = V`` lattice vertices.

    Fields: ``offsets`` (P, d+1) vertex index of each point's enclosing-simplex vertices;
    ``weights`` (P, d+1) barycentric weights; ``slice_weights`` (P, d+1) the same scaled by
    ``alpha = 1 / (1 + 2^-d)``; ``neighbours`` (d+1, 2, V+1) the two blur neighbours of every
    vertex along each axis (index V = the always-zero padding row). The sparse matrices of the
    eager paths are built on first use: ``splat_matrix`` (V+1, P) / ``slice_matrix`` (P, V+1)
    (torch CSR) and ``cpu_matrices`` (scipy, CPU).
    """

    dim: int
    n_points: int
    n_vertices: int
    offsets: torch.Tensor
    weights: torch.Tensor
    slice_weights: torch.Tensor
    neighbours: torch.Tensor

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
        path = eager_path(values)
        if path == "cpu":
            return scipy_product(self.cpu_matrices[0], values)
        if path == "cuda":
            return torch.sparse.mm(self.splat_matrix, values)
        return lattice_splat(values, self.offsets, self.weights, self.n_vertices + 1)

    def slice(self, lat: torch.Tensor) -> torch.Tensor:
        """Slice (V+1, C) blurred lattice values back to the (P, C) points (barycentric weights
        times ``alpha = 1 / (1 + 2^-d)``)."""
        path = eager_path(lat)
        if path == "cpu":
            return scipy_product(self.cpu_matrices[1], lat)
        if path == "cuda":
            return torch.sparse.mm(self.slice_matrix, lat)
        return lattice_slice(lat, self.offsets, self.slice_weights)

    @cached_property
    def cpu_matrices(self) -> tuple[Any, Any]:
        """scipy (splat CSC (V+1, P), slice CSR (P, V+1)) sharing one index structure."""
        return scipy_pair(self.offsets, self.weights, self.slice_weights, self.n_vertices + 1)

    @cached_property
    def splat_matrix(self) -> torch.Tensor:
        """(V+1, P) torch CSR: row v holds the weights of the points splatting onto vertex v
        (points in increasing order)."""
        p, d1 = self.offsets.shape
        rows = self.offsets.reshape(-1)
        order = torch.sort(rows, stable=True).indices
        counts = torch.bincount(rows, minlength=self.n_vertices + 1)
        crow = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        cols = torch.div(order, d1, rounding_mode="floor")
        vals = self.weights.reshape(-1).index_select(0, order)
        return csr_matrix(crow, cols, vals, (self.n_vertices + 1, p))

    @cached_property
    def slice_matrix(self) -> torch.Tensor:
        """(P, V+1) torch CSR: row p holds the d+1 scaled slice weights of point p."""
        p, d1 = self.offsets.shape
        crow = torch.arange(0, p * d1 + 1, d1, device=self.offsets.device)
        cols, vals = self.offsets.reshape(-1), self.slice_weights.reshape(-1)
        return csr_matrix(crow, cols, vals, (p, self.n_vertices + 1))


def eager_path(x: torch.Tensor) -> str:
    """Which splat / slice implementation a call on ``x`` runs: "kernels" (compiling, or
    Triton selected), "cpu" (scipy) or "cuda" (torch CSR); see the module docstring."""
    if torch.compiler.is_compiling() or backend.use_triton(x):
        return "kernels"
    return "cuda" if x.is_cuda else "cpu"


def scipy_pair(
    offsets: torch.Tensor, splat_values: torch.Tensor, slice_values: torch.Tensor, n_rows: int
) -> tuple[Any, Any]:
    """scipy (splat CSC (n_rows, P), slice CSR (P, n_rows)) from (P, K) CPU ``offsets`` (row p:
    the K lattice rows of point p) and their (P, K) splat / slice values (one shared index)."""
    import scipy.sparse as sp  # a core dependency, imported on first use (import time)

    p, k = offsets.shape
    indices = offsets.reshape(-1).to(torch.int32).numpy()
    indptr = np.arange(0, p * k + 1, k, dtype=np.int32)
    splat = sp.csc_matrix((splat_values.reshape(-1).numpy(), indices, indptr), (n_rows, p))
    slc = sp.csr_matrix((slice_values.reshape(-1).numpy(), indices, indptr), (p, n_rows))
    return splat, slc


def scipy_product(matrix: Any, values: torch.Tensor, shape: tuple | None = None) -> torch.Tensor:
    """``matrix @ values`` for a scipy sparse matrix and a (n, C) CPU tensor of its dtype,
    optionally reshaped to ``shape`` (in numpy, so the result is a tensor of its own)."""
    out = matrix @ values.detach().contiguous().numpy()
    return torch.from_numpy(out if shape is None else out.reshape(shape))


def scipy_accumulate(matrix: Any, values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out += matrix @ values`` in place, for a scipy CSR / CSC matrix, a (n, C) CPU tensor
    and a contiguous (m, C) ``out`` of its dtype: no temporary of the result's size (large
    fresh allocations cost page faults). Uses scipy's compiled kernels directly
    (``_sparsetools``), or ``@`` where they are not available."""
    x = values.detach().contiguous().numpy()
    y = out.numpy()
    kernel = _sparsetools(matrix.format)
    if kernel is None or matrix.dtype != x.dtype or not y.flags.c_contiguous:
        y += matrix @ x
        return out
    n_row, n_col = matrix.shape
    kernel(
        n_row, n_col, x.shape[1], matrix.indptr, matrix.indices, matrix.data, x.ravel(), y.ravel()
    )
    return out


def _sparsetools(fmt: str):
    """scipy's ``csr_matvecs`` / ``csc_matvecs`` (``Y += A X``), or None."""
    try:
        from scipy.sparse import _sparsetools as tools
    except ImportError:  # pragma: no cover - private module of scipy, present since 0.14
        return None
    return getattr(tools, f"{fmt}_matvecs", None)


def csr_matrix(
    crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """A torch CSR tensor from valid indices (int32 where they fit; checks off)."""
    if max(size) < 2**31 - 1 and cols.numel() < 2**31 - 1:
        crow, cols = crow.to(torch.int32), cols.to(torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the beta-state warning
        return torch.sparse_csr_tensor(crow, cols, vals, size, check_invariants=False)


def build_lattice(features: torch.Tensor, dtype: torch.dtype = torch.float32) -> Permutohedral:
    """Build the permutohedral lattice of (B, N, d) or (N, d) features (already / sigma).

    The build runs in float64 for stable rounding; filtering runs in ``dtype``.
    """
    if features.dim() == 2:
        features = features[None]
    if features.dim() != 3:
        raise CRFInputError("lattice: features must be a (B, N, d) or (N, d) tensor")
    b, n, d = features.shape
    s = build_structure(features.to(torch.float64), dtype)
    weights = s.weights
    slice_weights = weights * (1.0 / (1.0 + 2.0 ** (-d)))
    return Permutohedral(d, b * n, s.n_vertices, s.offsets, weights, slice_weights, s.neighbours)


def gaussian_filter_exact(features: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Brute-force reference: ``out_a = sum_b exp(-|f_a - f_b|^2 / 2) v_b`` for (N, d), (N, C).

    O(N^2): for tests and tiny instances only.
    """
    dist2 = torch.cdist(features, features).pow(2)
    return torch.exp(-0.5 * dist2) @ values
