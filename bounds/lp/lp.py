"""Exact references with cvxpy (HiGHS by default, Clarabel as fallback; no Gurobi).

- `planet_lp`: the LP of the relaxations (`Relaxation.constraints`: for ReLU the Planet
  triangle, Ehlers 2017; for a several-input node, e.g. a product, its planes over all its
  inputs) for given intermediate bounds: the optimum the dual methods approach.
- `milp`: the exact mixed-integer program, from each nonlinearity's linear pieces
  (`Relaxation.pieces`, disjunctive formulation over the given bounds): the true minimum, for
  tiny nets in tests.

Every affine op of the graph is encoded: unary ops by `as_matrix`, the others (sums,
concatenations, ...) by one dense matrix per input read off their adjoint (`vjp`).

Both build one problem per batch element with the objective's coefficients as a cvxpy
Parameter, so the problem is canonicalised once and re-solved per spec. Values are accurate to
the solver's tolerance (about 1e-7 relative with HiGHS; `stats['raw']`). The LP's bounds are
certified instead (Neumaier and Shcherbina's idea, Math. Prog. 2004: any dual point gives a
rigorous bound): the Lagrangian-decomposition dual at the LP's duals of the pre-activations'
equalities, evaluated with tracked rounding (`bounds.dual.certified`), equal to the LP's value
within 1e-13 on small nets. The MILP's are its optima loosened by `SAFETY` (relative): a
reference for tests, not a certified bound (a branch-and-bound tree would be its certificate).

Time: a `deadline` is checked before every solve and passed to the solver as its time limit;
solves it cuts short keep a caller's fallback bound. cvxpy's model build before the first solve
of each batch element cannot be interrupted (about a second for a 20-200-200-10 MILP here).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from bounds.dual.certified import certified_value
from bounds.dual.dag import decompose
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph
from bounds.methods.crown import interval_bound, output_functional
from bounds.ops import ActivationOp, UnaryAffineOp
from bounds.registry import MethodResult, intermediate_intervals, register_method
from bounds.types import Interval
from relaxations.base import RELU_PIECES  # None: no big-M (tests compare the two encodings)

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


def _affine_matrices(op, out_shape: tuple[int, ...]) -> tuple[list[np.ndarray], np.ndarray]:
    """`(M_i [n_out, n_in_i] per input, b [n_out])` with `y = sum_i M_i x_i + b` (flattened),
    for any affine op, from its adjoint: the rows of `M_i` are `vjp(e_r)_i`, and `b_r` is
    `bias_term(e_r)` (every unit functional at once: small nets only)."""
    op = op.to(torch.float64, "cpu")
    n_out = int(np.prod(out_shape, dtype=int))
    units = torch.eye(n_out, dtype=torch.float64).reshape(1, n_out, *out_shape)
    parts = op.vjp(units)
    matrices = [part.reshape(n_out, -1).numpy() for part in parts]
    return matrices, op.bias_term(units).reshape(-1).numpy()


def _affine_constraints(cp, sp, node, var, inputs):
    """`var == op(inputs)` for the affine op of `node` (dense matrices made sparse)."""
    if isinstance(node.op, UnaryAffineOp):
        W, b = node.op.as_matrix()
        W = sp.csr_matrix(W.detach().cpu().double().numpy())
        return [var == W @ inputs[0] + _np(b)]
    matrices, b = _affine_matrices(node.op, node.shape)
    return [var == sum(sp.csr_matrix(M) @ x for M, x in zip(matrices, inputs)) + b]


def _relaxed_constraints(cp, node, var, pre_vars, bounds):
    """The relaxation's lines on `(inputs, output)` and every input in its interval; `bounds`:
    `(lower, upper)` per input `[*shape]`."""
    rows = []
    for pre_var, (lower, upper) in zip(pre_vars, bounds):
        rows += [pre_var >= _np(lower), pre_var <= _np(upper)]
    lowers, uppers = tuple(lo for lo, _ in bounds), tuple(up for _, up in bounds)
    one = len(bounds) == 1
    cons = node.op.relaxation.constraints(*((lowers[0], uppers[0]) if one else (lowers, uppers)))

    def line(slopes, intercepts, k):
        slopes = (slopes,) if one else slopes
        terms = (cp.multiply(_full(s[k], lowers[0]), x) for s, x in zip(slopes, pre_vars))
        return sum(terms) + _full(intercepts[k], lowers[0])

    for k in range(cons.lower_intercepts.shape[0]):
        rows.append(var >= line(cons.lower_slopes, cons.lower_intercepts, k))
    for k in range(cons.upper_intercepts.shape[0]):
        rows.append(var <= line(cons.upper_slopes, cons.upper_intercepts, k))
    return rows


def _full(t: Tensor, like: Tensor) -> np.ndarray:
    """`t` broadcast to `like`'s shape, flattened float64."""
    return _np(torch.broadcast_to(t, like.shape))


