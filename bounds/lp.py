"""Exact references with cvxpy (HiGHS by default, Clarabel as fallback; no Gurobi).

- `planet_lp`: the Planet LP (triangle relaxation of every ReLU, Ehlers 2017) for given
  intermediate bounds: the optimum the dual methods approach.
- `milp`: the exact mixed-integer program (big-M with the given bounds; Tjeng et al., ICLR 2019):
  the true minimum, for tiny nets in tests.

Both build one problem per batch element with the objective's coefficients as a cvxpy
Parameter, so the problem is canonicalised once and re-solved per spec. Values are accurate to
the solver's tolerance (about 1e-7 relative with HiGHS); as bounds we report them loosened by
`SAFETY` (relative), so a solver's tolerance can never make a reported bound unsound.

Time: a `deadline` is checked before every solve and passed to the solver as its time limit;
solves it cuts short keep a caller's fallback bound. cvxpy's model build before the first solve
of each batch element cannot be interrupted (about a second for a 20-200-200-10 MILP here).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.graph import Graph
from bounds.ops import ActivationOp, SumOp, UnaryAffineOp
from bounds.types import Interval

SAFETY = 1e-6


def _cvxpy():
    try:
        import cvxpy
        import scipy.sparse
    except ImportError as exc:  # optional dependency
        raise ImportError("the LP reference needs cvxpy: pip install 'ldverify[lp]'") from exc
    return cvxpy, scipy.sparse


@contextlib.contextmanager
def _silenced_stdout() -> Iterator[None]:
    """Sends the process's file descriptor 1 to /dev/null: HiGHS prints its copyright banner from
    C on its first solve, whatever `output_flag` says, and it does not belong in our output."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no usable descriptor 1 (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@dataclass(frozen=True)
class LpConfig:
    """solver: 'HIGHS' or 'CLARABEL' (falls back to the other on failure); time_limit in seconds
    per solve (HiGHS only); intermediate: how pre-activation bounds are computed (as for the
    decomposition methods, so methods can be compared with identical intermediate bounds)."""

    solver: str = "HIGHS"
    time_limit: float = 600.0
    intermediate: str = "crown"
    intermediate_iterations: int = 50

    def __post_init__(self) -> None:
        if self.solver not in ("HIGHS", "CLARABEL"):
            raise ValueError(f"solver must be 'HIGHS' or 'CLARABEL', got {self.solver!r}")
        if not self.time_limit > 0:
            raise ValueError("time_limit must be > 0")


def _np(t: Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy().reshape(-1)


def _affine_constraints(cp, sp, node, var, inputs):
    if isinstance(node.op, SumOp):
        return [var == sum(s * v for s, v in zip(node.op.signs, inputs))]
    W, b = node.op.as_matrix()
    W = sp.csr_matrix(W.detach().cpu().double().numpy())
    return [var == W @ inputs[0] + _np(b)]


def _relu_constraints(cp, node, var, pre_var, pre: Interval, b: int, integer: bool):
    lower, upper = pre.lower[b].detach(), pre.upper[b].detach()
    cons = node.op.relaxation.constraints(lower, upper)
    rows = [pre_var >= _np(lower), pre_var <= _np(upper)]
    for slope, intercept in zip(cons.lower_slopes, cons.lower_intercepts):
        rows.append(var >= cp.multiply(_np(slope), pre_var) + _np(intercept))
    if not integer:
        for slope, intercept in zip(cons.upper_slopes, cons.upper_intercepts):
            rows.append(var <= cp.multiply(_np(slope), pre_var) + _np(intercept))
        return rows
    # Big-M exact encoding: z = 1 iff the neuron is active.
    lo, up = _np(lower), _np(upper)
    z = cp.Variable(lo.size, boolean=True)
    rows += [var <= cp.multiply(np.maximum(up, 0), z), var <= pre_var - cp.multiply(lo, 1 - z)]
    # lo >= 0 forces z = 1 (also when lo = up = 0, where up > 0 alone would contradict it)
    rows += [z >= (lo >= 0).astype(float), z <= ((up > 0) | (lo >= 0)).astype(float)]
    return rows


def _build(graph: Graph, box: Interval, intervals: dict[str, Interval], b: int, integer: bool):
    """cvxpy variables and constraints of the relaxed (or exact) network for batch element b."""
    cp, sp = _cvxpy()
    variables, constraints = {}, []
    for node in graph.nodes:
        var = cp.Variable(int(np.prod(node.shape, dtype=int)))
        variables[node.name] = var
        if node.op is None:
            constraints += [var >= _np(box.lower[b]), var <= _np(box.upper[b])]
        elif isinstance(node.op, ActivationOp):
            pre_name = node.inputs[0]
            pre_var = variables[pre_name]
            constraints += _relu_constraints(
                cp, node, var, pre_var, intervals[pre_name], b, integer
            )
        elif isinstance(node.op, (UnaryAffineOp, SumOp)):
            constraints += _affine_constraints(
                cp, sp, node, var, [variables[i] for i in node.inputs]
            )
        else:
            raise UnsupportedOperationError(
                type(node.op).__name__, node.name, "the LP/MILP does not encode this operation yet"
            )
    return variables, constraints


def _solve(problem, config: LpConfig, integer: bool, deadline: float | None) -> float | None:
    """Optimal value; a MILP is solved to a zero gap (its primal value is then the minimum).
    None when `deadline` (`time.monotonic()`) passed before a solver proved optimality: a
    primal value at a time limit is not a lower bound."""
    cp, _ = _cvxpy()
    order = ["HIGHS", "CLARABEL"] if config.solver == "HIGHS" and not integer else ["HIGHS"]
    if config.solver == "CLARABEL" and not integer:
        order = ["CLARABEL", "HIGHS"]
    for solver in order:
        limit = config.time_limit
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic())
            if limit <= 0:
                return None
        try:
            if solver == "HIGHS":
                # MILP: zero gap (the primal value is then the minimum). LP: primal simplex;
                # HiGHS's default dual simplex cycled for minutes on mnist_fc 256x2 (0.5 s here).
                gap = (
                    {"mip_rel_gap": 0.0, "mip_abs_gap": 0.0} if integer else {"simplex_strategy": 4}
                )
                with _silenced_stdout():
                    problem.solve(solver=solver, time_limit=limit, output_flag=False, **gap)
            else:
                problem.solve(solver=solver, time_limit=limit)
        except cp.error.SolverError:
            continue
        if problem.status == cp.OPTIMAL:
            return float(problem.value)
    if deadline is not None and time.monotonic() >= deadline:
        return None
    raise RuntimeError(f"LP/MILP solve failed (status {problem.status})")


