"""Saddle-point Frank-Wolfe (SP-FW) on the Anderson relaxation (De Palma, Behl, Bunel, Torr,
Kumar, "Scaling the Convex Barrier with Sparse Dual Algorithms", JMLR 2024, arXiv 2101.05844,
Sec. 5; `../shared/ALGORITHMS.md`, Sec. 1b), with linear memory.

The Lagrangian of `bounds.dual.anderson` is linear in the primal `(x, z)` (boxes) and in the
duals. With the duals boxed, `alpha_k` in `[0, M_alpha]` and, per neuron, its betas (Big-M's
two and every `A_I`) in the scaled simplex `{beta >= 0, sum_I beta_I <= M_beta}`, it is a
bilinear saddle-point problem over compact sets, and every block moves by Frank-Wolfe steps
`(1 - gamma_t) current + gamma_t lmo` with `gamma_t = 1 / (gamma_start + t)`:
- alpha: `M_alpha` where `x >= xh` is violated at the primal iterate, else 0;
- beta: mass `M_beta` on the most violated of {Big-M upper, Big-M lower, the oracle's A_I}
  (`anderson.most_violated`'s rule, here in chunks with the vertex's sums accumulated) if it
  is violated, else 0;
- x: the box end by the sign of `f`, z: by the sign of `g` (the Lagrangian's minimiser at the
  dual iterate; `statistics_value`).
The primal iterate averages the minimisers, so its `z` is fractional and the oracle finds the
Anderson constraints that Big-M's integral minimisers never violate. The betas are kept only
through sums per layer (`Statistics`), which is all the dual value needs: memory is linear in
the network, with no mask per constraint. `M` starts at `m_factor` times the Big-M duals per
neuron (a hundredth of the problem's largest where they are 0) and doubles where an iterate
reaches 0.99 M (on the device, no host sync).

Start: the Big-M duals of `active_set.solve` with `BigMConfig` (projected Adam from the
CROWN / alpha-CROWN duals `init`); the primal iterate starts at the Lagrangian's minimiser
there. Anytime: every dual iterate is a valid bound (nonnegative multipliers of valid
constraints), the best per problem is kept with its sums and re-evaluated at the end; the
result is never below the Big-M start's (float64-checked) bound.

Precision: the sums cannot be re-derived at the end (there are no masks to recompute them
from), so the whole loop runs in float64 whatever the problem's dtype; the reported bound is
the float64 value at the best sums, rounded down to the problem's dtype.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.compile import should_compile, step_function
from bounds.dual import active_set
from bounds.dual.active_set import BigMConfig
from bounds.dual.anderson.cuts import Cuts, cut_terms, no_cuts
from bounds.dual.anderson.evaluation import AndersonDuals, Primal
from bounds.dual.anderson.problem import AndersonProblem
from bounds.dual.anderson.separation import candidates
from bounds.dual.anytime import Best, Clock, DecompositionOptions
from bounds.dual.intermediate import anderson_intermediate
from bounds.dual.method_start import anderson_method
from bounds.methods.pacing import deadline_of
from bounds.registry import Relaxation, register_method
from bounds.types import Budget, rounded_down


@dataclass(frozen=True)
class SpFwConfig(DecompositionOptions):
    """iterations: SP-FW steps (a budget overrides); big_m_iterations: Adam steps of the Big-M
    start (`active_set.BigMConfig`, its own step schedule); gamma_start: the step is
    `1 / (gamma_start + t)`; m_factor: the dual box `M` as a multiple of the Big-M duals;
    chunk: elements per chunk of the oracle's `[B, S, neurons, fan-in]` pass. Shared options:
    `DecompositionOptions`."""

    iterations: int = 500
    big_m_iterations: int = 100
    gamma_start: float = 10.0
    m_factor: float = 1.1
    chunk: int = 1 << 22

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.iterations < 0 or self.big_m_iterations < 0:
            raise ValueError("iterations and big_m_iterations must be >= 0")
        if not self.gamma_start >= 1:
            raise ValueError(f"gamma_start must be >= 1 (steps in (0, 1]), got {self.gamma_start}")
        if not self.m_factor >= 1:
            raise ValueError(f"m_factor must be >= 1, got {self.m_factor}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")


class Statistics(NamedTuple):
    """The Anderson duals with the betas through their sums (JMLR 2024, Sec. 5: the
    sufficient statistics of beta), per hidden layer k: `alpha` `[B, S, n_k]`; `beta`
    `[B, S, n_k]`, `sum_I beta_{k,I}` per neuron; `beta_W` `[B, S, n_{k-1}]`,
    `sum_I (W_k . I)^T beta_{k,I}`; `beta_kappa`, `beta_zeta` `[B, S, n_k]`,
    `sum_I beta_{k,I} kappa_I` and `sum_I beta_{k,I} zeta_I` per neuron. The sums run over
    Big-M's two constraints as well (`x <= u z`: no `W`, kappa 0, zeta `u`; `x <= xh - l (1 -
    z)`: `W`, kappa `b - l`, zeta `l`). For an `A_I`, kappa and zeta are ALGORITHMS.md's last
    two sums (`kappa_I = -(W . I) L`, `zeta_I = b + (W . (1 - I)) U + (W . I) L`); Big-M's
    use the pre-activation bounds, which those two sums cannot express."""

    alpha: tuple[Tensor, ...]
    beta: tuple[Tensor, ...]
    beta_W: tuple[Tensor, ...]
    beta_kappa: tuple[Tensor, ...]
    beta_zeta: tuple[Tensor, ...]

    def flat(self) -> tuple[Tensor, ...]:
        return (*self.alpha, *self.beta, *self.beta_W, *self.beta_kappa, *self.beta_zeta)

    @staticmethod
    def unflat(t: tuple[Tensor, ...]) -> Statistics:
        h = len(t) // 5
        return Statistics(*(tuple(t[i * h : (i + 1) * h]) for i in range(5)))

    def to(self, dtype: torch.dtype) -> Statistics:
        return Statistics.unflat(tuple(t.to(dtype) for t in self.flat()))

    def where(self, mask: Tensor, other: Statistics) -> Statistics:
        """Per problem (`mask` `[B, S]`): these sums where True, `other`'s elsewhere."""
        m = mask.unsqueeze(-1)
        return Statistics.unflat(
            tuple(torch.where(m, a, b) for a, b in zip(self.flat(), other.flat()))
        )

    def towards(self, vertex: Statistics, gamma: Tensor) -> Statistics:
        """The Frank-Wolfe step `(1 - gamma) self + gamma vertex` (the sums are linear in beta)."""
        return Statistics.unflat(
            tuple(a + gamma * (v - a) for a, v in zip(self.flat(), vertex.flat()))
        )


def _scatter(rows: Tensor, values: Tensor, n: int) -> Tensor:
    """`[B, S, n]` with `values` `[B, S, R]` summed into their `rows` `[B, S, R]`."""
    return values.new_zeros(*values.shape[:2], n).scatter_add(2, rows, values)


def _box_min(f: Tensor, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
    """`(min over the box [lower, upper] ([B, n]) of f . x, its minimiser)`."""
    x = torch.where(f >= 0, lower.unsqueeze(1), upper.unsqueeze(1))
    return (f * x).sum(-1), x


def statistics_from_duals(
    p: AndersonProblem, cuts: tuple[Cuts, ...], d: AndersonDuals
) -> Statistics:
    """The sums of the duals `d` (Big-M's and the cuts `cuts`' multipliers, as
    `anderson.evaluate` takes them)."""
    layers = p.layers
    out: list[list[Tensor]] = [[], [], [], [], []]
    for k in range(layers.hidden):
        n, b = layers.width(k), layers.biases[k]
        lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
        terms, rows, cut = cut_terms(p, k, cuts[k]), cuts[k].rows, d.beta_cut[k]
        out[0].append(d.alpha[k])
        out[1].append(d.beta_u[k] + d.beta_l[k] + _scatter(rows, cut, n))
        out[2].append(layers.adjoint(k, d.beta_l[k]) + torch.einsum("bsr,bsri->bsi", cut, terms.WI))
        out[3].append(d.beta_l[k] * (b - lo) + _scatter(rows, cut * terms.kappa, n))
        out[4].append(d.beta_u[k] * up + d.beta_l[k] * lo + _scatter(rows, cut * terms.zeta, n))
    return Statistics(*(tuple(o) for o in out))


def lagrangian_coefficients(
    p: AndersonProblem, s: Statistics
) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The Lagrangian at the duals whose sums are `s` as a function of the primal: its
    constant `[B, S]`, the coefficients `f` of every `x` (the input's first, then each hidden
    layer's output, `[B, S, n]`) and `g` (`-g` is the coefficient of `z`, per hidden layer):

        L = const + sum_k f_k . x_k - sum_k g_k . z_k,
        const = c . b_H + sum_k (alpha_k . b_k - 1 . beta_kappa_k),
        f_k = W_{k+1}^T alpha_{k+1} - beta_W_{k+1} - alpha_k + beta_k   (c for alpha_H),
        g_k = beta_zeta_k

    (JMLR 2024, Sec. 5; ALGORITHMS.md 1b, with the betas through their sums)."""
    layers, b = p.layers, p.layers.biases
    H = layers.hidden
    const = (p.c * b[H]).sum(-1)
    above = layers.adjoint(H, p.c)
    fs: list[Tensor | None] = [None] * (H + 1)
    for k in range(H - 1, -1, -1):
        fs[k + 1] = above - s.alpha[k] + s.beta[k]
        const = const + (s.alpha[k] * b[k]).sum(-1) - s.beta_kappa[k].sum(-1)
        above = layers.adjoint(k, s.alpha[k]) - s.beta_W[k]
    fs[0] = above
    return const, tuple(fs), tuple(s.beta_zeta)


def statistics_value(p: AndersonProblem, s: Statistics) -> tuple[Tensor, Primal]:
    """The dual value `d` `[B, S]` at the duals whose sums are `s`, and the Lagrangian's
    minimiser: the minimum of `lagrangian_coefficients`' linear function over the boxes,

        d = const + sum_k min_{x_k in [lb_k, ub_k]} f_k . x_k - sum_k 1 . [g_k]_+,

    at `x* = lb` where `f >= 0` (else `ub`), `z* = 1[g >= 0]`. It equals `anderson.evaluate`
    at any duals with these sums (`statistics_from_duals`), and is a valid lower bound
    whenever the sums are those of nonnegative multipliers of valid constraints."""
    value, fs, gs = lagrangian_coefficients(p, s)
    xs = []
    for f, lo, up in zip(fs, p.x_lower, p.x_upper):
        box_value, x = _box_min(f, lo, up)
        value = value + box_value
        xs.append(x)
    zs = tuple((g >= 0).to(g.dtype) for g in gs)
    value = value - sum(torch.relu(g).sum(-1) for g in gs)
    return value, Primal(tuple(xs), zs)


class Rows(NamedTuple):
    """The oracle's data for one hidden layer, fixed for a problem: the candidate (ambiguous)
    neurons `index` `[B, R]` (`anderson.candidates`), `real` `[B, 1, R]` (False on padding),
    their weight rows `W` `[B, R, n_in]`, `WL` (`W_ij L_ij`, `AndersonProblem.ends`), `span`
    (`W_ij (U_ij - L_ij) >= 0`), both side by side in `ends` `[B, R, n_in, 2]`, and `top`
    `[B, R]` (`b_i + sum_j W_ij U_ij`)."""

    index: Tensor
    real: Tensor
    W: Tensor
    WL: Tensor
    span: Tensor
    ends: Tensor
    top: Tensor


def candidate_rows(p: AndersonProblem, k: int) -> Rows:
    index = candidates(p, k)
    lo, up = torch.gather(p.pre_lower[k], 1, index), torch.gather(p.pre_upper[k], 1, index)
    W = p.layers.rows(k, index)
    WL, WU = p.ends(k, W)
    top = p.layers.biases[k][index] + WU.sum(-1)
    span = WU - WL
    real = ((lo < 0) & (up > 0)).unsqueeze(1)
    return Rows(index, real, W, WL, span, torch.stack([WL, span], -1), top)


def _cut_vertex(
    p: AndersonProblem, k: int, rows: Rows, x_in: Tensor, x_out: Tensor, z: Tensor,
    big_m: Tensor, m_beta: Tensor, chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The oracle's most violated `A_I` per candidate neuron at `(x_in, x_out, z)` (Anderson et
    al. 2020, Prop. 3: `j in I` iff `W_ij (L_ij (1 - z) + U_ij z - x_j) >= 0`), and the beta
    LMO's part on them: the cut takes the mass `m_beta` where it is violated more than
    `big_m` (the larger Big-M violation). Returns `(wins [B, S, R], sum of m (W . I)^T
    [B, S, n_in], m kappa_I [B, S, R], m zeta_I [B, S, R])`, computed in chunks of neurons
    (about `chunk` elements each), the masks never kept.

    With `delta_j = W_ij x_j - W_ij L_ij - z W_ij (U_ij - L_ij)` (the oracle's two terms'
    difference), `j in I` iff `delta_j <= 0`, the least right-hand side is `z (b + sum_j W_ij
    U_ij) + sum_j min(delta_j, 0)`, `kappa_I = -sum_{j in I} W_ij L_ij` and `zeta_I = b +
    sum_j W_ij U_ij - sum_{j in I} W_ij (U_ij - L_ij)`."""
    B, S = x_out.shape[:2]
    n_in, R = x_in.shape[-1], rows.index.shape[1]
    step = max(1, chunk // max(1, B * S * n_in))
    beta_W = x_in.new_zeros(B, S, n_in)
    x_rows = x_in.unsqueeze(1)  # [B, 1, S, n_in]: the chunk's tensors are [B, r, S, n_in]
    wins, kappas, zetas = [], [], []
    for start in range(0, R, step):
        part = slice(start, start + step)
        idx = rows.index[:, part]
        at = idx.unsqueeze(1).expand(B, S, idx.shape[1])
        W, top = rows.W[:, part].unsqueeze(2), rows.top[:, part].unsqueeze(1)
        zz = torch.gather(z, 2, at)
        delta = W * x_rows
        delta.sub_(rows.WL[:, part].unsqueeze(2))
        delta.addcmul_(zz.transpose(1, 2).unsqueeze(-1), rows.span[:, part].unsqueeze(2), value=-1)
        chosen = (delta <= 0).to(x_in.dtype)  # the mask of I
        rhs = zz * top + delta.clamp_max_(0).sum(-1).transpose(1, 2)
        violation = torch.gather(x_out, 2, at) - rhs
        win = rows.real[:, :, part] & (violation > torch.gather(big_m, 2, at).clamp_min(0))
        mass = torch.gather(m_beta, 2, at) * win
        in_I = torch.matmul(chosen, rows.ends[:, part]).transpose(1, 2)  # [B, S, r, 2]
        chosen.mul_(mass.transpose(1, 2).unsqueeze(-1)).mul_(W)
        beta_W = beta_W + chosen.sum(1)
        wins.append(win)
        kappas.append(-mass * in_I[..., 0])
        zetas.append(mass * (top - in_I[..., 1]))
    if not wins:
        empty = x_out.new_zeros(B, S, 0)
        return empty.bool(), beta_W, empty, empty
    return torch.cat(wins, 2), beta_W, torch.cat(kappas, 2), torch.cat(zetas, 2)


def dual_vertex(
    p: AndersonProblem, rows: tuple[Rows, ...], x: tuple[Tensor, ...], z: tuple[Tensor, ...],
    m_alpha: tuple[Tensor, ...], m_beta: tuple[Tensor, ...], chunk: int = 1 << 22,
) -> Statistics:  # fmt: skip
    """The dual LMO at the primal point `(x, z)`: the sums of the vertex of the dual boxes
    that maximises the Lagrangian there (its gradient in the duals is the constraints'
    violations): `alpha = M_alpha 1[xh > x]`, and per neuron the mass `M_beta` on the most
    violated of Big-M upper, Big-M lower and the oracle's `A_I`, none if none is violated."""
    layers = p.layers
    out: list[list[Tensor]] = [[], [], [], [], []]
    for k in range(layers.hidden):
        n, b = layers.width(k), layers.biases[k]
        lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
        x_in, x_out, zk, m = x[k], x[k + 1], z[k], m_beta[k]
        xh = layers.forward(k, x_in)
        upper = x_out - up * zk  # violation of x <= u z
        lower = x_out - xh + lo * (1 - zk)  # violation of x <= xh - l (1 - z)
        big_m = torch.maximum(upper, lower)
        r = rows[k]
        wins, cut_W, cut_kappa, cut_zeta = _cut_vertex(p, k, r, x_in, x_out, zk, big_m, m, chunk)
        at = r.index.unsqueeze(1).expand_as(wins)
        cut = _scatter(at, wins.to(m.dtype), n) > 0
        take_u = ~cut & (upper > 0) & (upper >= lower)
        take_l = ~cut & (lower > 0) & (lower > upper)
        mass_u, mass_l = m * take_u, m * take_l
        out[0].append(m_alpha[k] * (xh > x_out))
        out[1].append(m * (cut | take_u | take_l))
        out[2].append(layers.adjoint(k, mass_l) + cut_W)
        out[3].append(mass_l * (b - lo) + _scatter(at, cut_kappa, n))
        out[4].append(mass_u * up + mass_l * lo + _scatter(at, cut_zeta, n))
    return Statistics(*(tuple(o) for o in out))


class State(NamedTuple):
    """The dual iterate (its sums) with its boxes' `M` per neuron, the primal iterate `(x, z)`,
    the primal LMO (the Lagrangian's minimiser at the dual iterate), the step count, and the
    best `d` per problem `[B, S]` with its sums."""

    duals: Statistics
    m_alpha: tuple[Tensor, ...]
    m_beta: tuple[Tensor, ...]
    x: tuple[Tensor, ...]
    z: tuple[Tensor, ...]
    lmo_x: tuple[Tensor, ...]
    lmo_z: tuple[Tensor, ...]
    t: Tensor
    best_value: Tensor
    best: Statistics


def _mix(current: tuple[Tensor, ...], lmo: tuple[Tensor, ...], gamma: Tensor):
    return tuple(c + gamma * (v - c) for c, v in zip(current, lmo))


def _doubled(values: tuple[Tensor, ...], caps: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """`M` doubled where the iterate reached 0.99 M."""
    return tuple(torch.where(v >= 0.99 * m, 2 * m, m) for v, m in zip(values, caps))


def sp_fw_step(
    p: AndersonProblem, rows: tuple[Rows, ...], state: State, gamma_start: float, chunk: int
) -> State:
    """One SP-FW step on every block at once: the dual LMO at the primal iterate, the primal
    LMO (kept from the last evaluation) at the dual iterate, both moved by
    `gamma_t = 1 / (gamma_start + t)`, `M` doubled where reached, then `d` at the new duals
    (its minimiser is the next primal LMO) and the best-so-far update (pure: compilable)."""
    gamma = 1.0 / (gamma_start + state.t)
    vertex = dual_vertex(p, rows, state.x, state.z, state.m_alpha, state.m_beta, chunk)
    duals = state.duals.towards(vertex, gamma)
    x = _mix(state.x, state.lmo_x, gamma)
    z = _mix(state.z, state.lmo_z, gamma)
    m_alpha = _doubled(duals.alpha, state.m_alpha)
    m_beta = _doubled(duals.beta, state.m_beta)
    value, minimiser = statistics_value(p, duals)
    improved = value > state.best_value
    return State(
        duals, m_alpha, m_beta, x, z, minimiser.x, minimiser.z, state.t + 1,
        torch.where(improved, value, state.best_value), duals.where(improved, state.best),
    )  # fmt: skip


def initial_caps(values: tuple[Tensor, ...], factor: float) -> tuple[Tensor, ...]:
    """`M` per neuron from starting duals (JMLR 2024, Sec. 5: from the Big-M solution):
    `factor` times the value, or a hundredth of the largest value of the problem (over every
    layer) where it is (almost) 0; at least the smallest positive normal number."""
    top = torch.stack([v.amax(-1) for v in values]).amax(0).unsqueeze(-1)  # [B, S, 1]
    tiny = torch.finfo(top.dtype).tiny
    return tuple(torch.where(v > 1e-8 * top, factor * v, top / 100).clamp_min(tiny) for v in values)


@dataclass(frozen=True)
class SpFwResult:
    """lower `[B, S]` (float64, rounded down to the problem's dtype; never below `big_m`), the
    best duals' sums (float64), the Big-M start's bound and result, and stats."""

    lower: Tensor
    duals: Statistics
    big_m: active_set.ActiveSetResult
    stats: dict

    @property
    def certificate(self) -> tuple[AndersonDuals, tuple[Cuts, ...]]:
        """The Big-M start's duals and cuts: the sums of beta (`Statistics`) cannot be checked
        per constraint, so `lower` itself is not certifiable in floating point."""
        return self.big_m.certificate


def solve(
    p: AndersonProblem, config: SpFwConfig, init: AndersonDuals, budget: Budget | None = None,
    deadline: float | None = None,
) -> SpFwResult:  # fmt: skip
    """Maximise `d` from `init` (Big-M duals, e.g. `active_set.big_m_from_slopes`; module
    docstring): `config.big_m_iterations` of the Big-M solver, then SP-FW. The budget's
    iterations count SP-FW steps; its seconds and `deadline` (`time.monotonic()`), whichever
    is first, hold for both phases (paced every iteration, host clock only)."""
    deadline = deadline_of(budget, deadline)
    begin = time.perf_counter()
    big_m_config = BigMConfig(
        iterations=config.big_m_iterations, check_every=config.check_every,
        compile=config.compile,
    )  # fmt: skip
    big_m = active_set.solve(p, big_m_config, init, None, deadline)
    clock = Clock.from_budget(budget, config.iterations, config.check_every, deadline)
    H = p.layers.hidden
    if H == 0:  # an affine network: Big-M's value is exact
        return SpFwResult(big_m.lower, Statistics((), (), (), (), ()), big_m, clock.stats(0))
    tick = time.monotonic()
    work = p if p.c.dtype == torch.float64 else p.to(torch.float64)
    start = statistics_from_duals(
        work, tuple(no_cuts(work, k) for k in range(H)), big_m.duals.to(torch.float64)
    )
    value, minimiser = statistics_value(work, start)
    rows = tuple(candidate_rows(work, k) for k in range(H))  # fixed: no host sync in the loop
    state = State(
        start, initial_caps(start.alpha, config.m_factor),
        initial_caps(start.beta, config.m_factor), minimiser.x, minimiser.z, minimiser.x,
        minimiser.z, value.new_zeros(()), value, start,
    )  # fmt: skip
    clock.pace(reserve=2 * (time.monotonic() - tick))
    use = should_compile(config.compile, p.c.device, cpu_default=False)
    step = step_function(sp_fw_step, use, deadline=clock.loop_deadline())
    done = 0
    for it in range(clock.iterations):
        state = step(work, rows, state, config.gamma_start, config.chunk)
        done = it + 1
        if clock.checkpoint(it, Best(state.best_value, None)):
            break
    value, _ = statistics_value(work, state.best)  # the kept sums, evaluated afresh
    lower = torch.maximum(rounded_down(value, p.c.dtype), big_m.lower)
    stats = clock.stats(done)
    stats["big_m_iterations"] = big_m.stats["iterations"]
    stats["big_m_seconds"] = big_m.stats["solver_seconds"]
    stats["seconds"] = time.perf_counter() - begin
    return SpFwResult(lower, state.best, big_m, stats)


register_method(
    "sp-fw", SpFwConfig,
    "Anderson relaxation by saddle-point Frank-Wolfe, linear memory (ReLU chains)",
    intermediate=anderson_intermediate(solve, SpFwConfig, active_set.big_m_from_slopes),
    root_intermediate=True, relaxation=Relaxation.ANDERSON,
)(anderson_method(solve, active_set.big_m_from_slopes))  # fmt: skip
