"""Exact references for the Anderson relaxation, with cvxpy and HiGHS, for tests and
benchmarks only:
- `anderson_lp`: on tiny networks, the LP with every constraint `A_I` (all subsets `I` of each
  ambiguous neuron's inputs with a nonzero weight; Anderson et al. 2020, Thm. 1), or the Big-M
  LP; `2^fan-in` constraints per neuron, so fan-ins above `max_fan_in` are refused;
- `anderson_lp_separated`: the same optimum for any fan-in by cutting planes: from the Big-M
  LP, each round adds, per ambiguous neuron, the most violated `A_I` at the LP's solution (the
  exact separation oracle, Anderson et al. 2020, Prop. 3), until none is violated.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import Tensor

from bounds.dual.anderson.problem import AndersonProblem
from bounds.lp.lp import _cvxpy, _silenced_stdout


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def anderson_lp(p: AndersonProblem, all_cuts: bool = True, max_fan_in: int = 8) -> Tensor:
    """`min c . y` per (batch, spec) `[B, S]` over the relaxation of `p`: with every Anderson
    constraint (`all_cuts`, the convex hull of each neuron over its input box) or with the
    Big-M pair alone (whose optimum is the Planet LP's)."""
    cp, _ = _cvxpy()
    W = [_np(p.layers.dense(k)) for k in range(p.layers.hidden + 1)]
    b = [_np(v) for v in p.layers.biases]
    B, S = p.c.shape[:2]
    out = np.zeros((B, S))
    for i in range(B):
        lb, ub = [_np(t[i]) for t in p.x_lower], [_np(t[i]) for t in p.x_upper]
        lo, up = [_np(t[i]) for t in p.pre_lower], [_np(t[i]) for t in p.pre_upper]
        x, z, rows = _big_m(cp, W, b, lb, ub, lo, up)
        if all_cuts:
            for k in range(len(W) - 1):
                rows += _all_cuts(W[k], b[k], lb[k], ub[k], lo[k], up[k], x[k], x[k + 1], z[k],
                                  max_fan_in)  # fmt: skip
        c = cp.Parameter(W[-1].shape[0])
        problem = cp.Problem(cp.Minimize(c @ (W[-1] @ x[-1] + b[-1])), rows)
        for s in range(S):
            c.value = _np(p.c[i, s])
            with _silenced_stdout():
                problem.solve(solver="HIGHS")
            if problem.status != cp.OPTIMAL:
                raise RuntimeError(f"the Anderson LP ended {problem.status} at ({i}, {s})")
            out[i, s] = problem.value
    return torch.as_tensor(out, dtype=p.c.dtype)


def _big_m(cp, W, b, lb, ub, lo, up) -> tuple[list, list, list]:
    """The Big-M LP's variables `x` (each layer's input), `z` (each hidden layer's) and
    constraints for affine layers `W[k]`, `b[k]`, input boxes `lb[k]`, `ub[k]` and hidden
    pre-activation bounds `lo[k]`, `up[k]`."""
    x = [cp.Variable(w.shape[1]) for w in W]
    z = [cp.Variable(w.shape[0]) for w in W[:-1]]
    rows = [x[0] >= lb[0], x[0] <= ub[0]]
    for k in range(len(W) - 1):
        xh = W[k] @ x[k] + b[k]
        out_k = x[k + 1]
        rows += [out_k >= xh, out_k >= lb[k + 1], out_k <= ub[k + 1], z[k] >= 0, z[k] <= 1]
        rows += [out_k <= cp.multiply(up[k], z[k]), out_k <= xh - cp.multiply(lo[k], 1 - z[k])]
    return x, z, rows


def _ends(W: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per weight, the input ends `L`, `U` with `W L <= W U` (`[n_out, n_in]`)."""
    positive = W > 0
    return np.where(positive, lb, ub), np.where(positive, ub, lb)


def _cut(w, b, L, U, I, x_in, y, z):
    """The constraint `A_I` of one neuron (weights `w`, bias `b`, ends `L`, `U`; `I` a bool
    mask over its inputs; Anderson et al. 2020, Thm. 1): `y <= (w 1_I) . x_in + kappa + zeta z`."""
    kappa = -float(np.sum(w[I] * L[I]))
    zeta = float(b + np.sum(w[~I] * U[~I]) + np.sum(w[I] * L[I]))
    return y <= (w * I) @ x_in + kappa + zeta * z


def _all_cuts(W, b, lb, ub, lo, up, x_in, x_out, z, max_fan_in: int) -> list:
    """Every `A_I` of every ambiguous neuron (see `bounds.dual.anderson`)."""
    rows = []
    L, U = _ends(W, lb, ub)
    for i in np.flatnonzero((lo < 0) & (up > 0)):
        inputs = np.flatnonzero(W[i] != 0)
        if inputs.size > max_fan_in:
            raise ValueError(f"neuron {i} has fan-in {inputs.size} > {max_fan_in}")
        for r in range(inputs.size + 1):
            for chosen in itertools.combinations(inputs, r):
                I = np.zeros(W.shape[1], dtype=bool)
                I[list(chosen)] = True
                rows.append(_cut(W[i], b[i], L[i], U[i], I, x_in, x_out[i], z[i]))
    return rows


def _most_violated_np(w, b, L, U, x, y, z):
    """The oracle on one neuron (weights `w`, bias `b`, input ends `L`/`U` with `w L <= w U`) at
    `(x, y, z)`: `(violation, I)` of the `A_I` with the least right-hand side. Written apart from
    the solvers' `anderson.most_violated` on purpose: the reference must not share their code."""
    inside = w * x - w * L * (1 - z)
    outside = w * U * z
    chosen = (inside <= outside) & (w != 0)
    rhs = b * z + float(np.sum(np.minimum(inside, outside)))
    return y - rhs, chosen


def anderson_lp_separated(
    p: AndersonProblem, tolerance: float = 1e-7, max_rounds: int = 200, share_cuts: bool = False
) -> tuple[Tensor, dict]:
    """`min c . y` per (batch, spec) `[B, S]` over the Anderson relaxation of `p` (the convex
    hull of each neuron over its input box, as `anderson_lp(p, all_cuts=True)`), for any fan-in,
    by cutting planes (module docstring); a constraint is added where it is violated by more
    than `tolerance (1 + |y|)`; `share_cuts`: as `hull_lp`'s, over the specs of a batch
    element. Also returns stats: rounds and cuts per problem. Raises
    RuntimeError when an LP does not solve or the rounds run out before no cut is violated."""
    W = [_np(p.layers.dense(k)) for k in range(p.layers.hidden + 1)]
    b = [_np(v) for v in p.layers.biases]
    B, S = p.c.shape[:2]
    out = np.zeros((B, S))
    stats: dict = {"rounds": np.zeros((B, S), dtype=int), "cuts": np.zeros((B, S), dtype=int)}
    for i in range(B):
        lb, ub = [_np(t[i]) for t in p.x_lower], [_np(t[i]) for t in p.x_upper]
        lo, up = [_np(t[i]) for t in p.pre_lower], [_np(t[i]) for t in p.pre_upper]
        values, rounds, cuts = hull_lp(
            W, b, lb, ub, lo, up, [_np(p.c[i, s]) for s in range(S)], tolerance, max_rounds,
            share_cuts,
        )  # fmt: skip
        out[i], stats["rounds"][i], stats["cuts"][i] = values, rounds, cuts
    return torch.as_tensor(out, dtype=p.c.dtype), stats


def hull_lp(
    W: list[np.ndarray], b: list[np.ndarray], lb: list[np.ndarray], ub: list[np.ndarray],
    lo: list[np.ndarray], up: list[np.ndarray], objectives: list[np.ndarray],
    tolerance: float = 1e-7, max_rounds: int = 200, share_cuts: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The cutting-plane Anderson LP of one problem in numbers: affine layers `W[k]`, `b[k]`
    (the last one's output is the objective's), the boxes `lb[k]`, `ub[k]` of each layer's
    input, the pre-activation bounds `lo[k]`, `up[k]` of each hidden layer; `min c . (W[-1] x +
    b[-1])` for each `c` of `objectives`. `share_cuts`: the cuts found for one objective are
    kept for the next (every cut is valid for the relaxation; fewer rounds). Returns the
    values, the rounds and the number of cuts per objective."""
    cp, _ = _cvxpy()
    x, z, base = _big_m(cp, W, b, lb, ub, lo, up)
    ends = [_ends(W[k], lb[k], ub[k]) for k in range(len(W) - 1)]
    ambiguous = [np.flatnonzero((lo[k] < 0) & (up[k] > 0)) for k in range(len(W) - 1)]
    objective = W[-1] @ x[-1] + b[-1]
    values = np.zeros(len(objectives))
    rounds_of = np.zeros(len(objectives), dtype=int)
    cuts_of = np.zeros(len(objectives), dtype=int)
    cuts: list = []
    for s, c in enumerate(objectives):
        cuts = cuts if share_cuts else []
        for rounds in range(max_rounds + 1):
            problem = cp.Problem(cp.Minimize(c @ objective), base + cuts)
            with _silenced_stdout():
                problem.solve(solver="HIGHS")
            if problem.status != cp.OPTIMAL:
                raise RuntimeError(f"the Anderson LP ended {problem.status} at objective {s}")
            added = []
            for k, neurons in enumerate(ambiguous):
                xk, yk, zk = x[k].value, x[k + 1].value, z[k].value
                L, U = ends[k]
                for n in neurons:
                    violation, chosen = _most_violated_np(
                        W[k][n], b[k][n], L[n], U[n], xk, yk[n], zk[n]
                    )  # fmt: skip
                    if violation > tolerance * (1 + abs(yk[n])):
                        added.append(_cut(W[k][n], b[k][n], L[n], U[n], chosen, x[k],
                                          x[k + 1][n], z[k][n]))  # fmt: skip
            if not added:
                break
            if rounds == max_rounds:
                raise RuntimeError(f"cuts still violated after {max_rounds} rounds")
            cuts = cuts + added
        values[s], rounds_of[s], cuts_of[s] = problem.value, rounds, len(cuts)
    return values, rounds_of, cuts_of
