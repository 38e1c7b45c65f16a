"""Fused elementwise passes of one proximal Frank-Wolfe block step on a ReLU network.

Bunel, De Palma, Desmaison, Dvijotham, Kohli, Torr, Kumar, "Lagrangian Decomposition for Neural
Network Verification", UAI 2020, Sec. 4.2 (the proximal method; the step is
`bounds.dual.proximal._block_step`). With `rho_i = anchor_i + (xhB_i - xhA_i) / eta_i`, one step
on a middle block j (1 <= j <= n-2) is

    coeff = -rho_j                                              prox_neg_rho      (layer j)
    g = W_{j+1}^T coeff                                         affine adjoint    (torch)
    (xhB_cg, x_cg) = argmin over the Planet set of rho_{j-1} . xhB + g . x
    num_b = -rho_{j-1} . d_b,  den_b = |d_b|^2 / eta_{j-1}      prox_relu_oracle  (layer j-1)
    xhA_cg = W_{j+1} x_cg + b                                   affine map        (torch)
    num = -coeff . d_a + num_b,  den = |d_a|^2 / eta_j + den_b
    gamma = clip(num / den, 0, 1)  (den = 0: 1 if num > 0 else 0)
    xhA_j += gamma d_a,  xhB_{j-1} += gamma d_b                 prox_block_update

with `d_a = xhA_cg - xhA_j`, `d_b = xhB_cg - xhB_{j-1}`. The first block (j = 0) has no B side:
its oracle is the input box's (torch) and `prox_block_update` gets no `xhB`. The last block has
`coeff = c`, the objective, and no proximal term on its A side: `eta_out=None`. `-rho_j` lives on
layer j and the oracle on layer j-1, so they are two kernels; the update needs the whole of
`num` and `den` before it moves any neuron, so it is two launches (A-side sums, then update).

Shapes: `[B, S, *shape]`, one problem per (batch, spec); the neuron dimensions are flattened and
summed per problem; `eta` is `[B, S]` (anything that broadcasts to it); `lower`/`upper` are
`[B, *shape]` (shared by the specs, never materialised per spec), `[B, 1, *shape]` or
`[B, S, *shape]`. float32 or float64; no autograd.

This module is the torch reference of those passes (the formula); `kernels.prox_relu_triton`
holds the Triton kernels and their launchers, `kernels.prox_relu_block` the dispatch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _sum(t: Tensor) -> Tensor:
    """Sum per problem: `[B, S, *shape]` -> `[B, S]`."""
    return t.flatten(2).sum(-1)


def _per_problem(v: Tensor, like: Tensor) -> Tensor:
    """`[B, S]` -> `[B, S, 1, ...]` to broadcast over the neurons of `like`."""
    return v.reshape(*v.shape, *([1] * (like.dim() - 2)))


def _shared_bounds(bound: Tensor, like: Tensor) -> Tensor:
    """`[B, *shape]` -> `[B, 1, *shape]` (a view) to broadcast over the specs."""
    return bound.unsqueeze(1) if bound.dim() == like.dim() - 1 else bound


def relu_argmin_reference(
    coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
) -> tuple[Tensor, Tensor]:
    """Minimiser `(xh, x)` of `coeff_pre xh + coeff_post x` over the Planet set of
    `x = relu(xh)`, `xh` in `[lower, upper]`: the segment's ends (stable) or the vertices
    `(l, 0)`, `(0, 0)`, `(u, u)` of the triangle (ambiguous), ties as `ReluRelaxation.argmin`
    (UAI 2020, Sec. 3, the subproblem oracle). All arguments broadcast together."""
    passing = lower >= 0
    blocking = (upper <= 0) & ~passing
    zero = torch.zeros_like(lower)
    value_l = coeff_pre * lower + coeff_post * torch.relu(lower)
    value_u = coeff_pre * upper + coeff_post * torch.relu(upper)
    use_l = (value_l <= 0) & (value_l <= value_u)
    use_u = ~use_l & (value_u < 0)
    xh = torch.where(use_l, lower, torch.where(use_u, upper, zero))
    xh = torch.where(passing | blocking, torch.where(value_l <= value_u, lower, upper), xh)
    x = torch.where(blocking, zero, torch.where(passing, xh, torch.relu(xh)))
    return xh, x


def prox_neg_rho_reference(anchor: Tensor, xhB: Tensor, xhA: Tensor, eta: Tensor) -> Tensor:
    """`-rho = -(anchor + (xhB - xhA) / eta)`, `[B, S, *shape]`; eta `[B, S]`."""
    return -(anchor + (xhB - xhA) / _per_problem(eta, anchor))


def prox_relu_oracle_reference(
    anchor_in: Tensor, xhB: Tensor, xhA_in: Tensor, eta_in: Tensor, g: Tensor,
    lower: Tensor, upper: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """`(xhB_cg, x_cg, num_b, den_b)`: the ReLU oracle under `rho = anchor_in + (xhB -
    xhA_in) / eta_in` and the B side of the line search, `-rho . d_b` and `|d_b|^2 / eta_in`
    per problem `[B, S]`, with `d_b = xhB_cg - xhB`."""
    rho = anchor_in + (xhB - xhA_in) / _per_problem(eta_in, xhB)
    xhB_cg, x_cg = relu_argmin_reference(
        rho, g, _shared_bounds(lower, xhB), _shared_bounds(upper, xhB)
    )
    d_b = xhB_cg - xhB
    return xhB_cg, x_cg, -_sum(rho * d_b), _sum(d_b * d_b) / eta_in


def prox_step_size_reference(num: Tensor, den: Tensor) -> Tensor:
    """The exact line search `num / den` clipped to [0, 1]; a linear objective (`den = 0`)
    takes the full step when it descends (`num > 0`)."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    step = torch.where(den > 0, num / safe, (num > 0).to(num.dtype))
    return step.clamp(0.0, 1.0)


def prox_block_update_reference(
    coeff_out: Tensor, xhA: Tensor, xhA_cg: Tensor, eta_out: Tensor | None,
    xhB: Tensor, xhB_cg: Tensor, num_b: Tensor, den_b: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """`(xhA + gamma d_a, xhB + gamma d_b, gamma)` with `gamma` the clipped exact step for
    `num = -coeff_out . d_a + num_b`, `den = |d_a|^2 / eta_out + den_b` (no A term when
    `eta_out` is None)."""
    d_a = xhA_cg - xhA
    num = -_sum(coeff_out * d_a) + num_b
    den = torch.zeros_like(num) if eta_out is None else _sum(d_a * d_a) / eta_out
    gamma = prox_step_size_reference(num, den + den_b)
    d_b = xhB_cg - xhB
    return xhA + _per_problem(gamma, d_a) * d_a, xhB + _per_problem(gamma, d_b) * d_b, gamma
