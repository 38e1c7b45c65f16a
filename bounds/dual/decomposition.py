"""Lagrangian decomposition of the relaxed verification problem (Bunel, De Palma, Desmaison,
Dvijotham, Kohli, Torr, Kumar, UAI 2020, Sec. 3) on a DAG, and its closed-form oracle.

The input of every nonlinear node is split into an A copy (the affine subgraph's value) and a B
copy (the relaxation's input); only `xhA = xhB` is dualised, with one multiplier tensor
`rho[e]` per edge (see `bounds.dual.dag`). Subproblem 0 holds the input box; subproblem
`j + 1` holds nonlinear node `acts[j]`: its inputs' B copies in their intervals and its output,
in the relaxed set. With the objective `c . y` and `sum_e rho_e . (xhB_e - xhA_e)`, the
Lagrangian is separable: subproblem s minimises `sum_{e in s} rho_e . xhB_e + g_s . z_s`, where
`g_s` is the vjp of its targets' coefficients (`-rho_t`, or `c` on the output) through the affine
subgraph. Each minimum is closed form, so any `rho` gives the valid lower bound
`q(rho) = sum_s min(subproblem s)` (weak duality), constants included through the shares that
carry the affine offsets.

Indexing: `rho[e]`, `lower[e]`, `upper[e]`, `xhB[e]` per edge (on a chain: hidden layer e+1);
a subproblem's `xhA` are its shares of its targets, one per pair (on a chain: block j's output).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.dual.dag import Decomposition, decompose, pull_back, push_forward
from bounds.dual.duals import Duals
from bounds.methods.backward import backward_pass, relax_backward
from bounds.types import Interval


@dataclass(frozen=True)
class Problem:
    """`min c . f(x)` over `x` in `box`, one problem per (batch, spec).

    box: `[B, *in_shape]`; lower/upper[e]: `[B, *shape_e]` bounds of edge e's node;
    c: `[B, S, *out_shape]`.
    """

    net: Decomposition
    box: Interval
    lower: tuple[Tensor, ...]
    upper: tuple[Tensor, ...]
    c: Tensor

    @property
    def n_blocks(self) -> int:
        """Subproblems: the input, then one per nonlinear node."""
        return len(self.net.sources)

    def to(self, dtype: torch.dtype) -> Problem:
        box = Interval(self.box.lower.to(dtype), self.box.upper.to(dtype))
        return Problem(
            self.net.to(dtype, self.c.device),
            box,
            tuple(t.to(dtype) for t in self.lower),
            tuple(t.to(dtype) for t in self.upper),
            self.c.to(dtype),
        )


@dataclass(frozen=True)
class BlockSolution:
    """Minimiser of one subproblem: `xhB` (its edges' B copies; empty for the input), `xhA`
    (its shares of its targets, one per pair) and its value `[B, S]`."""

    xhB: tuple[Tensor, ...]
    xhA: tuple[Tensor, ...]
    value: Tensor


def _sum(t: Tensor) -> Tensor:
    return t.flatten(2).sum(-1)


def _spec(t: Tensor) -> Tensor:
    """`[B, *shape]` -> `[B, 1, *shape]` to broadcast over specs."""
    return t.unsqueeze(1)


def target_coefficient(p: Problem, rho: Sequence[Tensor | None], target: int) -> Tensor:
    """Coefficient of target `target` in the Lagrangian: `-rho` of an edge, `c` of the output."""
    return p.c if target == p.net.n_edges else -rho[target]


def pair_coefficients(p: Problem, rho: Sequence[Tensor | None], s: int) -> tuple[Tensor, ...]:
    """The coefficients of subproblem s's shares, one per pair."""
    out = p.net.n_edges
    return tuple([p.c if t == out else -rho[t] for t in p.net.sources[s].targets])


def _bounds(p: Problem, edges: tuple[int, ...]) -> tuple:
    """`(lower, upper)` as the relaxation takes them (tensors; tuples for several inputs)."""
    if len(edges) == 1:
        return _spec(p.lower[edges[0]]), _spec(p.upper[edges[0]])
    return tuple(_spec(p.lower[e]) for e in edges), tuple(_spec(p.upper[e]) for e in edges)


def oracle(
    p: Problem, rho: Sequence[Tensor | None], s: int, g: Tensor
) -> tuple[tuple[Tensor, ...], Tensor]:
    """Minimiser `(xhB per edge, z)` of subproblem s for the multipliers `rho` and the
    coefficient `g` `[B, S, *shape]` on its value: a box corner for the input, the
    relaxation's `argmin` for a nonlinear node."""
    if s == 0:
        box_l, box_u = _spec(p.box.lower), _spec(p.box.upper)
        return (), torch.where(g > 0, box_l, box_u).expand_as(g)
    edges = p.net.sources[s].edges
    relaxation = p.net.acts[s - 1].op.relaxation
    if len(edges) == 1:
        e = edges[0]
        xhB, z = relaxation.argmin(rho[e], g, _spec(p.lower[e]), _spec(p.upper[e]))
        return (xhB,), z
    lower, upper = _bounds(p, edges)
    xhB, z = relaxation.argmin(tuple(rho[e] for e in edges), g, lower, upper)
    return tuple(xhB), z


def _zero_coefficient(p: Problem, s: int) -> Tensor:
    return p.c.new_zeros(*p.c.shape[:2], *p.net.sources[s].shape)


def solve_block(p: Problem, rho: Sequence[Tensor | None], s: int) -> BlockSolution:
    """Closed-form minimiser of subproblem s for the multipliers `rho` (the oracle); only the
    entries of its edges and of its targets' edges are read."""
    coeffs = pair_coefficients(p, rho, s)
    g = pull_back(p.net, s, coeffs)
    if g is None:  # a nonlinear node that feeds nothing
        g = _zero_coefficient(p, s)
    xhB, z = oracle(p, rho, s, g)
    xhA = push_forward(p.net, s, z)
    value = _sum(coeffs[0] * xhA[0]) if coeffs else p.c.new_zeros(p.c.shape[:2])
    for k in range(1, len(coeffs)):
        value = value + _sum(coeffs[k] * xhA[k])
    if s:
        for e, b in zip(p.net.sources[s].edges, xhB):
            value = value + _sum(rho[e] * b)
    return BlockSolution(xhB, xhA, value)


def evaluate(p: Problem, duals: Duals) -> tuple[Tensor, list[BlockSolution]]:
    """`q(rho)` `[B, S]` (a valid lower bound) and every subproblem's minimiser."""
    solutions = [solve_block(p, duals.rho, s) for s in range(p.n_blocks)]
    return sum(s.value for s in solutions), solutions


def target_values(p: Problem, shares: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """`xhA` per edge: the sum of its shares (`shares` indexed by pair)."""
    out = []
    for e, only in enumerate(p.net.only_share):
        if e == p.net.n_edges:  # the output
            break
        if only >= 0:
            out.append(shares[only])
            continue
        ks = p.net.target_pairs[e]
        total = shares[ks[0]]
        for k in ks[1:]:
            total = total + shares[k]
        out.append(total)
    return tuple(out)


def primal(p: Problem, solutions: list[BlockSolution]) -> tuple[tuple[Tensor, ...], ...]:
    """`(xhB per edge, shares per pair)` of the subproblems' minimisers."""
    xhB: list[Tensor | None] = [None] * p.net.n_edges
    for source, sol in zip(p.net.sources, solutions):
        for e, b in zip(source.edges, sol.xhB):
            xhB[e] = b
    shares = tuple(a for sol in solutions for a in sol.xhA)
    return tuple(xhB), shares


def supergradient(p: Problem, solutions: list[BlockSolution]) -> Duals:
    """`d q / d rho_e = xhB_e - xhA_e` at the oracle's minimisers (edges in order: a source's
    edges follow the previous source's)."""
    shares = [a for sol in solutions for a in sol.xhA]
    only, grads = p.net.only_share, []
    for source, sol in zip(p.net.sources, solutions):
        for e, b in zip(source.edges, sol.xhB):
            k = only[e]
            grads.append(b - (shares[k] if k >= 0 else target_values(p, shares)[e]))
    return Duals(tuple(grads))


def _slopes_of(p: Problem, slopes) -> dict[str, Tensor]:
    if slopes is None:
        return {}
    if isinstance(slopes, Mapping):
        return dict(slopes)
    return {a.name: s for a, s in zip(p.net.acts, slopes)}


def initial_duals(
    p: Problem, slopes: Mapping[str, Tensor] | Sequence[Tensor] | None = None
) -> Duals:
    """The CROWN / Wong-Kolter multipliers (Bunel et al. 2020, Sec. 4.3): one backward pass of
    `c` through the graph (`bounds.methods.backward.backward_pass`), whose hook records at each
    nonlinear node the functional `a_e` it passes to each input; `rho_e = -a_e`. `slopes` (per
    nonlinear node, by name or in `net.acts` order, `[B, S, *param_shape]`) replaces CROWN's
    default relaxation parameters (alpha-CROWN's). `q` at these duals is >= the CROWN bound of
    the same lines: every subproblem's minimum is >= the bias that CROWN's lines give it."""
    chosen = _slopes_of(p, slopes)
    index = {a.name: j for j, a in enumerate(p.net.acts)}
    found: dict[int, Tensor] = {}

    def relax(node, coeff: Tensor):
        edges = p.net.act_edges[index[node.name]]
        lower, upper = _bounds(p, edges)
        lines = node.op.relaxation.linear_bounds(lower, upper, chosen.get(node.name))
        new_A, bias = relax_backward(coeff, lines)
        for e, part in zip(edges, new_A if isinstance(new_A, tuple) else (new_A,)):
            found[e] = -part
        return new_A, bias, None  # only the functionals are used: no bound from this pass

    graph = p.net.graph
    backward_pass(graph, graph.output.name, p.c, p.box, relax)
    batch, specs = p.c.shape[:2]
    rho = []
    for e, lo in enumerate(p.lower):
        shape = (batch, specs, *lo.shape[1:])
        if e not in found:
            rho.append(p.c.new_zeros(shape))
        elif found[e].shape == shape:
            rho.append(found[e])
        else:  # a copy, not a view: compiled steps specialise on views of their inputs
            rho.append(found[e].expand(shape).contiguous())
    return Duals(tuple(rho))


def zero_duals(p: Problem) -> Duals:
    """`rho = 0`: the interval (IBP-like) bound of the decomposition."""
    batch, specs = p.c.shape[:2]
    return Duals(tuple(p.c.new_zeros(batch, specs, *l.shape[1:]) for l in p.lower))


def problem_from_intervals(
    net: Decomposition, box: Interval, intervals: Mapping[str, Interval], c: Tensor
) -> Problem:
    """A `Problem` whose edges' bounds come from `intervals` (keyed by node name)."""
    lower = tuple(intervals[e.pre].lower for e in net.edges)
    upper = tuple(intervals[e.pre].upper for e in net.edges)
    return Problem(net, box, lower, upper, c)


__all__ = [
    "BlockSolution",
    "Problem",
    "decompose",
    "evaluate",
    "initial_duals",
    "problem_from_intervals",
    "solve_block",
    "supergradient",
    "zero_duals",
]
