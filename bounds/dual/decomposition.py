"""Lagrangian decomposition of the relaxed verification problem (Bunel, De Palma, Desmaison,
Dvijotham, Kohli, Torr, Kumar, UAI 2020, Sec. 3) and its closed-form subproblem oracle.

Each pre-activation is split into an A copy (output of the affine map) and a B copy (input of
the relaxed activation); only `xhA = xhB` is dualised (multipliers `rho`). Subproblem 0 holds
the input box and the first affine map; subproblem j (1..n-1) holds `xhB_j` in `[l_j, u_j]`, the
relaxed activation and the next affine map; the objective `c . xhA_n` sits in the last. Each
subproblem's minimum is closed form, so any `rho` gives the valid lower bound
`q(rho) = sum_j min(subproblem j)` (weak duality).

Indexing: `rho[i]`, `lower[i]`, `upper[i]`, `xhB[i]` refer to hidden layer i+1 (i = 0..n-2);
`xhA[j]` is the output of block j (j = 0..n-1), `xhA[n-1]` the network's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.dual.duals import Duals
from bounds.dual.layers import LayeredNet
from bounds.types import Interval


@dataclass(frozen=True)
class Problem:
    """`min c . f(x)` over `x` in `box`, one problem per (batch, spec).

    box: `[B, *in_shape]`; lower/upper[i]: `[B, *shape_{i+1}]` pre-activation bounds;
    c: `[B, S, *out_shape]`.
    """

    net: LayeredNet
    box: Interval
    lower: tuple[Tensor, ...]
    upper: tuple[Tensor, ...]
    c: Tensor

    @property
    def n_blocks(self) -> int:
        return len(self.net.blocks)

    def to(self, dtype: torch.dtype) -> Problem:
        box = Interval(self.box.lower.to(dtype), self.box.upper.to(dtype))
        return Problem(
            self.net.to(dtype),
            box,
            tuple(t.to(dtype) for t in self.lower),
            tuple(t.to(dtype) for t in self.upper),
            self.c.to(dtype),
        )


@dataclass(frozen=True)
class BlockSolution:
    """Minimiser of one subproblem: `xhB` (None for block 0), `xhA` (its output) and value."""

    xhB: Tensor | None
    xhA: Tensor
    value: Tensor  # [B, S]


def _sum(t: Tensor) -> Tensor:
    return t.flatten(2).sum(-1)


def _spec(t: Tensor) -> Tensor:
    """`[B, *shape]` -> `[B, 1, *shape]` to broadcast over specs."""
    return t.unsqueeze(1)


def output_coefficient(p: Problem, rho: tuple[Tensor, ...], j: int) -> Tensor:
    """Coefficient of `xhA_j` in subproblem j's objective: `-rho` or `c` for the last block."""
    return p.c if j == p.n_blocks - 1 else -rho[j]


def solve_block(p: Problem, rho: tuple[Tensor, ...], j: int) -> BlockSolution:
    """Closed-form minimiser of subproblem j for the multipliers `rho` (the oracle)."""
    block = p.net.blocks[j]
    coeff = output_coefficient(p, rho, j)
    g = block.adjoint(coeff)  # W_{j+1}^T coeff
    if j == 0:
        box_l, box_u = _spec(p.box.lower), _spec(p.box.upper)
        x = torch.where(g > 0, box_l, box_u).expand_as(g)
        xhA = block.forward(x)
        return BlockSolution(None, xhA, _sum(coeff * xhA))
    relaxation = p.net.relaxations[j - 1]
    lower, upper = _spec(p.lower[j - 1]), _spec(p.upper[j - 1])
    xhB, x = relaxation.argmin(rho[j - 1], g, lower, upper)
    xhA = block.forward(x)
    return BlockSolution(xhB, xhA, _sum(rho[j - 1] * xhB) + _sum(coeff * xhA))


def evaluate(p: Problem, duals: Duals) -> tuple[Tensor, list[BlockSolution]]:
    """`q(rho)` `[B, S]` (a valid lower bound) and every subproblem's minimiser."""
    solutions = [solve_block(p, duals.rho, j) for j in range(p.n_blocks)]
    return sum(s.value for s in solutions), solutions


def supergradient(solutions: list[BlockSolution]) -> Duals:
    """`d q / d rho_i = xhB_{i+1} - xhA_{i+1}` at the oracle's minimisers."""
    return Duals(tuple(solutions[i + 1].xhB - solutions[i].xhA for i in range(len(solutions) - 1)))


def crown_duals(p: Problem, alphas: tuple[Tensor, ...] | None = None) -> Duals:
    """The CROWN / Wong-Kolter multipliers `rho_i = -a_{i+1}` from the backward pass
    `a_n = c`, `a_i = D_i W_{i+1}^T a_{i+1}` (slopes of the lines CROWN picks by sign; `alphas[i]`
    replaces CROWN's adaptive lower slope). `q` at these duals is >= the CROWN bound."""
    a = p.c
    rho: list[Tensor] = []
    for j in range(p.n_blocks - 1, 0, -1):
        g = p.net.blocks[j].adjoint(a)
        relaxation = p.net.relaxations[j - 1]
        alpha = None if alphas is None else alphas[j - 1]
        lines = relaxation.linear_bounds(_spec(p.lower[j - 1]), _spec(p.upper[j - 1]), alpha)
        a = g.clamp(min=0) * lines.lower_slope + g.clamp(max=0) * lines.upper_slope
        rho.append(-a)
    return Duals(tuple(reversed(rho)))


def zero_duals(p: Problem) -> Duals:
    """`rho = 0`: the interval (IBP-like) bound of the decomposition."""
    batch, specs = p.c.shape[:2]
    return Duals(tuple(p.c.new_zeros(batch, specs, *l.shape[1:]) for l in p.lower))


def problem_from_intervals(
    net: LayeredNet, box: Interval, intervals: dict[str, Interval], c: Tensor
) -> Problem:
    """A `Problem` whose pre-activation bounds come from `intervals` (keyed by node name)."""
    lower = tuple(intervals[name].lower for name in net.pre_names)
    upper = tuple(intervals[name].upper for name in net.pre_names)
    return Problem(net, box, lower, upper, c)