def _pieces_table(relaxation, node) -> np.ndarray:
    """`[K, 4]` (start, end, slope, intercept) of the relaxation's pieces; the MILP needs them."""
    if relaxation.pieces is None:
        raise UnsupportedOperationError(
            relaxation.name, node.name,
            "the MILP needs a piecewise-linear function (Relaxation.pieces); the LP handles it",
        )  # fmt: skip
    return np.array([(p.start, p.end, p.slope, p.intercept) for p in relaxation.pieces], float)


def _exact_constraints(cp, sp, node, var, pre_var, lower: Tensor, upper: Tensor):
    """`var = sigma(pre_var)` exactly on `[lower, upper]` from the relaxation's linear pieces:
    a neuron that one piece covers is that piece's line (no binary); for the others the
    disjunctive (convex-hull) formulation over the pieces that meet `[l, u]`: one binary
    `z_k` and one copy `xh_k` in `[max(start_k, l), min(end_k, u)] z_k` per piece, with
    `sum z = 1`, `xh = sum xh_k`, `x = sum slope_k xh_k + intercept_k z_k` (Balas 1979;
    ideal: its LP relaxation is the convex hull of the function's graph over `[l, u]`)."""
    table = _pieces_table(node.op.relaxation, node)
    lo, up = _np(lower), _np(upper)
    if not (np.isfinite(lo).all() and np.isfinite(up).all()):
        raise UnsupportedOperationError(
            node.op.relaxation.name, node.name, "the MILP needs finite bounds on its input"
        )
    start, end, slope, icpt = (table[:, i : i + 1] for i in range(4))  # [K, 1]
    rows = [pre_var >= lo, pre_var <= up]
    covers = (start <= lo) & (up <= end)  # [K, n]
    single = covers.any(0)
    one = np.nonzero(single)[0]
    if one.size:
        k = covers[:, one].argmax(0)
        rows.append(var[one] == cp.multiply(slope[k, 0], pre_var[one]) + icpt[k, 0])
    many = np.nonzero(~single)[0]
    if not many.size:
        return rows
    low_k = np.maximum(start, lo[many])  # [K, m]
    high_k = np.minimum(end, up[many])
    piece, neuron = np.nonzero(low_k <= high_k)  # the (piece, neuron) pairs that meet
    count = piece.size
    gather = sp.csr_matrix((np.ones(count), (neuron, np.arange(count))), shape=(many.size, count))
    z = cp.Variable(count, boolean=True)
    xh = cp.Variable(count)
    rows += [
        gather @ z == 1,
        pre_var[many] == gather @ xh,
        var[many] == gather @ (cp.multiply(slope[piece, 0], xh) + cp.multiply(icpt[piece, 0], z)),
        xh >= cp.multiply(low_k[piece, neuron], z),
        xh <= cp.multiply(high_k[piece, neuron], z),
    ]
    return rows


