"""Per-pixel (label-wise) updates of the dense-CRF solvers, fused into one pass each.

Layout: pixels first, labels last; every function works on (..., M) tensors row by row (one row
= one pixel's M labels), except :func:`frank_wolfe_update`, which takes (B, N, M) tensors and one
step size per image.

- :func:`meanfield_normalise`: the mean-field update ``Q = softmax(K Q - phi)`` over labels, i.e.
  the softmax of minus the mean-field energy (Krahenbuhl and Koltun, NIPS 2011, Algorithm 1).
- :func:`frank_wolfe_direction` and :func:`frank_wolfe_update`: the conditional-gradient
  direction ``r = onehot(argmin_i g_a:i) - y_a`` and the convex-combination step
  ``y + alpha r``, ``g + 2 alpha P r`` of the QP relaxation's Frank-Wolfe solver (Desmaison,
  Bunel, Kohli, Torr and Kumar, "Efficient continuous relaxations for dense CRF", ECCV 2016,
  Sec. 4).
- :func:`project_simplex`: Euclidean projection of each row onto the probability simplex (the
  CCCP step of DC-neg, ibid. Sec. 5, and the proximal LP's primal). The reference sorts (Held,
  Wolfe and Crowder 1974; Duchi et al., ICML 2008, Fig. 1; numpy's sort on CPU, ten times
  faster than ``torch.sort`` on short rows). The Triton kernel is sort-free: the
  threshold is ``theta = max_j (sum_{k: v_k >= v_j} v_k - 1) / #{k: v_k >= v_j}``, because the
  sorted-prefix values ``(css_rho - 1) / rho`` rise up to the optimal ``rho`` and fall after it;
  O(M^2) per row, so the kernel handles up to 128 labels.

Each function checks shapes and dtypes and dispatches (:mod:`kernels.backend`) to its Triton
kernel, registered as a ``torch.library`` custom op, or to ``name_reference`` in torch.
"""

import torch

from kernels import backend
from kernels.backend import cdiv, jit, next_power_of_2, tl

__all__ = [
    "SIMPLEX_KERNEL_MAX_LABELS",
    "frank_wolfe_direction",
    "frank_wolfe_direction_reference",
    "frank_wolfe_update",
    "frank_wolfe_update_reference",
    "meanfield_normalise",
    "meanfield_normalise_reference",
    "project_simplex",
    "project_simplex_reference",
    "softmax_labels",
]

SIMPLEX_KERNEL_MAX_LABELS = 128
_FLOATS = (torch.float32, torch.float64)


# ----------------------------------------------------------------------------- Triton kernels


