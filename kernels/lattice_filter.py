"""Permutohedral-lattice splat, blur and slice for a lattice whose structure is precomputed.

Adams, Baek and Davis, "Fast high-dimensional filtering using the permutohedral lattice"
(Eurographics 2010), Sec. 3-4; used for the dense CRF by Krahenbuhl and Koltun (NIPS 2011),
Sec. 4. For P points in d dimensions, every point ``p`` has the d+1 vertices ``offsets[p, r]``
of its enclosing simplex and barycentric weights ``weights[p, r]``. With R lattice rows
(the V vertices plus one always-zero padding row) and C value channels:

- splat: ``L[v, c] = sum_{p, r: offsets[p, r] = v} weights[p, r] values[p, c]``        (P, C) -> (R, C)
- blur along axes j = 0..d in order: ``L <- L + (L[n1_j] + L[n2_j]) / 2`` with the two
  neighbours ``neighbours[j, 0 / 1, v]`` (missing neighbours point to the padding row)      (R, C) -> (R, C)
- slice: ``out[p, c] = sum_r weights[p, r] L[offsets[p, r], c]``                        (R, C) -> (P, C)

(the caller scales the slice weights by ``1 / (1 + 2^-d)``). The lattice construction (hashing
of the vertex keys) stays in torch. Each operation has a Triton kernel, a launcher registered as
a ``torch.library`` custom op (so compiled code can call it), a plain-torch reference, and a
dispatching function (see :mod:`kernels.backend`). Splatting uses atomic adds, so on a GPU the
summation order of the Triton path, and its last bits, vary from run to run.
"""

import torch

from kernels import backend
from kernels.backend import cdiv, jit, next_power_of_2, tl

__all__ = [
    "lattice_blur",
    "lattice_blur_reference",
    "lattice_filter",
    "lattice_slice",
    "lattice_slice_reference",
    "lattice_splat",
    "lattice_splat_reference",
]

_FLOATS = (torch.float32, torch.float64)


# ----------------------------------------------------------------------------- Triton kernels


