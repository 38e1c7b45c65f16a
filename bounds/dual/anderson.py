"""The Anderson et al. relaxation of an affine layer followed by a ReLU, its dual, and the
separation oracle (Anderson, Huchette, Ma, Tjandraatmadja, Vielma, "Strong mixed-integer
programming formulations for trained neural networks", Math. Prog. 2020, Thm. 1; De Palma,
Behl, Bunel, Torr, Kumar, "Scaling the Convex Barrier with Active Sets", ICLR 2021, Sec. 3,
and JMLR 2024, arXiv 2101.05844, Sec. 3).

Notation (`../shared/ALGORITHMS.md`, Sec. 1b): hidden layer k (0-based here) computes
`xh_k = W_k x_{k-1} + b_k` from the flat input `x_{-1}` or the previous ReLU output, and
`x_k = relu(xh_k)`; the output is `W_H x_{H-1} + b_H`. Post-activation boxes `lb_k, ub_k` (the
input box for the input). Per weight, `L_ij` is the end of input j's box that minimises
`W_ij x_j` and `U_ij` the one that maximises it. Every neuron of hidden layer k gets
`z in [0, 1]`, with `x >= xh`, `x` in `[lb, ub]` and, for every subset `I` of its inputs,

    x <= sum_{j in I} W_ij x_{k-1,j} + kappa_I + zeta_I z,                          (A_I)
    kappa_I = -sum_{j in I} W_ij L_ij,  zeta_I = b_i + sum_{j not in I} W_ij U_ij + sum_{j in I} W_ij L_ij.

The convex hull of the neuron over its input box is cut out by all of them. Two of them, with
the pre-activation bounds `l, u` put in, are the Big-M form, whose optimum is Planet's:
`x <= u z` (`I = {}`, kappa 0, zeta u) and `x <= xh - l (1 - z)` (`I = all`, kappa `b - l`,
zeta `l`). Every (x, z) of the network (`z = 1[xh >= 0]`) satisfies all of them.

Dual (multipliers `alpha >= 0` on `x >= xh`, `beta >= 0` per constraint): the Lagrangian is
linear in `x` and `z` over boxes, so every `(alpha, beta) >= 0` gives the valid lower bound

    d = c . b_H + sum_k alpha_k . b_k - sum_{k, I} beta_{k,I} . kappa_{k,I}
        + sum_k min_{x_k in [lb_k, ub_k]} f_k . x_k - sum_k 1 . [g_k]_+,
    f_k = above_k - alpha_k + sum_I beta_{k,I},   g_k = sum_I beta_{k,I} zeta_{k,I},
    above_k = W_{k+1}^T alpha_{k+1} - sum_I (W_{k+1} . I)^T beta_{k+1,I}   (c for alpha_H),

with `f` on the input from layer 0's terms alone. The inner minimiser is `x* = lb` where
`f >= 0` else `ub`, `z* = 1[g >= 0]`; the supergradients are the constraints' slacks there.
Anderson cuts are stored per neuron as a mask over its inputs (`Cuts`), the Big-M pair as
plain tensors. The batch is `[B, S]`: problems (boxes) times specifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.dual.dag import decompose
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph
from bounds.ops import UnaryAffineOp
from bounds.types import Interval


@dataclass(frozen=True)
class Layers:
    """A ReLU chain as affine layers, each the chain of unary affine ops between two ReLUs
    (Linear, Conv, BatchNorm, Flatten, ...; applied as ops, never as dense matrices), on flat
    values: layer k maps `x_{k-1}` (`in_shapes[k]`) to `xh_k` (`out_shapes[k]`), the last one
    the output layer. `biases[k]` `[n_k]`: its image of 0; `pre_names[k]`, `act_names[k]`:
    hidden layer k's pre-activation and ReLU nodes."""

    graph: Graph
    chains: tuple[tuple[UnaryAffineOp, ...], ...]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    biases: tuple[Tensor, ...]
    pre_names: tuple[str, ...]
    act_names: tuple[str, ...]

    @property
    def hidden(self) -> int:
        return len(self.chains) - 1

    def width(self, k: int) -> int:
        return self.biases[k].shape[0]

    def forward(self, k: int, x: Tensor) -> Tensor:
        """`W_k x + b_k` for `x` `[..., n_{k-1}]`."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, *self.in_shapes[k])
        for op in self.chains[k]:
            flat = op.linear(flat)
        return flat.reshape(*lead, -1) + self.biases[k]

    def adjoint(self, k: int, y: Tensor) -> Tensor:
        """`W_k^T y` for `y` `[..., n_k]`."""
        lead = y.shape[:-1]
        flat = y.reshape(-1, *self.out_shapes[k])
        for op in reversed(self.chains[k]):
            flat = op.adjoint(flat)
        return flat.reshape(*lead, -1)

    def rows(self, k: int, index: Tensor, chunk: int = 1 << 24) -> Tensor:
        """The rows `W_k[index]` `[*index.shape, n_{k-1}]` (adjoints of unit vectors, one per
        distinct neuron of `index`, in chunks of about `chunk` elements)."""
        if index.numel() > 1:
            unique, inverse = torch.unique(index, return_inverse=True)
            if unique.numel() < index.numel():
                return self.rows(k, unique, chunk)[inverse]
        n, flat = self.width(k), index.reshape(-1)
        n_in = 1
        for d in self.in_shapes[k]:
            n_in *= d
        step = max(1, chunk // max(n, n_in))
        parts = []
        for start in range(0, flat.shape[0], step):
            part = flat[start : start + step]
            unit = self.biases[k].new_zeros(part.shape[0], n).scatter_(1, part[:, None], 1.0)
            parts.append(self.adjoint(k, unit))
        if not parts:
            return self.biases[k].new_zeros(*index.shape, n_in)
        return torch.cat(parts).reshape(*index.shape, n_in)

    def dense(self, k: int) -> Tensor:
        """`W_k` `[n_k, n_{k-1}]` (for references on small networks)."""
        return self.rows(k, torch.arange(self.width(k), device=self.biases[k].device))

    def to(self, dtype: torch.dtype) -> Layers:
        return anderson_layers(self.graph.to(dtype, self.biases[0].device))


def anderson_layers(graph: Graph) -> Layers:
    """The graph as `Layers`, in the dtype and on the device of its constants.
    UnsupportedOperationError unless it is a chain of affine ops and nonlinearities whose
    relaxations have the Anderson hull (`relaxation.anderson`: ReLU)."""
    net = decompose(graph)
    for act in net.acts:
        if not getattr(act.op.relaxation, "anderson", False):
            raise UnsupportedOperationError(
                act.op.relaxation.name, act.name,
                "the Anderson relaxation covers ReLU after an affine layer; use prox or "
                "alpha-crown for other activations",
            )  # fmt: skip
    for source in net.sources:
        if source.chain is None or not source.simple:
            raise UnsupportedOperationError(
                "graph", source.name,
                "the active-set and Big-M solvers need a chain (affine, ReLU, affine, ...); "
                "use prox on residual or multi-branch graphs",
            )  # fmt: skip
    like = next(t for n in graph.nodes[1:] for t in n.op.constants())
    chains, in_shapes, out_shapes, biases = [], [], [], []
    for source in net.sources:
        zero = like.new_zeros(1, *source.shape)
        for op in source.chain:
            zero = op.forward(zero)
        chains.append(tuple(source.chain))
        in_shapes.append(tuple(source.shape))
        out_shapes.append(tuple(zero.shape[1:]))
        biases.append(zero.reshape(-1))
    pre = tuple(e.pre for e in net.edges)
    return Layers(
        graph, tuple(chains), tuple(in_shapes), tuple(out_shapes), tuple(biases), pre,
        tuple(a.name for a in net.acts),
    )  # fmt: skip


@dataclass(frozen=True)
class AndersonProblem:
    """`min c . y` per (batch, spec) over the relaxation. `x_lower[k]`, `x_upper[k]` `[B, n]`:
    the boxes of the input (k = 0) and of the hidden layers' outputs (k = 1..H);
    `pre_lower[k]`, `pre_upper[k]` `[B, n_k]`: hidden layer k's pre-activation bounds;
    `c` `[B, S, n_out]`."""

    layers: Layers
    x_lower: tuple[Tensor, ...]
    x_upper: tuple[Tensor, ...]
    pre_lower: tuple[Tensor, ...]
    pre_upper: tuple[Tensor, ...]
    c: Tensor

    def to(self, dtype: torch.dtype) -> AndersonProblem:
        return build_problem(
            self.layers.to(dtype),
            Interval(self.x_lower[0].to(dtype), self.x_upper[0].to(dtype)),
            tuple(Interval(lo.to(dtype), up.to(dtype))
                  for lo, up in zip(self.pre_lower, self.pre_upper)),
            self.c.to(dtype),
        )  # fmt: skip

    @cached_property
    def constants(self) -> tuple[_LayerConstants, ...]:
        """Per hidden layer, the fixed tensors an evaluation reads (computed once)."""
        return _constants(self)

    def ends(self, k: int, rows: Tensor) -> tuple[Tensor, Tensor]:
        """`(W_ij L_ij, W_ij U_ij)` for weight rows `rows` `[B, ..., n_in]` of layer k: each
        input's box end that minimises / maximises `W_ij x_j`."""
        extra = rows.dim() - 2
        lo = self.x_lower[k].reshape(rows.shape[0], *([1] * extra), -1)
        up = self.x_upper[k].reshape(rows.shape[0], *([1] * extra), -1)
        positive = rows > 0
        return rows * torch.where(positive, lo, up), rows * torch.where(positive, up, lo)