def _big_m_constraints(cp, node, var, pre_var, lower: Tensor, upper: Tensor):
    """The exact encoding of ReLU's two pieces with one binary per ambiguous neuron (big-M,
    Tjeng et al. 2019): smaller and faster to build than the disjunctive one, same optimum.
    `z = 1` iff the neuron is active; stable neurons are forced (`lo >= 0`: z = 1, `up <= 0`:
    z = 0), which also covers `[0, 0]` (z = 1, x = xh = 0)."""
    lo, up = _np(lower), _np(upper)
    rows = [pre_var >= lo, pre_var <= up, var >= 0, var >= pre_var]
    z = cp.Variable(lo.size, boolean=True)
    rows += [var <= cp.multiply(np.maximum(up, 0), z), var <= pre_var - cp.multiply(lo, 1 - z)]
    rows += [z >= (lo >= 0).astype(float), z <= ((up > 0) | (lo >= 0)).astype(float)]
    return rows


def _build(graph: Graph, box: Interval, intervals: dict[str, Interval], b: int, integer: bool):
    """cvxpy variables and constraints of the relaxed (or exact) network for batch element b,
    and each affine node's defining equality (by node name: its dual certifies the LP)."""
    cp, sp = _cvxpy()
    variables, constraints, equalities = {}, [], {}
    for node in graph.nodes:
        var = cp.Variable(int(np.prod(node.shape, dtype=int)))
        variables[node.name] = var
        inputs = [variables[i] for i in node.inputs]
        if node.op is None:
            constraints += [var >= _np(box.lower[b]), var <= _np(box.upper[b])]
        elif isinstance(node.op, ActivationOp):
            bounds = [(intervals[i].lower[b].detach(), intervals[i].upper[b].detach())
                      for i in node.inputs]  # fmt: skip
            if integer and len(bounds) == 1 and RELU_PIECES and node.op.relaxation.big_m:
                constraints += _big_m_constraints(cp, node, var, inputs[0], *bounds[0])
            elif integer and len(bounds) == 1:
                constraints += _exact_constraints(cp, sp, node, var, inputs[0], *bounds[0])
            elif integer:
                _pieces_table(node.op.relaxation, node)  # raises: no pieces for several inputs
            else:
                constraints += _relaxed_constraints(cp, node, var, inputs, bounds)
        elif node.op.is_affine:
            rows = _affine_constraints(cp, sp, node, var, inputs)
            equalities[node.name] = rows[0]
            constraints += rows
        else:
            raise UnsupportedOperationError(
                type(node.op).__name__, node.name, "the LP/MILP does not encode this operation"
            )
    return variables, constraints, equalities


HIGHS_LIMIT_SHARE = 0.5  # of the time left, given to HiGHS as its time limit under a deadline


def _solve(problem, config: LpConfig, integer: bool, deadline: float | None) -> float | None:
    """Optimal value; a MILP is solved to a zero gap (its primal value is then the minimum).
    None when `deadline` (`time.monotonic()`) passed before a solver proved optimality (a
    primal value at a time limit is not a lower bound), or when no solver could solve it
    (intervals of 1e30 are beyond HiGHS's infinity of 1e20: its status is then unknown or
    unbounded), with a warning: the caller keeps its fallback bound."""
    cp, _ = _cvxpy()
    order = ["HIGHS", "CLARABEL"] if config.solver == "HIGHS" and not integer else ["HIGHS"]
    if config.solver == "CLARABEL" and not integer:
        order = ["CLARABEL", "HIGHS"]
    for solver in order:
        limit = config.time_limit
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # HiGHS checks its time limit only now and then (measured: a MILP solve of 2.75 s
            # at a limit of 1.99 s, in presolve and the root LP); a share of the time left
            # keeps the budget
            limit = min(limit, HIGHS_LIMIT_SHARE * left if solver == "HIGHS" else left)
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
        except (cp.error.SolverError, ValueError):  # ValueError: cvxpy cannot unpack the status
            continue
        if problem.status == cp.OPTIMAL:
            return float(problem.value)
        if deadline is not None and problem.status == cp.USER_LIMIT:
            return None  # stopped at its share of the time left: the budget is spent
    if deadline is None or time.monotonic() < deadline:
        warnings.warn(
            f"the LP/MILP solvers could not solve this problem (status {problem.status}); "
            "its fallback bound is kept",
            RuntimeWarning,
            stacklevel=2,
        )
    return None


