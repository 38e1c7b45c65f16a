"""The Anderson relaxation's dual (package docstring: `bounds.dual.anderson`): the
multipliers (`AndersonDuals`), the dual value and the Lagrangian's minimiser (`evaluate`,
`evaluate_stable`), its supergradient (`slacks`) and the value in the problem's dtype
(`dual_value`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from bounds.dual.anderson.cuts import (
    Cuts,
    CutTerms,
    cut_adjoint,
    cut_matvec,
    cut_terms,
    sparse_terms,
)
from bounds.dual.anderson.problem import AndersonProblem


class AndersonDuals(NamedTuple):
    """Per hidden layer `[B, S, n_k]`: `alpha` (`x >= xh`), `beta_u` (`x <= u z`), `beta_l`
    (`x <= xh - l (1 - z)`); `beta_cut` `[B, S, R_k]` (the layer's cuts)."""

    alpha: tuple[Tensor, ...]
    beta_u: tuple[Tensor, ...]
    beta_l: tuple[Tensor, ...]
    beta_cut: tuple[Tensor, ...]

    def flat(self) -> tuple[Tensor, ...]:
        return (*self.alpha, *self.beta_u, *self.beta_l, *self.beta_cut)

    @staticmethod
    def unflat(t: tuple[Tensor, ...]) -> AndersonDuals:
        h = len(t) // 4
        return AndersonDuals(t[:h], t[h : 2 * h], t[2 * h : 3 * h], t[3 * h :])

    def select(self, index: Tensor) -> AndersonDuals:
        """The problems `index` `[B']` of the batch dimension (branch and bound: children
        warm-started from their parent's duals, De Palma et al., ICLR 2021, Sec. 5)."""
        return AndersonDuals.unflat(tuple(t.index_select(0, index) for t in self.flat()))

    def repeat(self, k: int) -> AndersonDuals:
        """Each problem repeated `k` times consecutively (the children of a split)."""
        return AndersonDuals.unflat(tuple(t.repeat_interleave(k, dim=0) for t in self.flat()))

    def padded(self, slots: tuple[int, ...]) -> AndersonDuals:
        """`beta_cut[k]` padded with zeros to `slots[k]` per problem (`Cuts.padded`)."""
        cut = tuple(
            torch.cat([b, b.new_zeros(*b.shape[:2], n - b.shape[2])], 2)
            for b, n in zip(self.beta_cut, slots)
        )  # fmt: skip
        return AndersonDuals(self.alpha, self.beta_u, self.beta_l, cut)

    def to(self, dtype: torch.dtype) -> AndersonDuals:
        return AndersonDuals.unflat(tuple(t.to(dtype) for t in self.flat()))


class Primal(NamedTuple):
    """The Lagrangian's minimiser: `x[k]` `[B, S, n]` for the input (k = 0) and the hidden
    outputs, `z[k]` `[B, S, n_k]` per hidden layer (0 or 1)."""

    x: tuple[Tensor, ...]
    z: tuple[Tensor, ...]


def _box_min(f: Tensor, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
    """`(min over the box of f . x, its minimiser)`; `lower`, `upper` `[B, n]`."""
    lo, up = lower.unsqueeze(1), upper.unsqueeze(1)
    x = torch.where(f >= 0, lo, up)
    return (f * x).sum(-1), x


def evaluate(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], d: AndersonDuals
) -> tuple[Tensor, Primal]:
    """The dual value `d` `[B, S]` (`bounds.dual.anderson`) and the Lagrangian's minimiser."""
    value, x, _ = _evaluate(p, terms, cuts, d, exact_stable=False)
    return value, x


def evaluate_stable(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], d: AndersonDuals
) -> tuple[Tensor, Primal, AndersonDuals]:
    """`evaluate` with the duals of the stable neurons (`l >= 0`: `x = xh`; `u <= 0`: `x = 0`)
    not read from `d` but set, in the backward pass, to the ones that pass the coefficient `mu`
    from above through exactly, as CROWN does (`alpha = [mu]_+`, `beta_l = [-mu]_+`,
    `beta_u = 0` on `l >= 0`; all 0 on `u <= 0`): then `f = 0` there, and their terms sum to
    `mu (W x + b)`. Returns the value, the minimiser and the duals used (`d` with those
    entries replaced: `evaluate` at them gives the same value). Any `d >= 0` gives a valid
    bound, so this is one; a solver that optimises only the ambiguous neurons' duals uses it."""
    return _evaluate(p, terms, cuts, d, exact_stable=True)


