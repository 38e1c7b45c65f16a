"""All lattice kernels of a model in one splat / blur / slice pass (the eager sparse paths).

The model kernel ``sum_m w_m n_m K_m (n_m v)`` (Krahenbuhl and Koltun 2011, Sec. 4; ``n_m`` the
symmetric normalisation or 1) is, for permutohedral kernels ``K_m = a_m S_m^T B_m S_m``,

    L (B (S v)),   S = [S_1 diag(n_1); S_2 diag(n_2); ...]   (stacked lattice rows, R x P)
                   L = [w_1 a_1 diag(n_1) S_1^T, w_2 a_2 diag(n_2) S_2^T, ...]   (P x R)

with ``B`` the block-diagonal blur (each block along its own lattice's axes) and ``a_m`` the
slice factor ``1 / (1 + 2^-d_m)``. Row p of both ``S^T`` and ``L`` holds point p's vertices in
every lattice (3 + 6 entries for the two classic kernels), so the two matrices share one index
structure (see :func:`crf.lattice.scipy_pair`). One sparse product splats every kernel, one
slices and sums them, and ``subtract`` is taken off in place; on CPU this saves about a third
of a mean-field iteration over filtering kernel by kernel. Used only where the per-kernel path
would use sparse matrices (eager, no Triton); elsewhere :meth:`crf.model.CRFModel.filter`
loops over the kernels.
"""

from __future__ import annotations

import torch

from crf.lattice import Permutohedral, csr_matrix, scipy_accumulate, scipy_pair
from kernels.lattice_filter import lattice_blur_reference

__all__ = ["BLOCK_POINTS", "REUSE_BYTES", "FusedFilter", "FusedMeanField"]


