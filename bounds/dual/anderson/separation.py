"""The separation oracle of the Anderson relaxation (Anderson et al. 2020, Prop. 3; De
Palma et al. 2021, Sec. 3.1; package docstring: `bounds.dual.anderson`): the most violated
constraint `A_I` per ambiguous neuron at a point, and the choice of the cuts to add."""

from __future__ import annotations

import torch
from torch import Tensor

from bounds.dual.anderson.problem import AndersonProblem, box_at


def most_violated(
    p: AndersonProblem, k: int, x_in: Tensor, x_out: Tensor, z: Tensor, index: Tensor,
    chunk: int = 1 << 22, weights: Tensor | None = None, support: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The separation oracle (Anderson et al. 2020, Prop. 3; De Palma et al. 2021, Sec. 3.1)
    for the neurons `index` `[B, R]` of hidden layer k at the point `(x_in [B, S, n_in],
    x_out, z [B, S, n_k])`: the subset `I` with the least right-hand side, `j in I` iff
    `W_ij (L_ij (1 - z) + U_ij z - x_j) >= 0`, and its violation `x - b z - sum_j min(W_ij
    (x_j - L_ij (1 - z)), W_ij U_ij z)`. Returns `(violation [B, S, R], mask [B, S, R, n_in])`,
    computed in chunks of neurons of about `chunk` elements. `weights` `[B, R, n_in]`: the rows
    `W_k[index]` when the caller has them (`candidate_rows`). With `support` `[B, R, F]`
    (`row_support` of the rows; `weights` then their values there, `[B, R, F]`) the work is
    over each row's support only and `mask` is `[B, S, R, F]`, on the support."""
    B, S = x_out.shape[:2]
    n_in = x_in.shape[-1]
    b = p.layers.biases[k]
    width = n_in if support is None else support.shape[-1]
    step = max(1, chunk // max(1, B * S * width))
    violations, masks = [], []
    for start in range(0, index.shape[1], step):
        idx = index[:, start : start + step]  # [B, r]
        W = p.layers.rows(k, idx) if weights is None else weights[:, start : start + step]
        at = idx.unsqueeze(1).expand(B, S, idx.shape[1])
        zz = torch.gather(z, 2, at).unsqueeze(-1)  # [B, S, r, 1]
        if support is None:
            WL, WU = p.ends(k, W)
            x = x_in.unsqueeze(2)
        else:
            part = support[:, start : start + step]  # [B, r, F]
            lo, up = box_at(p, k, part)
            positive = W > 0
            WL, WU = W * torch.where(positive, lo, up), W * torch.where(positive, up, lo)
            flat = part.reshape(B, 1, -1).expand(B, S, -1)
            x = torch.gather(x_in, 2, flat).reshape(B, S, *part.shape[1:])
        inside = W.unsqueeze(1) * x - WL.unsqueeze(1) * (1 - zz)
        outside = WU.unsqueeze(1) * zz
        rhs = b[idx].unsqueeze(1) * zz.squeeze(-1) + torch.minimum(inside, outside).sum(-1)
        violations.append(torch.gather(x_out, 2, at) - rhs)
        masks.append(inside <= outside)
    if not violations:
        return x_out.new_zeros(B, S, 0), torch.zeros(B, S, 0, width, dtype=torch.bool)
    return torch.cat(violations, 2), torch.cat(masks, 2)


def candidates(p: AndersonProblem, k: int) -> Tensor:
    """The ambiguous neurons of hidden layer k, `[B, R]` indices (the count of the batch
    element with most, the others padded with stable neurons): the only ones the oracle
    examines. Fixed for a problem, so a solver computes them once."""
    ambiguous = (p.pre_lower[k] < 0) & (p.pre_upper[k] > 0)
    count = int(ambiguous.sum(-1).max())
    order = torch.argsort(ambiguous.to(torch.int8), dim=-1, descending=True, stable=True)
    return order[:, :count]


def candidate_rows(p: AndersonProblem, k: int, index: Tensor) -> Tensor:
    """`W_k[index]` `[B, R, n_in]` for the candidates `index` `[B, R]` (`candidates`): fixed
    for a problem, so a solver computes them once and hands them to the oracle."""
    return p.layers.rows(k, index)


def select_cuts(
    p: AndersonProblem, k: int, x_in: Tensor, x_out: Tensor, z: Tensor, index: Tensor,
    restrict: int | None, tolerance: float, weights: Tensor | None = None,
    support: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """One new cut per ambiguous neuron of layer k (`index`: `candidates(p, k)`) at the
    point, the `restrict` most violated per problem when set: `(rows, mask, active)`, active
    where the cut's violation exceeds both Big-M constraints' by more than `tolerance`
    (relative to the neuron's pre-activation range). `weights`: `candidate_rows(p, k,
    index)` when the caller has them (with `support`: their `row_support`)."""
    rows, mask, active, _ = select_cuts_at(
        p, k, x_in, x_out, z, index, restrict, tolerance, weights, support
    )  # fmt: skip
    return rows, mask, active


def select_cuts_at(
    p: AndersonProblem, k: int, x_in: Tensor, x_out: Tensor, z: Tensor, index: Tensor,
    restrict: int | None, tolerance: float, weights: Tensor | None = None,
    support: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """`select_cuts` and the positions `[B, S, R']` of the chosen neurons in `index` (to take
    their rows from `weights`)."""
    lo, up = p.pre_lower[k], p.pre_upper[k]
    B, S = x_out.shape[:2]
    count = index.shape[1]
    if count == 0:
        empty = torch.zeros(B, S, 0, dtype=torch.long, device=lo.device)
        mask = torch.zeros(B, S, 0, x_in.shape[-1], dtype=torch.bool, device=lo.device)
        return empty, mask, empty.bool(), empty
    l, u = torch.gather(lo, 1, index).unsqueeze(1), torch.gather(up, 1, index).unsqueeze(1)
    real = (l < 0) & (u > 0)  # [B, 1, count]: False on the padding
    violation, mask = most_violated(p, k, x_in, x_out, z, index, weights=weights, support=support)
    at = index.unsqueeze(1).expand(B, S, count)
    xh = torch.gather(p.layers.forward(k, x_in), 2, at)
    zz, xx = torch.gather(z, 2, at), torch.gather(x_out, 2, at)
    big_m = torch.maximum(xx - u * zz, xx - xh + l * (1 - zz)).clamp_min(0)
    gain = (violation - big_m) / (u - l).clamp_min(1e-12)
    score = torch.where(real, gain, -torch.inf)
    r = count if restrict is None else min(restrict, count)
    top, pick = score.topk(r, dim=-1)
    rows = torch.gather(at, 2, pick)
    picked = torch.gather(mask, 2, pick.unsqueeze(-1).expand(B, S, r, mask.shape[-1]))
    if support is not None:  # back to masks over all inputs (pads, weight 0, left out)
        F = support.shape[-1]
        where = torch.gather(support, 1, pick.reshape(B, S * r, 1).expand(-1, -1, F))
        value = torch.gather(weights, 1, pick.reshape(B, S * r, 1).expand(-1, -1, F))
        where = where.reshape(B, S, r, F)
        inside = (picked & (value.reshape(B, S, r, F) != 0)).to(torch.uint8)
        dense = torch.zeros(B, S, r, x_in.shape[-1], dtype=torch.uint8, device=inside.device)
        picked = dense.scatter_add_(3, where, inside) > 0
    return rows, picked, top > tolerance, pick