def _optimise(
    graph, box, C, intervals, config, integer, sides=2, deadline=None, fallback=None,
    duals_of: tuple[str, ...] = (), reserve: Callable[[int], float] | None = None,
) -> tuple[Tensor, dict]:  # fmt: skip
    """Minima of `C[b, s] . y` and (if `sides == 2`) `-C[b, s] . y` per batch element and spec;
    with `sides == 1` the second half is left at -inf (no bound). Solves not finished by
    `deadline` keep `fallback` (`[B, 2S]` valid bounds; -inf when None). `duals_of`: affine
    nodes whose equality's dual is returned in `stats['duals']` (`{name: [B, 2S, n]}`, 0 where
    not solved; with cvxpy's sign the Lagrangian adds `dual . (var - affine)`). `reserve(n)`:
    the seconds kept back from `deadline` for work after the solves once `n` are solved (a
    solve ends by `deadline - reserve(solved + 1)`). `stats['solved']`: `[B, 2S]` booleans."""
    cp, _ = _cvxpy()
    start = time.perf_counter()
    batch, specs = C.shape[:2]
    values = np.full((batch, 2 * specs), -np.inf)
    duals = {n: np.zeros((batch, 2 * specs, int(np.prod(graph[n].shape, dtype=int))))
             for n in duals_of}  # fmt: skip
    if fallback is not None:
        values[:, : sides * specs] = fallback.detach().cpu().double().numpy()[:, : sides * specs]
    flat_C = C.detach().cpu().double().reshape(batch, specs, -1).numpy()
    solved, done = 0, np.zeros((batch, 2 * specs), dtype=bool)

    def until() -> float | None:  # the deadline of the next solve
        if deadline is None or reserve is None:
            return deadline
        return deadline - reserve(solved + 1)

    durations: list[float] = []  # each solve's seconds (the first with cvxpy's compilation)

    def out_of_time() -> bool:  # the next solve, as long as the longest, would end too late
        return deadline is not None and time.monotonic() + max(durations, default=0.0) >= until()

    stop = False
    for b in range(batch):
        if stop or out_of_time():
            break
        variables, constraints, equalities = _build(graph, box, intervals, b, integer)
        c = cp.Parameter(flat_C.shape[-1])
        problem = cp.Problem(cp.Minimize(c @ variables[graph.output.name]), constraints)
        for s in range(sides * specs):
            if out_of_time():
                stop = True
                break
            c.value = flat_C[b, s % specs] * (1.0 if s < specs else -1.0)
            tick = time.monotonic()
            value = _solve(problem, config, integer, until())
            durations.append(time.monotonic() - tick)
            if value is None:  # past the deadline, or not solvable: the fallback stays
                # a solve stopped at its time limit: the budget is spent
                stop = deadline is not None and problem.status == cp.USER_LIMIT
                if stop:
                    break
                continue
            values[b, s] = max(value, values[b, s])
            for name in duals_of:
                dual = equalities[name].dual_value if name in equalities else None
                if dual is not None:
                    duals[name][b, s] = np.asarray(dual, dtype=float).reshape(-1)
            solved += 1
            done[b, s] = True
    stats = {
        "seconds": time.perf_counter() - start,
        "solves": solved,
        "unsolved": batch * sides * specs - solved,
        "solved": torch.as_tensor(done, device=C.device),
    }
    if duals_of:
        stats["duals"] = {n: torch.as_tensor(d, dtype=C.dtype, device=C.device)
                          for n, d in duals.items()}  # fmt: skip
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
    net = decompose(graph)
    pres = tuple(dict.fromkeys(e.pre for e in net.edges))
    c = output_functional(graph, C)
    batch, specs = C.shape[:2]
    reserve = None
    if deadline is not None:  # one row's certification, timed, predicts those of the solves
        tick = time.monotonic()
        zeros = [c.new_zeros(1, 1, *graph[e.pre].shape) for e in net.edges]
        certified_value(net, _row(box, 0), _rows(intervals, 0), c[:1, :1], zeros)
        per_row = time.monotonic() - tick
        reserve = lambda n: per_row * n  # noqa: E731
    values, stats = _optimise(
        graph, box, C, intervals, config or LpConfig(), False, sides, deadline, fallback, pres,
        reserve,
    )  # fmt: skip
    # The LP optimum is accurate to the solver's tolerance only; the bound reported is the
    # Lagrangian-decomposition dual at the LP's duals of the pre-activations' equalities
    # (weak duality for any multipliers; at the LP's optimal ones it is the LP's optimum),
    # certified in floating point (`bounds.dual.certified`), for the solved specs only.
    duals = stats.pop("duals", {})  # none without activations
    rho = [duals[e.pre].reshape(batch, 2 * specs, *graph[e.pre].shape) for e in net.edges]
    certified = c.new_full((batch, 2 * specs), -torch.inf)
    for b in range(batch):
        index = stats["solved"][b].nonzero().flatten()
        if index.numel():
            rows = [r[b : b + 1].index_select(1, index) for r in rho]
            found = certified_value(
                net, _row(box, b), _rows(intervals, b), c[b : b + 1].index_select(1, index), rows
            )
            certified[b, index] = found[0]
    if fallback is not None:
        certified = torch.maximum(certified, fallback.to(certified))
    certified[:, sides * specs :] = -torch.inf  # not asked for
    return certified[:, :specs], -certified[:, specs:], {**stats, "raw": values}