@jit
def _lattice_splat_kernel(
    values_ptr,
    offsets_ptr,
    weights_ptr,
    out_ptr,
    n_points,
    n_channels,
    D1: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One (BLOCK_P points, BLOCK_C channels) tile: atomically add each point's weighted values
    to its d+1 simplex vertices."""
    p = (tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = p < n_points
    mask = p_ok[:, None] & (c[None, :] < n_channels)
    v = tl.load(values_ptr + p[:, None] * n_channels + c[None, :], mask=mask, other=0.0)
    for r in tl.static_range(D1):
        vertex = tl.load(offsets_ptr + p * D1 + r, mask=p_ok, other=0).to(tl.int64)
        w = tl.load(weights_ptr + p * D1 + r, mask=p_ok, other=0.0)
        dst = out_ptr + vertex[:, None] * n_channels + c[None, :]
        tl.atomic_add(dst, w[:, None] * v, mask=mask)


@jit
def _lattice_blur_kernel(
    src_ptr,
    dst_ptr,
    neighbours_ptr,
    n_rows,
    n_channels,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Blur along one lattice axis: ``dst[v] = src[v] + (src[n1[v]] + src[n2[v]]) / 2``;
    ``neighbours_ptr`` points at that axis's (2, R) neighbour table."""
    v = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    v_ok = v < n_rows
    mask = v_ok[:, None] & (c[None, :] < n_channels)
    n1 = tl.load(neighbours_ptr + v, mask=v_ok, other=0).to(tl.int64)
    n2 = tl.load(neighbours_ptr + n_rows + v, mask=v_ok, other=0).to(tl.int64)
    x = tl.load(src_ptr + v[:, None] * n_channels + c[None, :], mask=mask, other=0.0)
    a = tl.load(src_ptr + n1[:, None] * n_channels + c[None, :], mask=mask, other=0.0)
    b = tl.load(src_ptr + n2[:, None] * n_channels + c[None, :], mask=mask, other=0.0)
    tl.store(dst_ptr + v[:, None] * n_channels + c[None, :], x + 0.5 * (a + b), mask=mask)


@jit
def _lattice_slice_kernel(
    lattice_ptr,
    offsets_ptr,
    weights_ptr,
    out_ptr,
    n_points,
    n_channels,
    D1: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One (BLOCK_P points, BLOCK_C channels) tile: barycentric interpolation of the lattice."""
    p = (tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = p < n_points
    mask = p_ok[:, None] & (c[None, :] < n_channels)
    vertex = tl.load(offsets_ptr + p * D1, mask=p_ok, other=0).to(tl.int64)
    w = tl.load(weights_ptr + p * D1, mask=p_ok, other=0.0)
    src = lattice_ptr + vertex[:, None] * n_channels + c[None, :]
    acc = w[:, None] * tl.load(src, mask=mask, other=0.0)
    for r in tl.static_range(1, D1):
        vertex = tl.load(offsets_ptr + p * D1 + r, mask=p_ok, other=0).to(tl.int64)
        w = tl.load(weights_ptr + p * D1 + r, mask=p_ok, other=0.0)
        src = lattice_ptr + vertex[:, None] * n_channels + c[None, :]
        acc += w[:, None] * tl.load(src, mask=mask, other=0.0)
    tl.store(out_ptr + p[:, None] * n_channels + c[None, :], acc, mask=mask)


def _tiles(n_channels: int) -> tuple[int, int]:
    """(rows, channels) per program: up to 64 channels, about 4096 elements per tile."""
    block_c = min(next_power_of_2(n_channels), 64)
    return max(16, min(256, 4096 // block_c)), block_c


# ----------------------------------------------------------------------------- launchers


def _launch_per_point(kernel, source, offsets, weights, out, points_by_channels) -> torch.Tensor:
    """Launch the splat or slice kernel over tiles of (points, channels); returns `out`."""
    n_points, n_channels = points_by_channels
    if n_points * n_channels == 0:
        return out
    block_p, block_c = _tiles(n_channels)
    grid = (cdiv(n_points, block_p), cdiv(n_channels, block_c))
    kernel[grid](
        source, offsets, weights, out, n_points, n_channels,
        D1=offsets.shape[1], BLOCK_P=block_p, BLOCK_C=block_c,
    )  # fmt: skip
    return out


@torch.library.custom_op("ldverify::lattice_splat", mutates_args=())
def _lattice_splat_triton(
    values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor, n_rows: int
) -> torch.Tensor:
    """Launch :func:`_lattice_splat_kernel` (contiguous, checked inputs)."""
    out = torch.zeros(n_rows, values.shape[1], dtype=values.dtype, device=values.device)
    return _launch_per_point(_lattice_splat_kernel, values, offsets, weights, out, values.shape)


@_lattice_splat_triton.register_fake
def _(values, offsets, weights, n_rows):
    return values.new_empty(n_rows, values.shape[1])


@torch.library.custom_op("ldverify::lattice_blur", mutates_args=())
def _lattice_blur_triton(lattice: torch.Tensor, neighbours: torch.Tensor) -> torch.Tensor:
    """Launch :func:`_lattice_blur_kernel` once per axis, ping-ponging two buffers."""
    n_rows, n_channels = lattice.shape
    if lattice.numel() == 0:
        return lattice.clone()
    block_r, block_c = _tiles(n_channels)
    grid = (cdiv(n_rows, block_r), cdiv(n_channels, block_c))
    src, bufs = lattice, (torch.empty_like(lattice), torch.empty_like(lattice))
    for j in range(neighbours.shape[0]):
        dst = bufs[j % 2]
        _lattice_blur_kernel[grid](
            src, dst, neighbours[j], n_rows, n_channels, BLOCK_R=block_r, BLOCK_C=block_c
        )
        src = dst
    return src if src is not lattice else lattice.clone()


@_lattice_blur_triton.register_fake
def _(lattice, neighbours):
    return torch.empty_like(lattice)


@torch.library.custom_op("ldverify::lattice_slice", mutates_args=())
def _lattice_slice_triton(
    lattice: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Launch :func:`_lattice_slice_kernel` (contiguous, checked inputs)."""
    out = lattice.new_empty(offsets.shape[0], lattice.shape[1])
    return _launch_per_point(_lattice_slice_kernel, lattice, offsets, weights, out, out.shape)


@_lattice_slice_triton.register_fake
def _(lattice, offsets, weights):
    return lattice.new_empty(offsets.shape[0], lattice.shape[1])


# ----------------------------------------------------------------------------- references


def lattice_splat_reference(
    values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor, n_rows: int
) -> torch.Tensor:
    """Splat (P, C) values with (P, d+1) vertex indices and weights onto (n_rows, C) rows."""
    out = values.new_zeros(n_rows, values.shape[1])
    for r in range(offsets.shape[1]):
        out.index_add_(0, offsets[:, r], values * weights[:, r, None])
    return out


def lattice_blur_reference(
    lattice: torch.Tensor, neighbours: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Blur (R, C) lattice values along the axes of the (d+1, 2, R) neighbour table, in order;
    the last axis writes into ``out`` (R, C) when given (it must not overlap ``lattice``)."""
    last = neighbours.shape[0] - 1
    for j in range(last + 1):
        acc = lattice.index_select(0, neighbours[j, 0])
        acc += lattice.index_select(0, neighbours[j, 1])
        if j == last and out is not None:
            lattice = torch.add(lattice, acc, alpha=0.5, out=out)
        else:
            lattice = torch.add(lattice, acc, alpha=0.5)
    return lattice


def lattice_slice_reference(
    lattice: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Interpolate (R, C) lattice values at the points: (P, d+1) indices and weights -> (P, C)."""
    out = weights[:, 0, None] * lattice.index_select(0, offsets[:, 0])
    for r in range(1, offsets.shape[1]):
        out += weights[:, r, None] * lattice.index_select(0, offsets[:, r])
    return out


# ----------------------------------------------------------------------------- dispatch


def _check_points(name: str, offsets: torch.Tensor, weights: torch.Tensor, dtype) -> None:
    if offsets.dim() != 2 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: offsets must be (P, d+1) int32/int64, got {offsets.dtype}")
    if weights.shape != offsets.shape or weights.dtype != dtype:
        raise ValueError(
            f"{name}: weights {tuple(weights.shape)} {weights.dtype} must match offsets "
            f"{tuple(offsets.shape)} and the values' dtype {dtype}"
        )


def _check_values(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in _FLOATS:
        raise ValueError(f"{name}: values must be 2-D float32/float64, got {x.dtype} {x.dim()}-D")


def lattice_splat(
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor,
    n_rows: int,
    *,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Splat (P, C) ``values`` onto (n_rows, C) lattice rows (indices must lie in [0, n_rows))."""
    _check_values("lattice_splat", values)
    _check_points("lattice_splat", offsets, weights, values.dtype)
    if offsets.shape[0] != values.shape[0]:
        raise ValueError(f"lattice_splat: {offsets.shape[0]} offsets for {values.shape[0]} points")
    args = (values.contiguous(), offsets.contiguous(), weights.contiguous(), n_rows)
    if backend.use_triton(values, use_triton):
        return _lattice_splat_triton(*args)
    return lattice_splat_reference(*args)


def lattice_blur(
    lattice: torch.Tensor, neighbours: torch.Tensor, *, use_triton: bool | None = None
) -> torch.Tensor:
    """Blur (R, C) lattice values along each axis of the (d+1, 2, R) ``neighbours`` table."""
    _check_values("lattice_blur", lattice)
    if neighbours.dim() != 3 or neighbours.shape[1:] != (2, lattice.shape[0]):
        raise ValueError(
            f"lattice_blur: neighbours must be (d+1, 2, {lattice.shape[0]}), "
            f"got {tuple(neighbours.shape)}"
        )
    if neighbours.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lattice_blur: neighbours must be int32/int64, got {neighbours.dtype}")
    if backend.use_triton(lattice, use_triton):
        return _lattice_blur_triton(lattice.contiguous(), neighbours.contiguous())
    return lattice_blur_reference(lattice, neighbours)


def lattice_slice(
    lattice: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor,
    *,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Slice (R, C) lattice values at P points with (P, d+1) indices and weights -> (P, C)."""
    _check_values("lattice_slice", lattice)
    _check_points("lattice_slice", offsets, weights, lattice.dtype)
    args = (lattice.contiguous(), offsets.contiguous(), weights.contiguous())
    if backend.use_triton(lattice, use_triton):
        return _lattice_slice_triton(*args)
    return lattice_slice_reference(*args)


def lattice_filter(
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor,
    slice_weights: torch.Tensor,
    neighbours: torch.Tensor,
    *,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Splat, blur, slice: (P, C) -> (P, C), with R = ``neighbours.shape[-1]`` lattice rows."""
    lat = lattice_splat(values, offsets, weights, neighbours.shape[-1], use_triton=use_triton)
    lat = lattice_blur(lat, neighbours, use_triton=use_triton)
    return lattice_slice(lat, offsets, slice_weights, use_triton=use_triton)
