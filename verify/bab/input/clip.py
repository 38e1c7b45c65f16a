"""Box clipping by linear bounds: the part of a box where a counterexample can lie, from a linear
lower bound of every specification row, with no further bound pass (the relaxed clipping of
Zhou, Chavez, Chen, Hanasusanto and Zhang, "Clip-and-Verify: Linear Constraint-Driven Domain
Clipping for Accelerating Neural Network Verification", NeurIPS 2025, arXiv:2512.11087, on the
output constraints; here with its rounding bounded).

The argument, for one row `i` of an unsafe polytope `P_k = {y : C_i y <= b_i, i in k}` and a
box `[l, u]`: a float64 backward pass (`bounds.methods.backward.backward_linear`, its rounding
accounted for) gives a functional `a_i` and a bound `r_i` with

    C_i f(x) - b_i >= a_i . x + d_i   and   r_i <= d_i + min_box a_i . x      (all x in the box)

in exact arithmetic on the computed `a_i`. A counterexample `x` in `P_k` has `a_i . x + d_i <=
0`, so `a_i . x <= min_box a_i . x - r_i`. The minimum is separable, `sum_j t_ij` with `t_ij =
min(a_ij l_j, a_ij u_j)`, and every other term of `a_i . x` is at least its own `t_il`, so per
dimension `a_ij x_j <= t_ij - r_i`:

    a_ij > 0:  x_j <= l_j + (-r_i) / a_ij;        a_ij < 0:  x_j >= u_j - (-r_i) / |a_ij|.

The minimum cancels, so only one division and one addition are rounded per bound, each rounded
outward by one `nextafter` step (round to nearest errs by at most half an ulp). The box of
`P_k` is the intersection of its rows' clips; a polytope whose box is empty holds no
counterexample; the clipped box is the hull of the polytopes' boxes (empty: the box is proven
safe).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from bounds.rounding import down, up


def row_clips(lower: Tensor, upper: Tensor, A: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """Per row the box its linear bound leaves for a counterexample: `(low, high)` `[N, m,
    n_in]` (module docstring; float64, rounded outward; +-inf where a row says nothing of a
    dimension). `lower`, `upper` `[N, n_in]` the boxes, `A [N, m, n_in]` the rows' input
    functionals, `r [N, m]` their bounds (lower bounds of `C y - b`, -inf: unknown)."""
    slack = (-r).unsqueeze(2)  # >= 0 on rows the bound leaves open
    mag = A.abs()
    reach = up(slack / mag)  # 0 / 0 and x / 0 are masked below
    said = (A != 0) & ~torch.isnan(reach)
    high = torch.where(said & (A > 0), up(lower.unsqueeze(1) + reach), math.inf)
    low = torch.where(said & (A < 0), down(upper.unsqueeze(1) - reach), -math.inf)
    return low, high


def clip_boxes(
    lower: Tensor, upper: Tensor, A: Tensor, r: Tensor, owner: Tensor, n_polytopes: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The boxes clipped to where a counterexample can lie: `(lower, upper [N, n_in],
    empty [N])`, float64; `empty`: no polytope can hold one (the box is safe; its clipped box is
    then the input box, unchanged). `lower`, `upper [N, n_in]` float64 boxes; `A [N, m,
    n_in]`, `r [N, m]` a sound float64 linear bound of each row of `C y - b` on its box (module
    docstring); `owner [m]` each row's polytope, of `n_polytopes`."""
    low, high = row_clips(lower, upper, A, r)
    n, m, n_in = A.shape
    index = owner.view(1, m, 1).expand(n, m, n_in)
    poly_low = lower.unsqueeze(1).expand(n, n_polytopes, n_in).clone()
    poly_high = upper.unsqueeze(1).expand(n, n_polytopes, n_in).clone()
    poly_low = poly_low.scatter_reduce(1, index, low, reduce="amax", include_self=True)
    poly_high = poly_high.scatter_reduce(1, index, high, reduce="amin", include_self=True)
    # a row proven positive (r > 0) excludes its polytope even where its functional is 0
    excluded = torch.zeros(n, n_polytopes, dtype=torch.bool, device=A.device)
    excluded = excluded.scatter_reduce(
        1, owner.view(1, m).expand(n, m), r > 0, reduce="amax", include_self=True
    )
    empty_poly = (poly_low > poly_high).any(2) | excluded  # [N, P]
    keep = ~empty_poly.unsqueeze(2)
    new_low = torch.where(keep, poly_low, math.inf).amin(1)
    new_high = torch.where(keep, poly_high, -math.inf).amax(1)
    empty = empty_poly.all(1)
    new_low = torch.where(empty.unsqueeze(1), lower, new_low)
    new_high = torch.where(empty.unsqueeze(1), upper, new_high)
    return new_low, new_high, empty