def _row(interval: Interval, b: int) -> Interval:
    """Batch element `b` of an interval (one shared by the batch stays as it is)."""
    pick = lambda t: t[b : b + 1] if t.shape[0] > 1 else t  # noqa: E731
    return Interval(pick(interval.lower), pick(interval.upper))


def _rows(intervals: dict[str, Interval], b: int) -> dict[str, Interval]:
    return {name: _row(iv, b) for name, iv in intervals.items()}


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

    Needs valid `intervals` for every pre-activation (they bound the pieces); HiGHS only.
    UnsupportedOperationError naming the node for a nonlinearity without `pieces`.
    Solves not finished by `deadline` keep `fallback`, as in `planet_lp` (they are then not
    exact: `stats['unsolved']` counts them).
    """
    config = config or LpConfig()
    values, stats = _optimise(graph, box, C, intervals, config, True, 2, deadline, fallback)
    return _as_bounds(values, stats, C.shape[1])


def _reference(solve):
    """The LP or MILP method: intermediate bounds, then one solve per spec and side. With a
    seconds budget, the solves left when it runs out keep the interval bound of the output
    (sound, looser); `stats['unsolved']` counts them."""

    def run(graph, box, C, config, budget, given, exact=True) -> MethodResult:  # always exact
        start = time.monotonic()
        deadline = start + budget.seconds if budget is not None and budget.seconds else None
        intervals = intermediate_intervals(
            graph, box, C, config.intermediate, config.intermediate_iterations, given, deadline
        )
        fallback = interval_bound(C, intervals[graph.output.name])
        lower, upper, stats = solve(
            graph, box, C, intervals, config, deadline=deadline, fallback=fallback
        )
        return lower, upper, intervals, {"solves": stats["solves"], "unsolved": stats["unsolved"]}

    return run


register_method("lp", LpConfig, "LP of the relaxations for the chosen intermediate bounds (cvxpy)")(
    _reference(planet_lp)
)
register_method("milp", LpConfig, "exact MILP from the relaxations' pieces (tiny nets)")(
    _reference(milp)
)


register_method("lp", LpConfig, "LP of the relaxations for the chosen intermediate bounds (cvxpy)")(
    _reference(planet_lp)
)
register_method("milp", LpConfig, "exact MILP from the relaxations' pieces (tiny nets)")(
    _reference(milp)
)
