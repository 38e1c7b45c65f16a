"""The Triton kernels of the proximal block step and their launchers (`name_triton`: strict,
contiguous inputs, `eta` `[B, S]`); the passes, their formulas and shapes are in
`kernels.prox_relu_reference`, the dispatch in `kernels.prox_relu_block`.

The kernels match the reference element by element (IEEE division, no FMA contraction); the
sums differ from torch's only in summation order.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels import backend
from kernels.backend import cdiv, jit, next_power_of_2, tl

BLOCK_MIN = 128
BLOCK_MAX = 1024
CHUNK_BLOCKS = 8  # blocks per program in the reducing kernels: one partial sum per chunk
_FLOATS = (torch.float32, torch.float64)


# ----------------------------------------------------------------------------------- Triton


@jit
def _div(a, b):
    """Correctly rounded `a / b`: Triton's float32 `/` is approximate on NVIDIA GPUs."""
    if a.dtype == tl.float32:
        return tl.math.div_rn(a, b)
    else:
        return a / b


@jit
def _relu_argmin(a, g, lower, upper):
    """`(xh, x)` minimising `a xh + g x` over the Planet set; ties as `ReluRelaxation.argmin`."""
    zero = tl.zeros_like(a)
    passing = lower >= 0
    blocking = (upper <= 0) & ~passing
    value_l = a * lower + g * tl.maximum(lower, 0.0)
    value_u = a * upper + g * tl.maximum(upper, 0.0)
    use_l = (value_l <= 0.0) & (value_l <= value_u)
    use_u = ~use_l & (value_u < 0.0)
    xh = tl.where(use_l, lower, tl.where(use_u, upper, zero))
    stable = passing | blocking
    xh = tl.where(stable, tl.where(value_l <= value_u, lower, upper), xh)
    x = tl.where(blocking, zero, tl.where(passing, xh, tl.maximum(xh, 0.0)))
    return xh, x


