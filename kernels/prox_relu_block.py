"""Fused elementwise passes of one proximal Frank-Wolfe block step on a ReLU network (Bunel,
De Palma, Desmaison, Dvijotham, Kohli, Torr, Kumar, "Lagrangian Decomposition for Neural
Network Verification", UAI 2020, Sec. 4.2): the dispatch between the torch reference
(`kernels.prox_relu_reference`, where the passes and their formulas are) and the Triton
kernels (`kernels.prox_relu_triton`).

Dispatch (`kernels.backend`): `name(..., use_triton=None)` runs the Triton kernels on CUDA
tensors and `name_reference` elsewhere (`use_triton=True`, or `LDVERIFY_KERNELS=triton`, runs
them on CPU tensors under `TRITON_INTERPRET=1`, set before the kernel modules are imported). The
Triton path is a torch custom op (`ldverify::name`), so `torch.compile` graphs call it whole and
trace the reference. `name_triton` are the launchers (strict: contiguous, `eta` `[B, S]`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import backend
from kernels.prox_relu_reference import (
    prox_block_update_reference,
    prox_neg_rho_reference,
    prox_relu_oracle_reference,
)
from kernels.prox_relu_triton import (
    prox_block_update_triton,
    prox_neg_rho_triton,
    prox_relu_oracle_triton,
)


@torch.library.custom_op("ldverify::prox_neg_rho", mutates_args=())
def _prox_neg_rho_op(anchor: Tensor, xhB: Tensor, xhA: Tensor, eta: Tensor) -> Tensor:
    """`prox_neg_rho_triton` as a custom op (contiguous inputs, `eta` `[B, S]`)."""
    return prox_neg_rho_triton(anchor, xhB, xhA, eta)


@_prox_neg_rho_op.register_fake
def _(anchor, xhB, xhA, eta):
    return torch.empty_like(anchor)


@torch.library.custom_op("ldverify::prox_relu_oracle", mutates_args=())
def _prox_relu_oracle_op(
    anchor_in: Tensor, xhB: Tensor, xhA_in: Tensor, eta_in: Tensor, g: Tensor,
    lower: Tensor, upper: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """`prox_relu_oracle_triton` as a custom op."""
    return prox_relu_oracle_triton(anchor_in, xhB, xhA_in, eta_in, g, lower, upper)


@_prox_relu_oracle_op.register_fake
def _(anchor_in, xhB, xhA_in, eta_in, g, lower, upper):
    lead = xhB.shape[:2]
    return torch.empty_like(xhB), torch.empty_like(xhB), xhB.new_empty(lead), xhB.new_empty(lead)


@torch.library.custom_op("ldverify::prox_block_update", mutates_args=())
def _prox_block_update_op(
    coeff_out: Tensor, xhA: Tensor, xhA_cg: Tensor, eta_out: Tensor | None,
    xhB: Tensor, xhB_cg: Tensor, num_b: Tensor, den_b: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """`prox_block_update_triton` as a custom op."""
    return prox_block_update_triton(coeff_out, xhA, xhA_cg, eta_out, xhB, xhB_cg, num_b, den_b)


@_prox_block_update_op.register_fake
def _(coeff_out, xhA, xhA_cg, eta_out, xhB, xhB_cg, num_b, den_b):
    return torch.empty_like(xhA), torch.empty_like(xhB), xhA.new_empty(xhA.shape[:2])


def _contiguous(*ts: Tensor) -> list[Tensor]:
    return [t.contiguous() for t in ts]


def _per_problem_value(v: Tensor, like: Tensor) -> Tensor:
    """`eta` (anything broadcasting to `[B, S]`) as `[B, S]`."""
    return torch.broadcast_to(v, like.shape[:2])


def prox_neg_rho(
    anchor: Tensor, xhB: Tensor, xhA: Tensor, eta: Tensor, *, use_triton: bool | None = None
) -> Tensor:
    """`-rho_j = -(anchor_j + (xhB_j - xhA_j) / eta_j)`: the coefficient of `xhA_j` in
    subproblem j (UAI 2020, Sec. 4.2). anchor, xhB, xhA: `[B, S, *shape]`; eta: `[B, S]`.
    `use_triton`: see `kernels.backend` (None: Triton on CUDA tensors)."""
    eta = _per_problem_value(eta, anchor)
    if not backend.use_triton(anchor, use_triton):
        return prox_neg_rho_reference(anchor, xhB, xhA, eta)
    return _prox_neg_rho_op(*_contiguous(anchor, xhB, xhA, eta))


def prox_relu_oracle(
    anchor_in: Tensor, xhB: Tensor, xhA_in: Tensor, eta_in: Tensor, g: Tensor,
    lower: Tensor, upper: Tensor, *, use_triton: bool | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """Pass 1 of a block step, on layer j-1: `(xhB_cg, x_cg, num_b, den_b)`.

    `rho = anchor_in + (xhB - xhA_in) / eta_in`; `(xhB_cg, x_cg)` minimises `rho . xhB +
    g . x` over the Planet relaxation on `[lower, upper]` (UAI 2020, Sec. 3); `num_b = -rho .
    (xhB_cg - xhB)`, `den_b = |xhB_cg - xhB|^2 / eta_in`. anchor_in, xhB, xhA_in, g (`W^T coeff`
    of the next affine map), outputs xhB_cg, x_cg: `[B, S, *shape]`; eta_in, num_b, den_b:
    `[B, S]`; lower, upper: `[B, *shape]`, `[B, 1, *shape]` or `[B, S, *shape]`."""
    eta_in = _per_problem_value(eta_in, xhB)
    args = (anchor_in, xhB, xhA_in, eta_in, g, lower, upper)
    if not backend.use_triton(xhB, use_triton):
        return prox_relu_oracle_reference(*args)
    return _prox_relu_oracle_op(*_contiguous(*args))


def prox_block_update(
    coeff_out: Tensor, xhA: Tensor, xhA_cg: Tensor, eta_out: Tensor | None = None, *,
    xhB: Tensor | None = None, xhB_cg: Tensor | None = None,
    num_b: Tensor | None = None, den_b: Tensor | None = None, use_triton: bool | None = None,
) -> tuple[Tensor, Tensor | None, Tensor]:  # fmt: skip
    """Pass 2 of a block step: `(xhA + gamma d_a, xhB + gamma d_b, gamma)`.

    `d_a = xhA_cg - xhA`, `d_b = xhB_cg - xhB`; `gamma = clip(num / den, 0, 1)` (den = 0: 1 if
    num > 0 else 0) with `num = -coeff_out . d_a + num_b`, `den = |d_a|^2 / eta_out + den_b`.
    coeff_out (`-rho_j`, or `c` for the last block with `eta_out=None`), xhA, xhA_cg:
    `[B, S, *shape_out]`; xhB, xhB_cg: `[B, S, *shape_in]`; eta_out, num_b, den_b, gamma:
    `[B, S]`. The first block has no B side: leave xhB, xhB_cg, num_b, den_b None (the second
    output is then None)."""
    b_side = (xhB, xhB_cg, num_b, den_b)
    if any(t is None for t in b_side) and any(t is not None for t in b_side):
        raise ValueError("give all of xhB, xhB_cg, num_b, den_b, or none of them")
    lead = xhA.shape[:2]
    if xhB is None:
        empty = xhA.new_zeros(*lead, 0)
        b_side = (empty, empty, xhA.new_zeros(lead), xhA.new_zeros(lead))
    eta = None if eta_out is None else _per_problem_value(eta_out, xhA)
    a_side = (coeff_out, xhA, xhA_cg)
    if not backend.use_triton(xhA, use_triton):
        new_a, new_b, gamma = prox_block_update_reference(*a_side, eta, *b_side)
    else:
        eta = None if eta is None else eta.contiguous()
        new_a, new_b, gamma = _prox_block_update_op(
            *_contiguous(*a_side), eta, *_contiguous(*b_side)
        )
    return new_a, (None if xhB is None else new_b), gamma