def build_problem(
    layers: Layers, box: Interval, pre: tuple[Interval, ...], c: Tensor
) -> AndersonProblem:
    """The problem for the flat input `box` `[B, n_0]`, hidden pre-activation bounds `pre`
    (`[B, n_k]` each) and objectives `c` `[B, S, n_out]`."""
    x_lower = [box.lower] + [torch.relu(iv.lower) for iv in pre]
    x_upper = [box.upper] + [torch.relu(iv.upper) for iv in pre]
    return AndersonProblem(
        layers, tuple(x_lower), tuple(x_upper), tuple(iv.lower for iv in pre),
        tuple(iv.upper for iv in pre), c,
    )  # fmt: skip


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


def gather_slots(order: Tensor):
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


def _box_at(p: AndersonProblem, k: int, support: Tensor) -> tuple[Tensor, Tensor]:
    """The input box of layer k at `support` `[B, ..., F]`: `(lower, upper)`, same shape."""
    B = support.shape[0]
    at = support.reshape(B, -1)
    shape = support.shape
    lo = torch.gather(p.x_lower[k], 1, at).reshape(shape)
    return lo, torch.gather(p.x_upper[k], 1, at).reshape(shape)


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
    """`kappa_I`, `zeta_I` (module docstring) and the masked weight rows of layer k's cuts, in
    the problem's dtype (computed from the masks, so a float64 problem gets float64 terms).
    `weights` `[B, S, R, n_in]`: the rows `W_k[cuts.rows]` when the caller has them.

    With the input box's centre `m` and half-width `h`, `W_ij L_ij = W_ij m_j - |W_ij| h_j` and
    `W_ij U_ij = W_ij m_j + |W_ij| h_j`, so `kappa = -(WI m - |WI| h)` and `zeta = b + (W m +
    |W| h) - 2 |WI| h`: two matrix-vector products over the masked rows, no per-weight
    select. `support` `[B, S, R, F]` (`row_support`; `weights` then `[B, S, R, F]`, the
    values there): sparse terms (`CutTerms.support`)."""
    B, S, R = cuts.rows.shape
    if support is not None:
        lo, up = _box_at(p, k, support)
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