class FusedFilter:
    """``v (B, N, C) -> sum_m w_m n_m K_m (n_m v)`` for lattice kernels (see the module doc).

    ``lattices``: one :class:`Permutohedral` per kernel (same points, same device);
    ``weights`` the ``w_m``; ``norms``: per kernel None or (B, N, 1) factors ``n_m``.
    """

    def __init__(
        self,
        lattices: list[Permutohedral],
        weights: list[float],
        norms: list[torch.Tensor | None],
    ) -> None:
        p = lattices[0].n_points
        offsets, splat_vals, slice_vals, blocks, rows = [], [], [], [], 0
        for lat, w, n in zip(lattices, weights, norms):
            nflat = None if n is None else n.reshape(p, 1).to(lat.weights.dtype)
            offsets.append(lat.offsets + rows)
            splat_vals.append(lat.weights if nflat is None else lat.weights * nflat)
            slice_vals.append(lat.slice_weights * (w if nflat is None else w * nflat))
            blocks.append((rows, rows + lat.n_vertices + 1, lat.neighbours))
            rows += lat.n_vertices + 1
        self.n_points, self.n_rows, self.blocks = p, rows, blocks
        self._buffers: dict[tuple, torch.Tensor] = {}
        self.device = lattices[0].offsets.device
        index = torch.cat(offsets, 1)  # (P, K): row p = point p's vertices in every lattice
        splat, slc = torch.cat(splat_vals, 1), torch.cat(slice_vals, 1)
        if self.device.type == "cpu":
            self.splat, self.slice = scipy_pair(index, splat, slc, rows)
        else:
            k = index.shape[1]
            crow = torch.arange(0, p * k + 1, k, device=self.device)
            self.slice = csr_matrix(crow, index.reshape(-1), slc.reshape(-1), (p, rows))
            transposed = csr_matrix(crow, index.reshape(-1), splat.reshape(-1), (p, rows))
            self.splat = transposed.t().to_sparse_csr()  # a sort: cheap on a GPU

    def __call__(
        self,
        v: torch.Tensor,
        subtract: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, N, C) -> (B, N, C): the model kernel applied to ``v``, minus ``subtract``;
        written into ``out`` (contiguous, v's shape, not overlapping v) when given. On CPU
        the lattice buffers are kept between calls and the products accumulate in place."""
        shape = v.shape
        flat = v.reshape(self.n_points, -1)
        if out is None:
            out = torch.empty(shape, dtype=v.dtype, device=v.device)
        target = out.view(self.n_points, -1)
        if self.device.type != "cpu":
            res = torch.sparse.mm(self.slice, self._blur(torch.sparse.mm(self.splat, flat)))
            return (
                out.copy_(res.view(shape))
                if subtract is None
                else torch.sub(res.view(shape), subtract, out=out)
            )
        lat = self._buffer("lattice", flat.shape[1], flat.dtype).zero_()
        blurred = self._blur(scipy_accumulate(self.splat, flat, lat))
        if subtract is None:
            target.zero_()
        else:
            torch.neg(subtract.reshape(self.n_points, -1), out=target)
        scipy_accumulate(self.slice, blurred, target)
        return out

    def _blur(self, lat: torch.Tensor) -> torch.Tensor:
        """Each kernel's block blurred along its own lattice's axes."""
        blurred = self._buffer("blurred", lat.shape[1], lat.dtype, like=lat)
        for start, stop, neighbours in self.blocks:
            lattice_blur_reference(lat[start:stop], neighbours, out=blurred[start:stop])
        return blurred

    def _buffer(self, name: str, channels: int, dtype, like: torch.Tensor | None = None):
        """A persistent (R, channels) buffer (CPU), or a fresh one (other devices)."""
        if self.device.type != "cpu" and like is not None:
            return torch.empty_like(like)
        key = (name, channels, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty(self.n_rows, channels, dtype=dtype, device=self.device)
            self._buffers = {k: b for k, b in self._buffers.items() if k[0] != name}
            self._buffers[key] = buf
        return buf


#: Arrays above this size are never reused by glibc's allocator (its largest dynamic mmap
#: threshold): each fresh one costs page faults, on every iteration. The blocked mean-field
#: update (which reuses its buffers) is used for marginals above it: measured 13 % faster on a
#: batch of 8 images 256 x 256 x 21 (44 MB arrays), no faster on one 512 x 512 x 21 image.
REUSE_BYTES = 32 << 20

#: Points per block of the blocked mean-field update: its slices of ``K q - phi``, the new
#: marginals and the unaries (C floats a point each) stay in the core's cache between the
#: slice, the softmax and the splat of the next iteration.
BLOCK_POINTS = 8192


class FusedMeanField:
    """Mean-field updates ``q' = softmax(K q - phi [- K_aa q])`` on the fused CPU path, blocked
    over points for cache locality: per block of points, the slice of the blurred lattice
    (minus the unaries), the softmax and, at once, the splat of the new marginals into the next
    iteration's lattice. Outputs go to two reused buffers (large fresh allocations cost page
    faults); the lattice of the last output is kept, so a chain of calls splats each iterate
    once. Same sums as ``FusedFilter`` + softmax, in the same order per point and vertex."""

    def __init__(self, fused: FusedFilter, like: torch.Tensor) -> None:
        self.fused = fused
        self.out = [torch.empty_like(like, memory_format=torch.contiguous_format) for _ in range(2)]
        self.x = torch.empty(BLOCK_POINTS, like.shape[-1], dtype=like.dtype)
        self.lattices = [fused._buffer(f"mf{i}", like.shape[-1], like.dtype) for i in range(2)]
        self.turn = 0
        self.last: torch.Tensor | None = None

    @staticmethod
    def available() -> bool:
        """Whether scipy's compiled kernels (private ``scipy.sparse._sparsetools``) are there."""
        try:
            _tools()
        except ImportError:  # pragma: no cover - present in every scipy since 0.14
            return False
        return True

    def __call__(
        self, q: torch.Tensor, unary: torch.Tensor, self_weight: torch.Tensor | None
    ) -> torch.Tensor:
        """The update of (B, N, M) ``q``; ``self_weight`` (B, N, 1) to exclude the pixel."""
        f, p = self.fused, self.fused.n_points
        if q is self.last:
            lat = self.lattices[1 - self.turn]
        else:  # a new chain: splat q
            lat = scipy_accumulate(f.splat, q.reshape(p, -1), self.lattices[1 - self.turn].zero_())
        blurred = f._blur(lat)
        out, nxt = self.out[self.turn], self.lattices[self.turn].zero_()
        qf, uf, of = q.reshape(p, -1), unary.reshape(p, -1), out.view(p, -1)
        sw = None if self_weight is None else self_weight.reshape(p, 1)
        for lo in range(0, p, BLOCK_POINTS):
            hi = min(lo + BLOCK_POINTS, p)
            x = torch.neg(uf[lo:hi], out=self.x[: hi - lo])
            _rows_accumulate(f.slice, blurred, x, lo, hi)
            if sw is not None:
                x.addcmul_(sw[lo:hi], qf[lo:hi], value=-1.0)
            torch.ops.aten._softmax.out(x, -1, False, out=of[lo:hi])
            _columns_accumulate(f.splat, of[lo:hi], nxt, lo, hi)
        self.turn, self.last = 1 - self.turn, out
        return out


def _rows_accumulate(csr, x: torch.Tensor, y: torch.Tensor, lo: int, hi: int) -> None:
    """``y += csr[lo:hi] @ x`` without copying the rows (scipy's compiled kernel)."""
    tools = _tools()
    tools.csr_matvecs(hi - lo, csr.shape[1], x.shape[1], csr.indptr[lo : hi + 1], csr.indices,
                      csr.data, x.numpy().ravel(), y.numpy().ravel())  # fmt: skip


def _columns_accumulate(csc, x: torch.Tensor, y: torch.Tensor, lo: int, hi: int) -> None:
    """``y += csc[:, lo:hi] @ x`` without copying the columns (scipy's compiled kernel)."""
    tools = _tools()
    tools.csc_matvecs(csc.shape[0], hi - lo, x.shape[1], csc.indptr[lo : hi + 1], csc.indices,
                      csc.data, x.numpy().ravel(), y.numpy().ravel())  # fmt: skip


def _tools():
    from scipy.sparse import _sparsetools

    return _sparsetools
