"""The Anderson relaxation's dual value at given multipliers and cuts, as a bound that holds in
floating point (issue 24): an independent re-evaluation, not the solvers' `anderson.evaluate`.

For any multipliers `alpha, beta >= 0` the dual value (`bounds.dual.anderson`, module
docstring; De Palma et al., ICLR 2021, Sec. 3, and JMLR 2024, eq. (5))

    d = c . b_H + sum_k alpha_k . b_k - sum_k beta_l,k . (b_k - l_k) - sum_{k, I} beta_I kappa_I
        + sum_k min_{x_k in [lb_k, ub_k]} f_k . x_k - sum_k 1 . [g_k]_+

is a lower bound in exact arithmetic. Here every quantity it rests on is bounded for its
rounding (`bounds.rounding`: `gamma_k` times the computed sum of the terms' magnitudes):

- the cut constants `kappa_I = -sum_{j in I} W_ij L_ij` and `zeta_I = b_i + sum_{j not in I}
  W_ij U_ij + sum_{j in I} W_ij L_ij` are recomputed from the box's endpoints (the solvers
  use centre and radius, which cancels), each with its own error bound;
- `g_k` enters through an upper bound (its error added), so `-[g]_+` is a lower bound;
- each coefficient `f_k` deviates from the exact one by the roundings of its sums, and the
  coefficient passed down, `W_k^T (alpha_k - beta_l,k) - sum_I (W_k . I)^T beta_I`, by those of
  the difference, of the layer's adjoint (`BoundOp.backward_error`, against the magnitudes of
  IBP intervals from the box of `x_{k-1}`) and of the cuts' sums; a deviation `delta` of a
  coefficient of `x` moves the box minimum by at most `|delta| . max|x|`;
- the box minima are `A+ l + A- u` with their error (`bounds.methods.backward.lower_over`).
Multipliers are clamped at 0 and padding cuts get 0 (any such point is a valid dual point).
Computed in float64, rounded down to the problem's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from bounds.dual.anderson.cuts import Cuts, no_cuts
from bounds.dual.anderson.evaluation import AndersonDuals
from bounds.dual.anderson.problem import AndersonProblem
from bounds.methods.backward import add_rounding, lower_over, pairing
from bounds.rounding import CONSTANT_ROUNDINGS, error_bound, lower_minus, magnitude
from bounds.types import Interval, rounded_down


def _chain_magnitudes(p: AndersonProblem, k: int) -> list[Tensor]:
    """Magnitudes `[B, *shape]` of every op's input along layer k's chain (IBP intervals from
    the box of `x_{k-1}`), and of its output last."""
    layers = p.layers
    B = p.x_lower[k].shape[0]
    iv = Interval(p.x_lower[k].reshape(B, *layers.in_shapes[k]),
                  p.x_upper[k].reshape(B, *layers.in_shapes[k]))  # fmt: skip
    sizes = [magnitude(iv)]
    for op in layers.chains[k]:
        iv = op.interval(iv)
        sizes.append(magnitude(iv))
    return sizes


def _adjoint(p: AndersonProblem, k: int, v: Tensor, sizes: list[Tensor]) -> tuple[Tensor, Tensor]:
    """`W_k^T v` `[B, S, n_in]` for `v` `[B, S, n_k]`, and a bound `[B, S]` on the effect of its
    rounding on `(W_k^T v) . x` over the box of `x_{k-1}` (each op's `backward_error`)."""
    layers = p.layers
    B, S = v.shape[:2]
    coeff = v.reshape(B, S, *layers.out_shapes[k])
    err = v.new_zeros(B, S)
    for op, size in zip(reversed(layers.chains[k]), reversed(sizes[:-1])):
        err = err + op.backward_error(coeff, [size])
        coeff = op.vjp(coeff)[0]
    return coeff.reshape(B, S, -1), err


def _abs_image(p: AndersonProblem, k: int, m: Tensor) -> Tensor:
    """`|L_n| ... |L_1| m` `[B, n_k]` along layer k's chain: at least `|W_k| m` elementwise."""
    layers = p.layers
    B = m.shape[0]
    x = m.reshape(B, *layers.in_shapes[k])
    for op in layers.chains[k]:
        x = op.abs_linear(x)
    return x.reshape(B, -1)


def _cut_constants(
    p: AndersonProblem, k: int, cuts: Cuts
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`(WI, kappa, zeta, err_kappa, err_zeta)` of layer k's cuts from the endpoints: `WI`
    `[B, S, R, n_in]`, the rest `[B, S, R]`."""
    W = p.layers.rows(k, cuts.rows)  # [B, S, R, n_in]
    low, high = p.ends(k, W)  # W_ij L_ij, W_ij U_ij: one rounding each
    inside = cuts.mask
    zero = torch.zeros_like(W)
    in_L = torch.where(inside, low, zero)
    out_U = torch.where(inside, zero, high)
    kappa = -in_L.sum(-1)
    b = p.layers.biases[k][cuts.rows]
    zeta = b + out_U.sum(-1) + in_L.sum(-1)
    n = W.shape[-1]
    err_kappa = error_bound(in_L.abs().sum(-1), n + 1 + CONSTANT_ROUNDINGS, n)
    mag_zeta = b.abs() + out_U.abs().sum(-1) + in_L.abs().sum(-1)
    err_zeta = error_bound(mag_zeta, n + 3 + CONSTANT_ROUNDINGS, n + 1)
    return W * inside.to(W.dtype), kappa, zeta, err_kappa, err_zeta


def _layer_value(
    p: AndersonProblem, k: int, cut: Cuts, multipliers: tuple[Tensor, ...], above: Tensor,
    err: Tensor, add: Callable[[Tensor], None],
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Hidden layer k's terms of the dual (module docstring) added by `add`: the box minimum
    of `f_k`, the constants, and `-[g_k]_+` from an upper bound of `g_k`; `(err, WI)`: `err`
    with their rounding bounds added, and the masked weight rows of the cuts (None without
    cuts)."""
    alpha, beta_u, beta_l, beta_c = multipliers
    B, S = p.c.shape[:2]
    rows, R = cut.rows, cut.rows.shape[2]
    lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
    lb, ub = p.x_lower[k + 1], p.x_upper[k + 1]  # x_k's box [B, n_k]
    size_x = magnitude(Interval(lb, ub)).unsqueeze(1)
    n = alpha.shape[-1]

    # f_k = above + sum_I beta_I - alpha + beta_u + beta_l, and its box minimum
    on_x = above.new_zeros(B, S, n).scatter_add(2, rows, beta_c) if R else 0.0
    f = above + on_x - alpha + beta_u + beta_l
    mag_f = above.abs() + on_x + alpha + beta_u + beta_l
    err = err + error_bound(pairing(mag_f, size_x), R + 4, n)
    add(lower_over(f, lb.unsqueeze(1), ub.unsqueeze(1)))

    # constants: alpha . b - beta_l . (b - l) - sum_I beta_I kappa_I
    b = p.layers.biases[k]
    add((alpha * b).sum(-1) - (beta_l * (b - lo)).sum(-1))
    mag = (alpha * b.abs()).sum(-1) + (beta_l * (b.abs() + lo.abs())).sum(-1)
    err = err + error_bound(mag, n + 3 + CONSTANT_ROUNDINGS, 2 * n)
    WI = None
    if R:
        WI, kappa, zeta, err_kappa, err_zeta = _cut_constants(p, k, cut)
        add(-(beta_c * kappa).sum(-1))
        err = err + error_bound((beta_c * kappa.abs()).sum(-1), R + 2, R)
        err = err + (beta_c * err_kappa).sum(-1)

    # -[g]_+ from an upper bound of g = beta_u u + beta_l l + sum_I beta_I zeta_I
    g = beta_u * up + beta_l * lo
    mag_g = beta_u * up.abs() + beta_l * lo.abs()
    if R:
        g = g.scatter_add(2, rows, beta_c * zeta)
        mag_g = mag_g.scatter_add(2, rows, beta_c * zeta.abs())
        extra = g.new_zeros(B, S, n).scatter_add(2, rows, beta_c * err_zeta)
    else:
        extra = 0.0
    g_up = g + error_bound(mag_g, R + 4, R + 2) + extra
    relu = torch.relu(g_up)
    add(-relu.sum(-1))
    err = err + error_bound(relu.sum(-1), n + 2, n)  # g_up's own addition and the sum
    return err, WI


def _coefficient_below(
    p: AndersonProblem, k: int, cut: Cuts, multipliers: tuple[Tensor, ...], WI: Tensor | None,
    err: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`(above, err)`: the coefficient of `x_{k-1}`, `W_k^T (alpha - beta_l) - sum_I (W_k .
    I)^T beta_I`, and `err` with the bounds on its rounding added."""
    alpha, _, beta_l, beta_c = multipliers
    B = p.c.shape[0]
    n = alpha.shape[-1]
    R = cut.rows.shape[2]
    sizes = _chain_magnitudes(p, k)
    below = _abs_image(p, k, sizes[0])  # >= |W_k| max|x_{k-1}|
    v = alpha - beta_l
    err = err + error_bound(pairing(alpha + beta_l, below.unsqueeze(1)), 1, n)
    above, e = _adjoint(p, k, v, sizes)
    err = err + e
    if R:
        cut_adj = torch.einsum("bsr,bsri->bsi", beta_c, WI)
        cut_mag = torch.einsum("bsr,bsri->bsi", beta_c, WI.abs())
        size_in = sizes[0].reshape(B, 1, -1)
        err = err + error_bound(pairing(cut_mag, size_in), R + 2 + CONSTANT_ROUNDINGS, R)
        err = err + error_bound(pairing(above.abs() + cut_adj.abs(), size_in), 1, 1)
        above = above - cut_adj
    return above, err


def certified_anderson_value(
    p: AndersonProblem, cuts: tuple[Cuts, ...], d: AndersonDuals
) -> Tensor:
    """A lower bound `[B, S]` of `min c . y` that holds in floating point: the Anderson dual at
    `d` with the cuts `cuts` (per hidden layer; `()` for none), certified (module docstring)."""
    dtype = p.c.dtype
    p = p.to(torch.float64) if dtype != torch.float64 else p
    d = d.to(torch.float64)
    layers, H = p.layers, p.layers.hidden
    bias = layers.biases
    if not cuts:
        cuts = tuple(no_cuts(p, k) for k in range(H))
    B, S = p.c.shape[:2]
    n_out = p.c.shape[-1]
    total = [
        (p.c * bias[H]).sum(-1),
        p.c.new_zeros(B, S),
    ]  # the running value, its additions' error

    def add(term: Tensor) -> None:
        total[0], e = add_rounding(total[0], term)
        total[1] = total[1] + e

    err = error_bound((p.c.abs() * bias[H].abs()).sum(-1), n_out + 1 + CONSTANT_ROUNDINGS, n_out)
    above, e = _adjoint(p, H, p.c, _chain_magnitudes(p, H))
    err = err + e
    for k in range(H - 1, -1, -1):
        alpha, beta_u, beta_l = (t[k].clamp(min=0) for t in (d.alpha, d.beta_u, d.beta_l))
        beta_c = torch.where(cuts[k].active, d.beta_cut[k].clamp(min=0), 0.0)
        multipliers = (alpha, beta_u, beta_l, beta_c)
        err, WI = _layer_value(p, k, cuts[k], multipliers, above, err, add)
        above, err = _coefficient_below(p, k, cuts[k], multipliers, WI, err)
    add(lower_over(above, p.x_lower[0].unsqueeze(1), p.x_upper[0].unsqueeze(1)))
    return rounded_down(lower_minus(total[0], err + total[1]), dtype)