class Duals(NamedTuple):
    """Per hidden layer `[B, S, n_k]`: `alpha` (`x >= xh`), `beta_u` (`x <= u z`), `beta_l`
    (`x <= xh - l (1 - z)`); `beta_cut` `[B, S, R_k]` (the layer's cuts)."""

    alpha: tuple[Tensor, ...]
    beta_u: tuple[Tensor, ...]
    beta_l: tuple[Tensor, ...]
    beta_cut: tuple[Tensor, ...]

    def flat(self) -> tuple[Tensor, ...]:
        return (*self.alpha, *self.beta_u, *self.beta_l, *self.beta_cut)

    @staticmethod
    def unflat(t: tuple[Tensor, ...]) -> Duals:
        h = len(t) // 4
        return Duals(t[:h], t[h : 2 * h], t[2 * h : 3 * h], t[3 * h :])

    def select(self, index: Tensor) -> Duals:
        """The problems `index` `[B']` of the batch dimension (branch and bound: children
        warm-started from their parent's duals, De Palma et al., ICLR 2021, Sec. 5)."""
        return Duals.unflat(tuple(t.index_select(0, index) for t in self.flat()))

    def repeat(self, k: int) -> Duals:
        """Each problem repeated `k` times consecutively (the children of a split)."""
        return Duals.unflat(tuple(t.repeat_interleave(k, dim=0) for t in self.flat()))

    def padded(self, slots: tuple[int, ...]) -> Duals:
        """`beta_cut[k]` padded with zeros to `slots[k]` per problem (`Cuts.padded`)."""
        cut = tuple(
            torch.cat([b, b.new_zeros(*b.shape[:2], n - b.shape[2])], 2)
            for b, n in zip(self.beta_cut, slots)
        )  # fmt: skip
        return Duals(self.alpha, self.beta_u, self.beta_l, cut)

    def to(self, dtype: torch.dtype) -> Duals:
        return Duals.unflat(tuple(t.to(dtype) for t in self.flat()))


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
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], d: Duals
) -> tuple[Tensor, Primal]:
    """The dual value `d` `[B, S]` (module docstring) and the Lagrangian's minimiser."""
    value, x, _ = _evaluate(p, terms, cuts, d, exact_stable=False)
    return value, x