def _optimise(
    graph, box, C, intervals, config, integer, sides=2, deadline=None, fallback=None
) -> tuple[Tensor, dict]:
    """Minima of `C[b, s] . y` and (if `sides == 2`) `-C[b, s] . y` per batch element and spec;
    with `sides == 1` the second half is left at -inf (no bound). Solves not finished by
    `deadline` keep `fallback` (`[B, 2S]` valid bounds; -inf when None)."""
    cp, _ = _cvxpy()
    start = time.perf_counter()
    batch, specs = C.shape[:2]
    values = np.full((batch, 2 * specs), -np.inf)
    if fallback is not None:
        values[:, : sides * specs] = fallback.detach().cpu().double().numpy()[:, : sides * specs]
    flat_C = C.detach().cpu().double().reshape(batch, specs, -1).numpy()
    solved = 0
    for b in range(batch):
        if deadline is not None and time.monotonic() >= deadline:
            break
        variables, constraints = _build(graph, box, intervals, b, integer)
        c = cp.Parameter(flat_C.shape[-1])
        problem = cp.Problem(cp.Minimize(c @ variables[graph.output.name]), constraints)
        for s in range(sides * specs):
            c.value = flat_C[b, s % specs] * (1.0 if s < specs else -1.0)
            value = _solve(problem, config, integer, deadline)
            if value is None:
                break
            values[b, s] = max(value, values[b, s])
            solved += 1
    stats = {
        "seconds": time.perf_counter() - start,
        "solves": solved,
        "unsolved": batch * sides * specs - solved,
    }
    return torch.as_tensor(values, dtype=C.dtype, device=C.device), stats


def _as_bounds(values: Tensor, stats: dict, specs: int) -> tuple[Tensor, Tensor, dict]:
    """`(lower, upper, stats)` from the optima `[B, 2S]`, loosened by SAFETY (relative)."""
    safe = values - SAFETY * (1 + values.abs())
    return safe[:, :specs], -safe[:, specs:], {**stats, "raw": values}


def planet_lp(
    graph: Graph,
    box: Interval,
    C: Tensor,
    intervals: dict[str, Interval],
    config: LpConfig | None = None,
    upper: bool = True,
    deadline: float | None = None,
    fallback: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Planet LP bounds `(lower [B, S], upper [B, S], stats)` on `C . y` for the given
    pre-activation `intervals` (`upper=False`: lower bounds only, the upper ones are +inf).
    `stats['raw']` holds the unloosened optima `[B, 2S]`. Solves not finished by `deadline`
    (`time.monotonic()`) keep `fallback` (`[B, 2S]`: lower bounds of `C . y`, then of `-C . y`);
    `stats['unsolved']` counts them."""
    sides = 2 if upper else 1
    values, stats = _optimise(
        graph, box, C, intervals, config or LpConfig(), False, sides, deadline, fallback
    )
    return _as_bounds(values, stats, C.shape[1])


def milp(
    graph: Graph,
    box: Interval,
    C: Tensor,
    intervals: dict[str, Interval],
    config: LpConfig | None = None,
    deadline: float | None = None,
    fallback: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Exact bounds by MILP (tiny nets only): `(min C.y [B, S], max C.y [B, S], stats)`.

    Needs valid `intervals` for every pre-activation (they set the big-M constants); HiGHS only.
    Solves not finished by `deadline` keep `fallback`, as in `planet_lp` (they are then not
    exact: `stats['unsolved']` counts them).
    """
    config = config or LpConfig()
    values, stats = _optimise(graph, box, C, intervals, config, True, 2, deadline, fallback)
    return _as_bounds(values, stats, C.shape[1])
