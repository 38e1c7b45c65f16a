"""Anderson cuts (package docstring: `bounds.dual.anderson`): the constraints `A_I` of a
hidden layer stored per neuron as a mask over its inputs (`Cuts`), and their numbers
(`CutTerms`: the masked weight rows, `kappa_I`, `zeta_I`), dense or on the rows' supports."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.dual.anderson.problem import AndersonProblem, box_at


class Cuts(NamedTuple):
    """Anderson constraints of one hidden layer, R per problem: `rows` `[B, S, R]` (the neuron),
    `mask` `[B, S, R, n_in]` (the set I), `active` `[B, S, R]` (False: a padding slot whose
    multiplier stays 0)."""

    rows: Tensor
    mask: Tensor
    active: Tensor

    def select(self, index: Tensor) -> Cuts:
        """The problems `index` `[B']` of the batch dimension (branch and bound: the domains
        kept; children inherit their parent's active set, De Palma et al., ICLR 2021, Sec. 5)."""
        return Cuts(*(t.index_select(0, index) for t in self))

    def repeat(self, k: int) -> Cuts:
        """Each problem repeated `k` times consecutively (the children of a split)."""
        return Cuts(*(t.repeat_interleave(k, dim=0) for t in self))

    def padded(self, slots: int) -> Cuts:
        """`slots >= R` slots per problem, the new ones padding (inactive, neuron 0, empty
        set): a batch of problems with different cut counts shares one layout."""
        extra = slots - self.rows.shape[2]
        if extra < 0:
            raise ValueError(f"cannot pad {self.rows.shape[2]} cuts to {slots}")
        B, S = self.rows.shape[:2]
        return Cuts(
            torch.cat([self.rows, self.rows.new_zeros(B, S, extra)], 2),
            torch.cat([self.mask, self.mask.new_zeros(B, S, extra, self.mask.shape[3])], 2),
            torch.cat([self.active, self.active.new_zeros(B, S, extra)], 2),
        )


def gather_slots(order: Tensor) -> Callable[[Tensor], Tensor]:
    """`t` `[B, S, R, ...]` (a layer's cuts or their multipliers) -> its slots `order`
    `[B, S, R']` per problem."""

    def gather(t: Tensor) -> Tensor:
        at = order.reshape(*order.shape, *([1] * (t.dim() - 3)))
        return torch.gather(t, 2, at.expand(*order.shape, *t.shape[3:]))

    return gather


class CutTerms(NamedTuple):
    """A layer's cuts in numbers: `WI` `[B, S, R, n_in]` (`W_ij 1[j in I]`), `kappa` and
    `zeta` `[B, S, R]`. With `support` `[B, S, R, F]` (the inputs a row can be nonzero on, as
    for a convolution's kernel window; F << n_in), `WI` is `[B, S, R, F]` on those inputs."""

    WI: Tensor
    kappa: Tensor
    zeta: Tensor
    support: Tensor | None = None


def _flat_index(support: Tensor) -> Tensor:
    """`[B, S, R * F]` from `[B, S, R, F]`."""
    return support.reshape(*support.shape[:2], -1)


def cut_matvec(t: CutTerms, x: Tensor) -> Tensor:
    """`sum_j WI_rj x_j` `[B, S, R]` for `x` `[B, S, n_in]`."""
    if t.support is None:
        return torch.einsum("bsri,bsi->bsr", t.WI, x)
    return (t.WI * torch.gather(x, 2, _flat_index(t.support)).reshape(t.WI.shape)).sum(-1)


def cut_adjoint(t: CutTerms, beta: Tensor, n_in: int) -> Tensor:
    """`sum_r beta_r WI_r` `[B, S, n_in]` for `beta` `[B, S, R]`."""
    if t.support is None:
        return torch.einsum("bsr,bsri->bsi", beta, t.WI)
    out = beta.new_zeros(*beta.shape[:2], n_in)
    values = (beta.unsqueeze(-1) * t.WI).reshape(*beta.shape[:2], -1)
    return out.scatter_add(2, _flat_index(t.support), values)


def row_support(rows: Tensor, width: int | None = None) -> tuple[Tensor, Tensor]:
    """For weight rows `[..., n_in]`: `(support [..., F], values [..., F])`, the positions of
    each row's nonzeros (F = `width`, default the most any row has; shorter rows padded with
    position 0 and value 0) and the weights there."""
    nonzero = rows != 0
    most = int(nonzero.sum(-1).max()) if rows.numel() else 0
    if width is not None and width < most:
        raise ValueError(f"a row has {most} nonzeros, more than width {width}")
    F = max(1, most) if width is None else width
    order = torch.argsort((~nonzero).to(torch.int8), dim=-1, stable=True)[..., :F]
    values = torch.gather(rows, -1, order)
    return torch.where(values != 0, order, torch.zeros_like(order)), values


def no_cuts(p: AndersonProblem, k: int) -> Cuts:
    B, S = p.c.shape[:2]
    n_in = p.x_lower[k].shape[-1]
    device = p.c.device
    return Cuts(
        torch.zeros(B, S, 0, dtype=torch.long, device=device),
        torch.zeros(B, S, 0, n_in, dtype=torch.bool, device=device),
        torch.zeros(B, S, 0, dtype=torch.bool, device=device),
    )


def cut_terms(
    p: AndersonProblem, k: int, cuts: Cuts, weights: Tensor | None = None,
    support: Tensor | None = None,
) -> CutTerms:  # fmt: skip
    """`kappa_I`, `zeta_I` (`bounds.dual.anderson`) and the masked weight rows of layer k's cuts, in
    the problem's dtype (computed from the masks, so a float64 problem gets float64 terms).
    `weights` `[B, S, R, n_in]`: the rows `W_k[cuts.rows]` when the caller has them.

    With the input box's centre `m` and half-width `h`, `W_ij L_ij = W_ij m_j - |W_ij| h_j` and
    `W_ij U_ij = W_ij m_j + |W_ij| h_j`, so `kappa = -(WI m - |WI| h)` and `zeta = b + (W m +
    |W| h) - 2 |WI| h`: two matrix-vector products over the masked rows, no per-weight
    select. `support` `[B, S, R, F]` (`row_support`; `weights` then `[B, S, R, F]`, the
    values there): sparse terms (`CutTerms.support`)."""
    B, S, R = cuts.rows.shape
    if support is not None:
        lo, up = box_at(p, k, support)
        mid, half = (lo + up) / 2, (up - lo) / 2
        mask = torch.gather(cuts.mask, 3, support)
        W = weights
        WI = W * mask.to(W.dtype)
        spread = (WI.abs() * half).sum(-1)
        in_L = (WI * mid).sum(-1) - spread
        top = (W * mid).sum(-1) + (W.abs() * half).sum(-1)
        zeta = p.layers.biases[k][cuts.rows] + top - 2 * spread
        return CutTerms(WI, -in_L, zeta, support)
    lo, up = p.x_lower[k], p.x_upper[k]
    mid, half = ((lo + up) / 2).reshape(B, 1, -1, 1), ((up - lo) / 2).reshape(B, 1, -1, 1)
    if weights is None:  # the distinct rows once: their box maxima by one product
        unique, inverse = torch.unique(cuts.rows, return_inverse=True)
        Wu = p.layers.rows(k, unique)  # [U, n_in]
        top = (lo @ Wu.T + up @ Wu.T + (up - lo) @ Wu.abs().T) / 2  # [B, U]
        top = torch.gather(top, 1, inverse.reshape(B, -1)).reshape(B, S, R)
        W = Wu[inverse]
    else:
        W = weights
        top = ((W @ mid) + (W.abs() @ half)).squeeze(-1)
    WI = W * cuts.mask.to(W.dtype)
    spread = (WI.abs() @ half).squeeze(-1)
    in_L = (WI @ mid).squeeze(-1) - spread
    zeta = p.layers.biases[k][cuts.rows] + top - 2 * spread
    return CutTerms(WI, -in_L, zeta)


def add_cuts(cuts: Cuts, rows: Tensor, mask: Tensor, active: Tensor) -> Cuts:
    """`cuts` with `R'` more per problem (`rows` `[B, S, R']`, `mask`, `active`)."""
    return Cuts(
        torch.cat([cuts.rows, rows], 2),
        torch.cat([cuts.mask, mask], 2),
        torch.cat([cuts.active, active], 2),
    )


def layer_support(p: AndersonProblem, k: int, index: Tensor) -> int | None:
    """The most nonzeros of the rows `W_k[index]` when that is a quarter of the inputs or
    fewer (a convolution's kernel window: the layer's cuts are best kept sparse), else None."""
    if index.numel() == 0:
        return None
    F = max(1, int((p.layers.rows(k, torch.unique(index)) != 0).sum(-1).max()))
    return F if p.x_lower[k].shape[-1] >= 4 * F else None


def sparse_terms(p: AndersonProblem, k: int, cuts: Cuts, width: int | None = None) -> CutTerms:
    """`cut_terms` on the rows' supports of `width` (default `layer_support`; sparse
    `CutTerms`) where the rows are sparse, else dense."""
    width = layer_support(p, k, cuts.rows) if width is None else width
    if width is None:
        return cut_terms(p, k, cuts)
    B, S, R = cuts.rows.shape
    if R == 0:
        empty = cuts.rows.new_zeros(B, S, 0, width)
        return cut_terms(p, k, cuts, empty.to(p.c.dtype), empty)
    unique, inverse = torch.unique(cuts.rows, return_inverse=True)
    support, values = row_support(p.layers.rows(k, unique), width)  # [U, F]
    return cut_terms(p, k, cuts, values[inverse], support[inverse])