def evaluate_stable(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], d: Duals
) -> tuple[Tensor, Primal, Duals]:
    """`evaluate` with the duals of the stable neurons (`l >= 0`: `x = xh`; `u <= 0`: `x = 0`)
    not read from `d` but set, in the backward pass, to the ones that pass the coefficient `mu`
    from above through exactly, as CROWN does (`alpha = [mu]_+`, `beta_l = [-mu]_+`,
    `beta_u = 0` on `l >= 0`; all 0 on `u <= 0`): then `f = 0` there, and their terms sum to
    `mu (W x + b)`. Returns the value, the minimiser and the duals used (`d` with those
    entries replaced: `evaluate` at them gives the same value). Any `d >= 0` gives a valid
    bound, so this is one; a solver that optimises only the ambiguous neurons' duals uses it."""
    return _evaluate(p, terms, cuts, d, exact_stable=True)


class _LayerConstants(NamedTuple):
    """Hidden layer k's fixed tensors, `[B, 1, n_k]`: pre-activation bounds, the output box,
    `b - l`, and the ambiguous (`l < 0 < u`) and passing (`l >= 0`) neurons (as 0 / 1, and
    passing as bool)."""

    lo: Tensor
    up: Tensor
    lb: Tensor
    ub: Tensor
    b_lo: Tensor
    ambiguous: Tensor
    passing: Tensor
    passing_bool: Tensor


def _constants(p: AndersonProblem) -> tuple[_LayerConstants, ...]:
    out = []
    for k in range(p.layers.hidden):
        lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
        passing = lo >= 0
        out.append(_LayerConstants(
            lo, up, p.x_lower[k + 1].unsqueeze(1), p.x_upper[k + 1].unsqueeze(1),
            p.layers.biases[k] - lo, ((lo < 0) & (up > 0)).to(lo.dtype), passing.to(lo.dtype),
            passing,
        ))  # fmt: skip
    return tuple(out)