def _evaluate(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], d: AndersonDuals,
    exact_stable: bool,
) -> tuple[Tensor, Primal, AndersonDuals]:  # fmt: skip
    layers, b = p.layers, p.layers.biases
    H = layers.hidden
    value = (p.c * b[H]).sum(-1)
    above = layers.adjoint(H, p.c)  # coefficient of x_{H-1} from the output layer
    xs, zs = [None] * (H + 1), [None] * H
    alpha, beta_u, beta_l = list(d.alpha), list(d.beta_u), list(d.beta_l)
    for k, s in reversed(list(enumerate(p.constants))):
        with_cuts = cuts[k].rows.shape[2] > 0
        mu = above.scatter_add(2, cuts[k].rows, d.beta_cut[k]) if with_cuts else above
        if exact_stable:  # ambiguous: as given; passing: mu passed through; dead: 0
            through = mu.clamp_min(0)
            alpha[k] = torch.where(s.passing_bool, through, s.ambiguous * alpha[k])
            beta_l[k] = torch.where(s.passing_bool, through - mu, s.ambiguous * beta_l[k])
            beta_u[k] = s.ambiguous * beta_u[k]
        f = mu - alpha[k] + beta_u[k] + beta_l[k]
        xs[k + 1] = torch.where(f >= 0, s.lb, s.ub)
        g = torch.addcmul(beta_u[k] * s.up, beta_l[k], s.lo)
        if with_cuts:
            g = g.scatter_add(2, cuts[k].rows, d.beta_cut[k] * terms[k].zeta)
            value = value - (d.beta_cut[k] * terms[k].kappa).sum(-1)
        zs[k] = (g >= 0).to(g.dtype)
        per = torch.addcmul(torch.addcmul(f * xs[k + 1], alpha[k], b[k]), beta_l[k], s.b_lo,
                            value=-1)  # fmt: skip
        value = value + (per - torch.relu(g)).sum(-1)
        above = layers.adjoint(k, alpha[k] - beta_l[k])
        if with_cuts:
            above = above - cut_adjoint(terms[k], d.beta_cut[k], above.shape[-1])
    box_value, xs[0] = _box_min(above, p.x_lower[0], p.x_upper[0])
    used = AndersonDuals(tuple(alpha), tuple(beta_u), tuple(beta_l), d.beta_cut)
    return value + box_value, Primal(tuple(xs), tuple(zs)), used


def slacks(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], x: Primal,
    exact_stable: bool = False,
) -> AndersonDuals:  # fmt: skip
    """The supergradient of `d` at the point whose minimiser is `x`: each constraint's
    violation there (`xh - x` for `alpha`; `x - rhs` for the betas), in `AndersonDuals`' layout.

    `exact_stable` (the minimiser of `evaluate_stable`, where `f = 0` on the neurons with
    `l >= 0`, so that any `x` in their box minimises the Lagrangian too): those neurons take
    `x = clamp(xh, lb, ub)` layer by layer, a minimiser whose slacks there are 0 when `xh` is
    in the box; the stable duals' dependence on the others then adds nothing to the
    supergradient of the others (the envelope of the exact pass-through)."""
    alpha, beta_u, beta_l, beta_cut = [], [], [], []
    x_in = x.x[0]
    for k, s in enumerate(p.constants):
        xh = p.layers.forward(k, x_in)
        out, z = x.x[k + 1], x.z[k]
        if exact_stable:
            out = torch.where(s.passing_bool, xh.clamp(s.lb, s.ub), out)
        lo, up = s.lo, s.up
        gap = xh - out
        alpha.append(gap)
        beta_u.append(torch.addcmul(out, up, z, value=-1))
        beta_l.append(torch.addcmul(lo - gap, lo, z, value=-1))  # x - xh + l (1 - z)
        t = terms[k]
        rows = cuts[k].rows
        if rows.shape[2]:
            rhs = torch.addcmul(cut_matvec(t, x_in) + t.kappa, t.zeta, torch.gather(z, 2, rows))
            beta_cut.append((torch.gather(out, 2, rows) - rhs) * cuts[k].active)
        else:
            beta_cut.append(t.kappa)  # [B, S, 0]
        x_in = out
    return AndersonDuals(tuple(alpha), tuple(beta_u), tuple(beta_l), tuple(beta_cut))


def dual_value(
    p: AndersonProblem, cuts: tuple[Cuts, ...], d: AndersonDuals, sparse: bool = False
) -> Tensor:
    """`d` `[B, S]` at the duals `d` for these cuts, their terms computed in the problem's
    dtype (a float64 problem: the float64 re-evaluation of a solver's duals); `sparse`: by
    `sparse_terms` (the same value, less work on convolutions)."""
    make = sparse_terms if sparse else cut_terms
    terms = tuple(make(p, k, c) for k, c in enumerate(cuts))
    value, _ = evaluate(p, terms, cuts, d.to(p.c.dtype))
    return value