@jit
def _prox_neg_rho_kernel(anchor_ptr, xhb_ptr, xha_ptr, eta_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Grid (problems, blocks): `out = -(anchor + (xhB - xhA) / eta)` on one block of a row."""
    p = tl.program_id(0)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    offs = p.to(tl.int64) * n + idx
    eta = tl.load(eta_ptr + p)
    anchor = tl.load(anchor_ptr + offs, mask=mask)
    diff = tl.load(xhb_ptr + offs, mask=mask) - tl.load(xha_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, -(anchor + _div(diff, eta)), mask=mask)


@jit
def _prox_relu_oracle_kernel(
    anchor_ptr, xhb_ptr, xha_ptr, eta_ptr, g_ptr, lower_ptr, upper_ptr,
    xhb_cg_ptr, x_cg_ptr, num_ptr, den_ptr,
    n, specs, lu_batch_stride, lu_spec_stride,
    BLOCK: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Grid (problems, chunks): the oracle on one chunk of a row and its partial sums
    `num = -rho . d_b`, `den = |d_b|^2 / eta`, stored at `[problem, chunk]`."""
    p = tl.program_id(0)
    k = tl.program_id(1)
    row = p.to(tl.int64) * n
    lu_row = (p // specs).to(tl.int64) * lu_batch_stride + (p % specs).to(tl.int64) * lu_spec_stride
    eta = tl.load(eta_ptr + p)
    acc_num = tl.zeros([BLOCK], dtype=eta_ptr.dtype.element_ty)
    acc_den = tl.zeros([BLOCK], dtype=eta_ptr.dtype.element_ty)
    start = k * CHUNK
    for first in range(start, tl.minimum(start + CHUNK, n), BLOCK):
        idx = first + tl.arange(0, BLOCK)
        mask = idx < n
        xhb = tl.load(xhb_ptr + row + idx, mask=mask, other=0.0)
        diff = xhb - tl.load(xha_ptr + row + idx, mask=mask, other=0.0)
        rho = tl.load(anchor_ptr + row + idx, mask=mask, other=0.0) + _div(diff, eta)
        g = tl.load(g_ptr + row + idx, mask=mask, other=0.0)
        lower = tl.load(lower_ptr + lu_row + idx, mask=mask, other=0.0)
        upper = tl.load(upper_ptr + lu_row + idx, mask=mask, other=0.0)
        xhb_cg, x_cg = _relu_argmin(rho, g, lower, upper)
        tl.store(xhb_cg_ptr + row + idx, xhb_cg, mask=mask)
        tl.store(x_cg_ptr + row + idx, x_cg, mask=mask)
        d_b = tl.where(mask, xhb_cg - xhb, 0.0)
        acc_num += rho * d_b
        acc_den += d_b * d_b
    n_chunks = tl.num_programs(1)
    tl.store(num_ptr + p * n_chunks + k, -tl.sum(acc_num, 0))
    tl.store(den_ptr + p * n_chunks + k, _div(tl.sum(acc_den, 0), eta))


@jit
def _prox_update_sums_kernel(
    coeff_ptr, xha_ptr, xha_cg_ptr, num_ptr, den_ptr, n, CHUNK: tl.constexpr, BLOCK: tl.constexpr
):
    """Grid (problems, chunks): partial `-coeff . d_a` and `|d_a|^2` at `[problem, chunk]`."""
    p = tl.program_id(0)
    k = tl.program_id(1)
    row = p.to(tl.int64) * n
    acc_num = tl.zeros([BLOCK], dtype=coeff_ptr.dtype.element_ty)
    acc_den = tl.zeros([BLOCK], dtype=coeff_ptr.dtype.element_ty)
    start = k * CHUNK
    for first in range(start, tl.minimum(start + CHUNK, n), BLOCK):
        idx = first + tl.arange(0, BLOCK)
        mask = idx < n
        xha = tl.load(xha_ptr + row + idx, mask=mask, other=0.0)
        d_a = tl.load(xha_cg_ptr + row + idx, mask=mask, other=0.0) - xha
        acc_num += tl.load(coeff_ptr + row + idx, mask=mask, other=0.0) * d_a
        acc_den += d_a * d_a
    n_chunks = tl.num_programs(1)
    tl.store(num_ptr + p * n_chunks + k, -tl.sum(acc_num, 0))
    tl.store(den_ptr + p * n_chunks + k, tl.sum(acc_den, 0))


@jit
def _step_size(num, den):
    """Exact line search clipped to [0, 1]; `den = 0`: 1 if `num > 0` else 0."""
    safe = tl.where(den > 0, den, 1.0)
    step = tl.where(den > 0, _div(num, safe), tl.where(num > 0, 1.0, 0.0))
    return tl.minimum(tl.maximum(step, 0.0), 1.0)


@jit
def _convex_combination(
    old_ptr, new_ptr, out_ptr, gamma, row, start, n, CHUNK: tl.constexpr, BLOCK: tl.constexpr
):
    """`out = old + gamma (new - old)` on `[start, min(start + CHUNK, n))` of a row."""
    for first in range(start, tl.minimum(start + CHUNK, n), BLOCK):
        idx = first + tl.arange(0, BLOCK)
        mask = idx < n
        old = tl.load(old_ptr + row + idx, mask=mask)
        new = tl.load(new_ptr + row + idx, mask=mask)
        tl.store(out_ptr + row + idx, old + gamma * (new - old), mask=mask)


@jit
def _prox_block_update_kernel(
    xha_ptr, xha_cg_ptr, xhb_ptr, xhb_cg_ptr, eta_ptr, num_a_ptr, den_a_ptr, num_b_ptr, den_b_ptr,
    xha_out_ptr, xhb_out_ptr, gamma_ptr,
    n_a, n_b, chunks_a,
    HAS_ETA: tl.constexpr, CHUNKS_POW2: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid (problems, chunks): gamma from the A-side partial sums and the B-side totals, then
    the convex combinations on chunk k of both rows (either may be shorter)."""
    p = tl.program_id(0)
    k = tl.program_id(1)
    parts = tl.arange(0, CHUNKS_POW2)
    in_row = parts < chunks_a
    num = tl.sum(tl.load(num_a_ptr + p * chunks_a + parts, mask=in_row, other=0.0), 0)
    den = tl.sum(tl.load(den_a_ptr + p * chunks_a + parts, mask=in_row, other=0.0), 0)
    if HAS_ETA:
        den = _div(den, tl.load(eta_ptr + p))
    else:
        den = tl.zeros_like(num)  # the last block: no proximal term on the A side
    gamma = _step_size(num + tl.load(num_b_ptr + p), den + tl.load(den_b_ptr + p))
    if k == 0:
        tl.store(gamma_ptr + p, gamma)
    start = k * CHUNK
    row_a = p.to(tl.int64) * n_a
    row_b = p.to(tl.int64) * n_b
    _convex_combination(xha_ptr, xha_cg_ptr, xha_out_ptr, gamma, row_a, start, n_a, CHUNK, BLOCK)
    _convex_combination(xhb_ptr, xhb_cg_ptr, xhb_out_ptr, gamma, row_b, start, n_b, CHUNK, BLOCK)


# ---------------------------------------------------------------------------------- launchers


def _geometry(t: Tensor, name: str) -> tuple[int, int, int]:
    """`(B, S, N)` of a `[B, S, *shape]` tensor, N the neurons per problem."""
    if t.dim() < 2:
        raise ValueError(f"{name} must be [B, S, *shape], got shape {tuple(t.shape)}")
    return t.shape[0], t.shape[1], math.prod(t.shape[2:])


def _check(name: str, t: Tensor, shape: torch.Size | tuple[int, ...], like: Tensor) -> None:
    """Shape, dtype, device and contiguity that the kernels assume."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.dtype not in _FLOATS or t.dtype != like.dtype:
        raise TypeError(f"{name} must be float32 or float64 like the others, got {t.dtype}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, the others on {like.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _bound_strides(lower: Tensor, like: Tensor) -> tuple[int, int]:
    """`(batch stride, spec stride)` of the rows of `lower`/`upper` (spec stride 0: shared)."""
    batch, specs, n = _geometry(like, "xhB")
    neurons = tuple(like.shape[2:])
    if lower.dim() == like.dim() - 1 and tuple(lower.shape) == (batch, *neurons):
        return n, 0
    if lower.dim() == like.dim() and tuple(lower.shape[2:]) == neurons and lower.shape[0] == batch:
        if lower.shape[1] == 1:
            return n, 0
        if lower.shape[1] == specs:
            return specs * n, n
    raise ValueError(
        f"lower/upper must be [B, *shape], [B, 1, *shape] or [B, S, *shape] for xhB of shape "
        f"{tuple(like.shape)}, got {tuple(lower.shape)}"
    )


def _require_triton(t: Tensor) -> None:
    """Raise a clear error where the kernels cannot launch (no Triton; CPU without the
    interpreter)."""
    backend.use_triton(t, True)


def _tiles(n: int, block: int | None, chunk: int | None) -> tuple[int, int]:
    """`(block, chunk)`: neurons per vector operation (a power of 2) and per program."""
    block = min(BLOCK_MAX, max(BLOCK_MIN, next_power_of_2(max(n, 1)))) if block is None else block
    chunk = block * CHUNK_BLOCKS if chunk is None else chunk
    if block != next_power_of_2(block) or chunk % block:
        raise ValueError(f"block must be a power of 2 dividing chunk, got {block} and {chunk}")
    return block, chunk


def prox_neg_rho_triton(
    anchor: Tensor, xhB: Tensor, xhA: Tensor, eta: Tensor, *, block: int | None = None
) -> Tensor:
    """Launcher of `_prox_neg_rho_kernel`; arguments as `prox_neg_rho`, `eta` exactly `[B, S]`."""
    batch, specs, n = _geometry(anchor, "anchor")
    for name, t in (("anchor", anchor), ("xhB", xhB), ("xhA", xhA)):
        _check(name, t, anchor.shape, anchor)
    _check("eta", eta, (batch, specs), anchor)
    out = torch.empty_like(anchor)
    _require_triton(anchor)
    block, _ = _tiles(n, block, None)
    if out.numel():
        grid = (batch * specs, cdiv(n, block))
        _prox_neg_rho_kernel[grid](anchor, xhB, xhA, eta, out, n, BLOCK=block, enable_fp_fusion=False)  # fmt: skip
    return out


def prox_relu_oracle_triton(
    anchor_in: Tensor, xhB: Tensor, xhA_in: Tensor, eta_in: Tensor, g: Tensor,
    lower: Tensor, upper: Tensor, *, block: int | None = None, chunk: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Launcher of `_prox_relu_oracle_kernel`; arguments as `prox_relu_oracle`, `eta_in`
    exactly `[B, S]`; `chunk` (a multiple of `block`) is the neurons per program."""
    batch, specs, n = _geometry(xhB, "xhB")
    for name, t in (("anchor_in", anchor_in), ("xhB", xhB), ("xhA_in", xhA_in), ("g", g)):
        _check(name, t, xhB.shape, xhB)
    _check("eta_in", eta_in, (batch, specs), xhB)
    _check("upper", upper, lower.shape, xhB)
    _check("lower", lower, lower.shape, xhB)
    lu_batch_stride, lu_spec_stride = _bound_strides(lower, xhB)
    _require_triton(xhB)
    block, chunk = _tiles(n, block, chunk)
    chunks = max(1, cdiv(n, chunk))
    xhB_cg, x_cg = torch.empty_like(xhB), torch.empty_like(xhB)
    num = xhB.new_empty(batch, specs, chunks)
    den = xhB.new_empty(batch, specs, chunks)
    if batch * specs:
        _prox_relu_oracle_kernel[(batch * specs, chunks)](
            anchor_in, xhB, xhA_in, eta_in, g, lower, upper, xhB_cg, x_cg, num, den,
            n, specs, lu_batch_stride, lu_spec_stride,
            BLOCK=block, CHUNK=chunk, enable_fp_fusion=False,
        )  # fmt: skip
    if chunks == 1:  # no extra launch for the usual layer sizes
        return xhB_cg, x_cg, num[..., 0], den[..., 0]
    return xhB_cg, x_cg, num.sum(-1), den.sum(-1)


def prox_block_update_triton(
    coeff_out: Tensor, xhA: Tensor, xhA_cg: Tensor, eta_out: Tensor | None,
    xhB: Tensor, xhB_cg: Tensor, num_b: Tensor, den_b: Tensor,
    *, block: int | None = None, chunk: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Launchers of `_prox_update_sums_kernel` then `_prox_block_update_kernel`; arguments as
    `prox_block_update` with the B side always given (`[B, S, 0]` and zero sums for block 0)."""
    batch, specs, n_a = _geometry(xhA, "xhA")
    _, _, n_b = _geometry(xhB, "xhB")
    for name, t in (("coeff_out", coeff_out), ("xhA", xhA), ("xhA_cg", xhA_cg)):
        _check(name, t, xhA.shape, xhA)
    _check("xhB", xhB, (batch, specs, *xhB.shape[2:]), xhA)
    _check("xhB_cg", xhB_cg, xhB.shape, xhA)
    for name, t in (("num_b", num_b), ("den_b", den_b), ("eta_out", eta_out)):
        if t is not None:
            _check(name, t, (batch, specs), xhA)
    _require_triton(xhA)
    block, chunk = _tiles(max(n_a, n_b), block, chunk)
    chunks_a = max(1, cdiv(n_a, chunk))
    num_a = xhA.new_empty(batch, specs, chunks_a)
    den_a = xhA.new_empty(batch, specs, chunks_a)
    outs = (torch.empty_like(xhA), torch.empty_like(xhB), xhA.new_empty(batch, specs))
    if batch * specs:
        _prox_update_sums_kernel[(batch * specs, chunks_a)](
            coeff_out, xhA, xhA_cg, num_a, den_a, n_a, CHUNK=chunk, BLOCK=block, enable_fp_fusion=False
        )  # fmt: skip
        grid = (batch * specs, max(chunks_a, cdiv(n_b, chunk)))
        _prox_block_update_kernel[grid](
            xhA, xhA_cg, xhB, xhB_cg, xhA if eta_out is None else eta_out,
            num_a, den_a, num_b, den_b, *outs, n_a, n_b, chunks_a,
            HAS_ETA=eta_out is not None, CHUNKS_POW2=next_power_of_2(chunks_a),
            CHUNK=chunk, BLOCK=block, enable_fp_fusion=False,
        )  # fmt: skip
    return outs