def _evaluate(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], d: Duals,
    exact_stable: bool,
) -> tuple[Tensor, Primal, Duals]:  # fmt: skip
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
    used = Duals(tuple(alpha), tuple(beta_u), tuple(beta_l), d.beta_cut)
    return value + box_value, Primal(tuple(xs), tuple(zs)), used


def slacks(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], x: Primal,
    exact_stable: bool = False,
) -> Duals:  # fmt: skip
    """The supergradient of `d` at the point whose minimiser is `x`: each constraint's
    violation there (`xh - x` for `alpha`; `x - rhs` for the betas), in `Duals`' layout.

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
    return Duals(tuple(alpha), tuple(beta_u), tuple(beta_l), tuple(beta_cut))


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
            lo, up = _box_at(p, k, part)
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


def add_cuts(cuts: Cuts, rows: Tensor, mask: Tensor, active: Tensor) -> Cuts:
    """`cuts` with `R'` more per problem (`rows` `[B, S, R']`, `mask`, `active`)."""
    return Cuts(
        torch.cat([cuts.rows, rows], 2),
        torch.cat([cuts.mask, mask], 2),
        torch.cat([cuts.active, active], 2),
    )


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


def anderson_slopes(p: AndersonProblem, slopes: dict[str, Tensor] | None) -> tuple[Tensor, ...]:
    """Per hidden layer `[B, S, n_k]`: the lower slopes of a CROWN pass, alpha-CROWN's
    (`slopes`, by activation node, `[B, S, *shape]`) when given, else each relaxation's
    defaults for the problem's pre-activation bounds."""
    B, S = p.c.shape[:2]
    graph, out = p.layers.graph, []
    for name, lo, up in zip(p.layers.act_names, p.pre_lower, p.pre_upper):
        if slopes is not None and name in slopes:
            out.append(slopes[name].reshape(B, S, -1))
        else:
            default = graph[name].op.relaxation.default_params(lo, up)
            out.append(default.unsqueeze(1).expand(-1, S, -1))
    return tuple(out)


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


def dual_value(
    p: AndersonProblem, cuts: tuple[Cuts, ...], d: Duals, sparse: bool = False
) -> Tensor:
    """`d` `[B, S]` at the duals `d` for these cuts, their terms computed in the problem's
    dtype (a float64 problem: the float64 re-evaluation of a solver's duals); `sparse`: by
    `sparse_terms` (the same value, less work on convolutions)."""
    make = sparse_terms if sparse else cut_terms
    terms = tuple(make(p, k, c) for k, c in enumerate(cuts))
    value, _ = evaluate(p, terms, cuts, d.to(p.c.dtype))
    return value


def problem_from_graph(
    graph: Graph, box: Interval, intervals: dict[str, Interval], c: Tensor,
    layers: Layers | None = None,
) -> AndersonProblem:  # fmt: skip
    """The problem of `graph` (`anderson_layers`, or the given `layers` of it) over `box`
    `[B, *in_shape]` with the nodes' `intervals` and the objectives `c` `[B, S, *out_shape]`."""
    return problem_from_layers(
        anderson_layers(graph) if layers is None else layers, box, intervals, c
    )


def problem_from_layers(
    layers: Layers, box: Interval, intervals: dict[str, Interval], c: Tensor
) -> AndersonProblem:
    """`problem_from_graph` for the graph whose `Layers` these are."""
    batch = box.lower.shape[0]
    flat = Interval(box.lower.reshape(batch, -1), box.upper.reshape(batch, -1))
    pre = tuple(
        Interval(intervals[n].lower.reshape(batch, -1), intervals[n].upper.reshape(batch, -1))
        for n in layers.pre_names
    )
    return build_problem(layers, flat, pre, c.reshape(batch, c.shape[1], -1))