@jit
def _meanfield_normalise_kernel(
    msg_ptr, unary_ptr, out_ptr, n_rows, M, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Rows of ``softmax(msg - unary)``, max-subtracted."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_M)
    c_ok = cols[None, :] < M
    mask = (rows[:, None] < n_rows) & c_ok
    offs = rows[:, None] * M + cols[None, :]
    x = tl.load(msg_ptr + offs, mask=mask, other=0.0)
    x -= tl.load(unary_ptr + offs, mask=mask, other=0.0)
    x = tl.where(c_ok, x, -float("inf"))
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    tl.store(out_ptr + offs, e / tl.sum(e, axis=1)[:, None], mask=mask)


@jit
def _frank_wolfe_direction_kernel(
    g_ptr, y_ptr, out_ptr, n_rows, M, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Rows of ``onehot(argmin g) - y`` (first minimum on ties, as torch.argmin)."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_M)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < M)
    offs = rows[:, None] * M + cols[None, :]
    g = tl.load(g_ptr + offs, mask=mask, other=float("inf"))
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    best = tl.argmin(g, axis=1)
    s = (cols[None, :] == best[:, None]).to(y.dtype)
    tl.store(out_ptr + offs, s - y, mask=mask)


@jit
def _frank_wolfe_update_kernel(
    y_ptr, g_ptr, r_ptr, pr_ptr, alpha_ptr, y_out_ptr, g_out_ptr, n, per_image,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Elementwise ``y + alpha r`` and ``g + 2 alpha pr`` with alpha per image (per_image = N M)."""
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    alpha = tl.load(alpha_ptr + offs // per_image, mask=mask, other=0.0).to(y.dtype)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    pr = tl.load(pr_ptr + offs, mask=mask, other=0.0)
    tl.store(y_out_ptr + offs, y + alpha * r, mask=mask)
    tl.store(g_out_ptr + offs, g + (2.0 * alpha) * pr, mask=mask)


@jit
def _project_simplex_kernel(
    v_ptr, out_ptr, n_rows, M, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Rows of ``max(v - theta, 0)``, theta by the sort-free maximum (module docstring)."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_M)
    c_ok = cols < M
    mask = (rows[:, None] < n_rows) & c_ok[None, :]
    offs = rows[:, None] * M + cols[None, :]
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    vk = v[:, None, :]  # (R, 1, M): the summed entries k
    ge = (vk >= v[:, :, None]) & c_ok[None, None, :]  # (R, M, M): v_k >= v_j
    count = tl.maximum(tl.sum(ge.to(v.dtype), axis=2), 1.0)
    total = tl.sum(tl.where(ge, vk, 0.0), axis=2)
    theta = tl.max(tl.where(c_ok[None, :], (total - 1.0) / count, -float("inf")), axis=1)
    tl.store(out_ptr + offs, tl.maximum(v - theta[:, None], 0.0), mask=mask)


def _row_grid(n_rows: int, m: int, per_row: int) -> tuple[int, int, tuple[int]]:
    """(BLOCK_R, BLOCK_M, grid) for row kernels touching ``per_row`` x BLOCK_M elements a row."""
    block_m = next_power_of_2(m)
    block_r = max(1, min(128, 4096 // (block_m * per_row)))
    return block_r, block_m, (cdiv(n_rows, block_r),)


# ----------------------------------------------------------------------------- launchers


@torch.library.custom_op("ldverify::meanfield_normalise", mutates_args=())
def _meanfield_normalise_triton(msg: torch.Tensor, unary: torch.Tensor) -> torch.Tensor:
    """Launch :func:`_meanfield_normalise_kernel` on contiguous (R, M) rows."""
    out = torch.empty_like(msg)
    n_rows, m = msg.shape
    if out.numel():
        block_r, block_m, grid = _row_grid(n_rows, m, 1)
        _meanfield_normalise_kernel[grid](
            msg, unary, out, n_rows, m, BLOCK_R=block_r, BLOCK_M=block_m
        )
    return out


@_meanfield_normalise_triton.register_fake
def _(msg, unary):
    return torch.empty_like(msg)


@torch.library.custom_op("ldverify::frank_wolfe_direction", mutates_args=())
def _frank_wolfe_direction_triton(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Launch :func:`_frank_wolfe_direction_kernel` on contiguous (R, M) rows."""
    out = torch.empty_like(y)
    n_rows, m = y.shape
    if out.numel():
        block_r, block_m, grid = _row_grid(n_rows, m, 2)
        _frank_wolfe_direction_kernel[grid](g, y, out, n_rows, m, BLOCK_R=block_r, BLOCK_M=block_m)
    return out


@_frank_wolfe_direction_triton.register_fake
def _(g, y):
    return torch.empty_like(y)


@torch.library.custom_op("ldverify::frank_wolfe_update", mutates_args=())
def _frank_wolfe_update_triton(
    y: torch.Tensor, g: torch.Tensor, r: torch.Tensor, pr: torch.Tensor, alpha: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch :func:`_frank_wolfe_update_kernel` on contiguous (B, N, M) tensors, (B,) alpha."""
    y_out, g_out = torch.empty_like(y), torch.empty_like(g)
    n = y.numel()
    if n:
        block = 1024
        _frank_wolfe_update_kernel[(cdiv(n, block),)](
            y, g, r, pr, alpha, y_out, g_out, n, n // y.shape[0], BLOCK=block
        )
    return y_out, g_out


@_frank_wolfe_update_triton.register_fake
def _(y, g, r, pr, alpha):
    return torch.empty_like(y), torch.empty_like(g)


@torch.library.custom_op("ldverify::project_simplex", mutates_args=())
def _project_simplex_triton(v: torch.Tensor) -> torch.Tensor:
    """Launch :func:`_project_simplex_kernel` on contiguous (R, M) rows."""
    out = torch.empty_like(v)
    n_rows, m = v.shape
    if out.numel():
        block_r, block_m, grid = _row_grid(n_rows, m, next_power_of_2(m))
        _project_simplex_kernel[grid](v, out, n_rows, m, BLOCK_R=block_r, BLOCK_M=block_m)
    return out


@_project_simplex_triton.register_fake
def _(v):
    return torch.empty_like(v)


# ----------------------------------------------------------------------------- references


def softmax_labels(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the label (last) dimension; for few labels it is computed on the
    label-major transpose, where torch's CPU reduction is several times faster."""
    if x.shape[-1] > 8:
        return torch.softmax(x, dim=-1)
    return torch.softmax(x.transpose(-1, -2).contiguous(), dim=-2).transpose(-1, -2).contiguous()


def meanfield_normalise_reference(msg: torch.Tensor, unary: torch.Tensor) -> torch.Tensor:
    """``softmax(msg - unary)`` over labels, (..., M) -> (..., M)."""
    return softmax_labels(msg - unary)


def frank_wolfe_direction_reference(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``onehot(argmin_i g_i) - y`` per row, (..., M) -> (..., M)."""
    return torch.nn.functional.one_hot(g.argmin(-1), g.shape[-1]).to(y.dtype) - y


def frank_wolfe_update_reference(
    y: torch.Tensor, g: torch.Tensor, r: torch.Tensor, pr: torch.Tensor, alpha: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y + alpha r, g + 2 alpha pr)`` for (B, N, M) tensors and alpha with B entries."""
    a = alpha.reshape(-1, 1, 1)
    return y + a.to(y.dtype) * r, g + (2 * a).to(y.dtype) * pr


def _threshold_numpy(v: torch.Tensor) -> torch.Tensor:
    """``theta`` (..., 1) of :func:`project_simplex_reference` for an eager CPU tensor, with
    numpy's in-place sort (short rows: about ten times faster than ``torch.sort``) and
    in-place updates (one temporary: large fresh allocations cost page faults)."""
    neg = -v.detach().contiguous().numpy()
    neg.sort(axis=-1)  # increasing -v: minus the decreasing v
    t = torch.from_numpy(neg).cumsum_(-1)  # minus the prefix sums S_k
    ind = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype)
    return t.add_(1.0).div_(ind).amin(-1, keepdim=True).neg_()  # max_k (S_k - 1) / k


def project_simplex_reference(v: torch.Tensor, *, overwrite: bool = False) -> torch.Tensor:
    """Project each row ``v[..., :]`` onto ``{y >= 0, sum y = 1}`` (sort-based, O(M log M)).

    With ``u`` the row sorted in decreasing order, the threshold is
    ``theta = max_k (sum_{i <= k} u_i - 1) / k`` (the prefix values rise up to the support size
    and fall after it: the same characterisation as the Triton kernel's), and the projection
    ``max(v - theta, 0)``. ``overwrite``: eager on CPU, write the result into ``v``.
    """
    if v.device.type == "cpu" and not torch.compiler.is_compiling() and not v.requires_grad:
        theta = _threshold_numpy(v)
        return (v.sub_(theta) if overwrite else v - theta).clamp_(min=0.0)
    m = v.shape[-1]
    css = torch.cumsum(torch.sort(v, dim=-1, descending=True).values, -1) - 1.0
    ind = torch.arange(1, m + 1, dtype=v.dtype, device=v.device)
    theta = (css / ind).amax(-1, keepdim=True)
    return torch.clamp(v - theta, min=0.0)


# ----------------------------------------------------------------------------- dispatch


def _check_rows(name: str, *tensors: torch.Tensor) -> None:
    first = tensors[0]
    if first.dim() < 1 or first.dtype not in _FLOATS:
        raise ValueError(f"{name}: expected (..., M) float32/float64, got {first.dtype}")
    for t in tensors[1:]:
        if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                f"{name}: tensors must share shape, dtype and device: {tuple(first.shape)} "
                f"{first.dtype} vs {tuple(t.shape)} {t.dtype}"
            )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(..., M) -> contiguous (R, M)."""
    return x.contiguous().reshape(-1, x.shape[-1])


def meanfield_normalise(
    msg: torch.Tensor, unary: torch.Tensor, *, use_triton: bool | None = None
) -> torch.Tensor:
    """Mean-field marginals ``softmax(msg - unary)`` over labels; (..., M) -> (..., M)."""
    _check_rows("meanfield_normalise", msg, unary)
    if not backend.use_triton(msg, use_triton):
        return meanfield_normalise_reference(msg, unary)
    return _meanfield_normalise_triton(_rows(msg), _rows(unary)).reshape(msg.shape)


def frank_wolfe_direction(
    g: torch.Tensor, y: torch.Tensor, *, use_triton: bool | None = None
) -> torch.Tensor:
    """Frank-Wolfe direction ``onehot(argmin g) - y`` per row; (..., M) -> (..., M)."""
    _check_rows("frank_wolfe_direction", g, y)
    if not backend.use_triton(y, use_triton):
        return frank_wolfe_direction_reference(g, y)
    return _frank_wolfe_direction_triton(_rows(g), _rows(y)).reshape(y.shape)


def frank_wolfe_update(
    y: torch.Tensor,
    g: torch.Tensor,
    r: torch.Tensor,
    pr: torch.Tensor,
    alpha: torch.Tensor,
    *,
    use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Frank-Wolfe step on (B, N, M) ``y``, gradient ``g``, direction ``r``, ``pr = P r``,
    step ``alpha`` with B entries (any float dtype, e.g. (B, 1, 1) float64): returns
    ``(y + alpha r, g + 2 alpha pr)`` in y's dtype."""
    _check_rows("frank_wolfe_update", y, g, r, pr)
    if y.dim() != 3 or alpha.numel() != y.shape[0] or not alpha.is_floating_point():
        raise ValueError(
            f"frank_wolfe_update: y must be (B, N, M) and alpha hold B floats, got "
            f"{tuple(y.shape)} and {tuple(alpha.shape)}"
        )
    if not backend.use_triton(y, use_triton):
        return frank_wolfe_update_reference(y, g, r, pr, alpha)
    args = [t.contiguous() for t in (y, g, r, pr)]
    return _frank_wolfe_update_triton(*args, alpha.reshape(-1).contiguous())


def project_simplex(
    v: torch.Tensor, *, use_triton: bool | None = None, overwrite: bool = False
) -> torch.Tensor:
    """Euclidean projection of each row of (..., M) ``v`` onto the probability simplex.

    The Triton kernel handles up to :data:`SIMPLEX_KERNEL_MAX_LABELS` labels; beyond that the
    automatic choice takes the reference and ``use_triton=True`` raises. ``overwrite``: ``v``
    is a temporary of the caller's, which the eager CPU reference may overwrite with the
    result (saving a large allocation); always use the returned tensor.
    """
    _check_rows("project_simplex", v)
    m = v.shape[-1]
    if use_triton is None and m > SIMPLEX_KERNEL_MAX_LABELS:
        use_triton = False
    if use_triton and m > SIMPLEX_KERNEL_MAX_LABELS:
        raise ValueError(f"project_simplex: the kernel takes <= 128 labels, got {m}")
    if not backend.use_triton(v, use_triton):
        return project_simplex_reference(v, overwrite=overwrite)
    return _project_simplex_triton(_rows(v)).reshape(v.shape)
