"""Dual active-set solver of the Anderson relaxation (De Palma, Behl, Bunel, Torr, Kumar,
"Scaling the Convex Barrier with Active Sets", ICLR 2021, Sec. 3.2; JMLR 2024, Sec. 4), with
the Big-M dual as its first phase (`max_cuts = 0`: the Big-M solver alone, whose optimum is the
Planet LP's).

- Start: the Big-M duals that reproduce a CROWN / alpha-CROWN bound exactly
  (`big_m_from_slopes`: `d` at them equals that bound with the same lines and intervals).
- Projected Adam (betas 0.9, 0.999; `bounds.optim.adam_ascent`) on every dual,
  each layer's multipliers normalised by their starting scale (Adam's steps are absolute; the
  duals of different layers and networks differ by orders of magnitude), the step decaying
  linearly from `initial_step` to `final_step`.
- After `big_m_iterations`, and then every `cut_frequency` iterations until `max_cuts` rounds,
  the separation oracle runs at the average of the Lagrangian's minimisers since the last
  round (the minimisers themselves have `z` in {0, 1}, where no Anderson constraint is more
  violated than Big-M's; their average estimates a primal solution) and adds, per problem and
  neuron (the `restrict` most violated when set), the most violated constraint whose violation
  exceeds Big-M's by `tolerance`; its multiplier starts at 0.
- Stable neurons (`l >= 0` or `u <= 0`) are not optimised (`exact_stable`): every
  evaluation sets their duals to CROWN's exact pass-through of the coefficient from above
  (`anderson.evaluate_stable`). Left free, Adam's steps of `lr` times the layer's scale move
  all of them at once, off `f = 0`, and each pays `|f| (ub - lb)`; from an alpha-CROWN start
  the iterates then stay below the start for most of a short run (measured: 0 of 9 specs of
  mnist 256x2 prop_7 above the Planet LP after 100 iterations; 9 of 9 with them exact).
- Each round drops the earlier rounds' cuts whose multiplier is 0 at the current, the best
  and the start duals (`prune`). Convolutions' cuts are kept on each row's kernel window
  (`CutTerms.support`): the oracle, the terms and the products cost F, not n_in, per cut.
- Anytime: the best `d` per problem with its duals; the reported bound is `d` at them
  re-evaluated in float64 (never a running value), and never below the start's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.compile import should_compile, step_function
from bounds.dual.anderson.cuts import (
    Cuts,
    CutTerms,
    add_cuts,
    cut_terms,
    gather_slots,
    layer_support,
    no_cuts,
    row_support,
    sparse_terms,
)
from bounds.dual.anderson.evaluation import (
    AndersonDuals,
    dual_value,
    evaluate,
    evaluate_stable,
    slacks,
)
from bounds.dual.anderson.problem import AndersonProblem
from bounds.dual.anderson.separation import candidate_rows, candidates, select_cuts_at
from bounds.dual.anytime import Best, Clock, DecompositionOptions, linear_step
from bounds.dual.intermediate import anderson_intermediate
from bounds.dual.method_start import anderson_method
from bounds.optim import adam_ascent
from bounds.registry import Relaxation, register_method
from bounds.types import Budget, rounded_down


@dataclass(frozen=True)
class ActiveSetConfig(DecompositionOptions):
    """iterations: Adam steps in all (a budget overrides); big_m_iterations: before the first
    cut round; cut_frequency: iterations between rounds; max_cuts: rounds (one constraint per
    neuron each; 0: the Big-M solver); restrict: cuts per layer and problem (the most violated
    neurons; None: every ambiguous neuron), for memory; initial_step / final_step: Adam's
    relative step, linearly decayed; tolerance: the violation (relative to the neuron's
    pre-activation range) a cut must exceed Big-M's by; exact_stable: the stable neurons' duals
    are not optimised but set to CROWN's exact pass-through in every evaluation
    (`anderson.evaluate_stable`; Adam's steps on them only lose bound); prune: at each round,
    drop the cuts of earlier rounds whose multiplier is 0 at the current, the best and the
    start duals (they change no value; each costs a masked row in every iteration). Shared
    options: `DecompositionOptions`."""

    iterations: int = 100
    big_m_iterations: int = 10
    cut_frequency: int = 15
    max_cuts: int = 6
    restrict: int | None = 32
    initial_step: float = 0.4
    final_step: float = 1e-2
    tolerance: float = 1e-4
    exact_stable: bool = True
    prune: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        counts = (self.iterations, self.big_m_iterations, self.max_cuts)
        if min(counts) < 0 or self.cut_frequency < 1:
            raise ValueError(
                "iterations, big_m_iterations and max_cuts must be >= 0, cut_frequency >= 1"
            )
        if self.restrict is not None and self.restrict < 1:
            raise ValueError(f"restrict must be None or >= 1, got {self.restrict}")
        if not (self.initial_step > 0 and self.final_step > 0 and self.tolerance >= 0):
            raise ValueError("steps must be > 0 and tolerance >= 0")


@dataclass(frozen=True)
class BigMConfig(ActiveSetConfig):
    """The Big-M dual alone (no Anderson cut): the active set's first phase."""

    max_cuts: int = 0


def big_m_from_slopes(p: AndersonProblem, slopes: tuple[Tensor, ...]) -> AndersonDuals:
    """Big-M duals whose `d` is the CROWN bound with lower slopes `slopes[k]` `[B, S, n_k]`
    (in [0, 1]) and the triangle's upper line, by one backward pass. With `mu` the coefficient
    of a neuron's output from above: `mu >= 0` takes `x >= a xh` (`alpha = a mu`; `mu` when
    passing); `mu < 0` takes the upper line `x <= u (xh - l) / (u - l)`, i.e. `beta_l = -mu u /
    (u - l)`, `beta_u = mu l / (u - l)` (`beta_l = -mu` when passing): then `f = 0` and `g = 0`,
    and the layer passes `(alpha - beta_l) W` on, as CROWN passes its slopes."""
    layers = p.layers
    H = layers.hidden
    above = layers.adjoint(H, p.c)
    alpha, beta_u, beta_l = [None] * H, [None] * H, [None] * H
    for k in range(H - 1, -1, -1):
        lo, up = p.pre_lower[k].unsqueeze(1), p.pre_upper[k].unsqueeze(1)
        passing = lo >= 0
        ambiguous = (lo < 0) & (up > 0)
        width = torch.where(ambiguous, up - lo, torch.ones_like(up))
        zero = torch.zeros_like(above)
        pos = above >= 0
        a = slopes[k].clamp(0, 1)
        alpha[k] = torch.where(pos & passing, above, torch.where(pos & ambiguous, a * above, zero))
        beta_l[k] = torch.where(
            ~pos & passing, -above, torch.where(~pos & ambiguous, -above * up / width, zero)
        )
        beta_u[k] = torch.where(~pos & ambiguous, above * lo / width, zero)
        above = layers.adjoint(k, alpha[k] - beta_l[k])
    empty = tuple(above.new_zeros(*above.shape[:2], 0) for _ in range(H))
    return AndersonDuals(tuple(alpha), tuple(beta_u), tuple(beta_l), empty)


class State(NamedTuple):
    """The normalised duals `theta` `[B, S, N]` (all multipliers side by side, in
    `AndersonDuals.flat` order; duals = theta * scale), their supergradient, Adam's moments
    and step count, the best `d` per problem `[B, S]` with its theta, and the sums of the
    minimisers (x per layer, z per hidden layer) since the last cut round with their count.
    One flat tensor keeps Adam at a handful of ops per iteration."""

    theta: Tensor
    grad: Tensor
    m: Tensor
    v: Tensor
    t: Tensor
    best_value: Tensor
    best_theta: Tensor
    x_sum: tuple[Tensor, ...]
    z_sum: tuple[Tensor, ...]
    count: Tensor


class Layout(NamedTuple):
    """How `theta` splits into `AndersonDuals`: the segments' widths (`AndersonDuals.flat`
    order), the scale of every entry `[B, S, N]`, and 1 where an entry may be nonzero (0: a
    padding cut)."""

    sizes: tuple[int, ...]
    scale: Tensor
    active: Tensor

    def duals(self, theta: Tensor) -> AndersonDuals:
        return AndersonDuals.unflat(torch.split(theta * self.scale, self.sizes, -1))

    def flat(self, duals: AndersonDuals) -> Tensor:
        return torch.cat(duals.flat(), -1)


def _layer_scales(init: AndersonDuals) -> list[Tensor]:
    """Per hidden layer and problem `[B, S, 1]`: the mean magnitude of the layer's starting
    multipliers (floored by a millionth of the largest layer's)."""
    H = len(init.alpha)
    per = [
        (init.alpha[k] + init.beta_u[k] + init.beta_l[k]).abs().mean(-1, keepdim=True)
        for k in range(H)
    ]
    top = torch.stack(per).amax(0)
    return [torch.maximum(s, 1e-6 * top + 1e-30) for s in per]


def _layout(
    scales: list[Tensor], widths: tuple[int, ...], cuts: tuple[Cuts, ...],
    free: tuple[Tensor, ...] | None = None,
) -> Layout:  # fmt: skip
    """The layout for hidden layers of `widths`, their `scales` and `cuts`; `free[k]`
    `[B, 1, n_k]` (default: all): the neurons whose alpha, beta_u, beta_l are optimised (the
    others stay 0 in theta)."""
    sizes = (*widths, *widths, *widths, *(c.rows.shape[-1] for c in cuts))
    per = [*scales, *scales, *scales, *scales]
    scale = torch.cat([s.expand(*s.shape[:2], n) for s, n in zip(per, sizes)], -1)
    if free is None:
        ones = [torch.ones_like(s).expand(*s.shape[:2], n) for s, n in zip(scales * 3, sizes)]
    else:
        ones = [m.to(scale.dtype).expand(*s.shape[:2], -1) for s, m in zip(scales * 3, free * 3)]
    active = ones + [c.active.to(scale.dtype) for c in cuts]
    return Layout(sizes, scale, torch.cat(active, -1))


def _ambiguous(p: AndersonProblem) -> tuple[Tensor, ...]:
    """Per hidden layer `[B, 1, n_k]`: the neurons with `l < 0 < u`."""
    return tuple(((lo < 0) & (up > 0)).unsqueeze(1) for lo, up in zip(p.pre_lower, p.pre_upper))


def _measured(
    p: AndersonProblem, terms, cuts, layout: Layout, theta: Tensor, best_value: Tensor,
    best_theta: Tensor, exact_stable: bool = False,
):  # fmt: skip
    """`d` at `theta` (`evaluate_stable` when `exact_stable`): the minimiser, the normalised
    supergradient and the best-so-far update `(x, grad, best_value, best_theta)`."""
    if exact_stable:
        value, x, _ = evaluate_stable(p, terms, cuts, layout.duals(theta))
    else:
        value, x = evaluate(p, terms, cuts, layout.duals(theta))
    grad = layout.flat(slacks(p, terms, cuts, x, exact_stable)) * layout.scale
    improved = value > best_value
    best = torch.where(improved.unsqueeze(-1), theta, best_theta)
    return x, grad, torch.where(improved, value, best_value), best


def as_step(
    p: AndersonProblem, terms: tuple[CutTerms, ...], cuts: tuple[Cuts, ...], layout: Layout,
    state: State, lr: Tensor, exact_stable: bool = False,
) -> State:  # fmt: skip
    """One projected Adam step on the normalised duals, then `d` and its supergradient there
    (`evaluate_stable` when `exact_stable`), the best-so-far update and the minimisers' sums
    (pure: `torch.compile` fuses it)."""
    (theta,), (m,), (v,), t = adam_ascent(
        (state.theta,), (state.grad,), (state.m,), (state.v,), state.t, lr,
        (lambda th: th.clamp_min(0) * layout.active,),
    )  # fmt: skip
    x, grad, best_value, best_theta = _measured(
        p, terms, cuts, layout, theta, state.best_value, state.best_theta, exact_stable
    )
    return State(
        theta, grad, m, v, t, best_value, best_theta,
        tuple(s + xi for s, xi in zip(state.x_sum, x.x)),
        tuple(s + zi for s, zi in zip(state.z_sum, x.z)),
        state.count + 1,
    )  # fmt: skip


def _start_state(
    p: AndersonProblem, terms, cuts, layout: Layout, theta: Tensor, m: Tensor, v: Tensor,
    t: Tensor, best_value: Tensor, best_theta: Tensor, exact_stable: bool = False,
) -> State:  # fmt: skip
    """The state at `theta` with fresh minimiser sums (the minimiser at `theta` counted)."""
    x, grad, best_value, best_theta = _measured(
        p, terms, cuts, layout, theta, best_value, best_theta, exact_stable
    )
    return State(theta, grad, m, v, t, best_value, best_theta, x.x, x.z, t.new_ones(()))


def _add_round(
    p: AndersonProblem, cuts, terms, state: State, config: ActiveSetConfig, index: tuple,
    weights: tuple | None = None, keep: tuple | None = None, supports: tuple | None = None,
):  # fmt: skip
    """One cut round: the oracle at the minimisers' average on the candidate neurons `index`
    (per layer; `weights`: their rows, `candidate_rows`, or with `supports[k]` not None their
    values there, `row_support`, and the layer's terms sparse), the new constraints appended (their
    terms computed); the old ones kept where `keep[k]` `[B, S, R_k]` (default: all), moved to
    the front per problem and the slots that no problem keeps dropped. Returns the cuts, their
    terms and `grow`, which maps a flat tensor of the old layout to the new one (the kept
    multipliers, then zeros for the new ones)."""
    H = p.layers.hidden
    xbar = tuple(s / state.count for s in state.x_sum)
    zbar = tuple(s / state.count for s in state.z_sum)
    supports = supports if supports is not None else (None,) * H
    chosen = [
        select_cuts_at(p, k, xbar[k], xbar[k + 1], zbar[k], index[k], config.restrict,
                       config.tolerance, None if weights is None else weights[k], supports[k])
        for k in range(H)
    ]  # fmt: skip
    fresh = tuple(Cuts(rows, mask, active) for rows, mask, active, _ in chosen)
    old = [c.rows.shape[-1] for c in cuts]
    added = [c.rows.shape[-1] for c in fresh]
    orders = [None] * H
    if keep is not None:
        for k in range(H):
            kept = keep[k] & cuts[k].active
            order = torch.argsort((~kept).to(torch.int8), dim=2, stable=True)
            order = order[:, :, : int(kept.sum(-1).amax()) if old[k] else 0]
            orders[k] = order
            gather = gather_slots(order)
            cuts = (*cuts[:k], Cuts(gather(cuts[k].rows), gather(cuts[k].mask),
                                    gather(kept)), *cuts[k + 1 :])  # fmt: skip
            moved = (None if t is None else gather(t) for t in terms[k])
            terms = (*terms[:k], CutTerms(*moved), *terms[k + 1 :])
    new_terms = []
    for k, (c, (_, _, _, pick)) in enumerate(zip(fresh, chosen)):
        rows = support = None
        if weights is not None:
            B, S, R = pick.shape
            n_in = weights[k].shape[-1]
            at = pick.reshape(B, S * R, 1).expand(-1, -1, n_in)
            rows = torch.gather(weights[k], 1, at).reshape(B, S, R, n_in)
            if supports[k] is not None:
                support = torch.gather(supports[k], 1, at).reshape(B, S, R, n_in)
        new_terms.append(cut_terms(p, k, c, rows, support))
    terms = tuple(
        CutTerms(*(None if a is None else torch.cat([a, b], 2) for a, b in zip(t, f)))
        for t, f in zip(terms, new_terms)
    )
    cuts = tuple(add_cuts(c, *f) for c, f in zip(cuts, fresh))
    head = state.theta.shape[-1] - sum(old)

    def grow(flat: Tensor) -> Tensor:
        parts = list(torch.split(flat, [head, *old], -1))
        out = [parts[0]]
        for part, order, r in zip(parts[1:], orders, added):
            part = part if order is None else torch.gather(part, 2, order)
            out += [part, part.new_zeros(*part.shape[:2], r)]
        return torch.cat(out, -1)

    return cuts, terms, grow


@dataclass(frozen=True)
class ActiveSetResult:
    """lower `[B, S]` (float64-checked, rounded down to the problem's dtype), the best duals,
    the cuts they go with, and stats."""

    lower: Tensor
    duals: AndersonDuals
    cuts: tuple[Cuts, ...]
    stats: dict

    @property
    def certificate(self) -> tuple[AndersonDuals, tuple[Cuts, ...]]:
        """The duals and cuts to certify this bound from
        (`bounds.dual.anderson.certified.certified_anderson_value`)."""
        return self.duals, self.cuts


def _supports_and_terms(
    p: AndersonProblem, cuts: tuple[Cuts, ...], index: tuple[Tensor, ...],
    weights: tuple[Tensor, ...],
) -> tuple[tuple[Tensor | None, ...], tuple[Tensor, ...], tuple[CutTerms, ...]]:  # fmt: skip
    """`(supports, weights, terms)` of the candidates' rows and of the cuts given: on
    convolutions each row's kernel window only (`CutTerms.support`), F inputs per cut; the
    weights then their values there."""
    H = p.layers.hidden
    # convolutions: each row's kernel window only (`CutTerms.support`), F inputs per cut
    widths_in = [
        layer_support(p, k, torch.cat([index[k].reshape(-1), cuts[k].rows.reshape(-1)]))
        for k in range(H)
    ]  # fmt: skip
    sparse = [None if F is None else row_support(w, F) for w, F in zip(weights, widths_in)]
    supports = tuple(None if t is None else t[0] for t in sparse)
    weights = tuple(w if t is None else t[1] for w, t in zip(weights, sparse))
    terms = tuple(
        cut_terms(p, k, cuts[k]) if F is None else sparse_terms(p, k, cuts[k], F)
        for k, F in enumerate(widths_in)
    )
    return supports, weights, terms


def _kept_cuts(
    state: State, start_theta: Tensor, layout: Layout, cuts: tuple[Cuts, ...], recent: list[int],
    H: int,
) -> tuple[Tensor, ...]:  # fmt: skip
    """Pruning at a cut round: per layer (`H` hidden ones), the cuts whose multiplier is
    positive now, at the best duals or at the start, and those the last round added."""
    flats = (state.theta, state.best_theta, start_theta)
    segments = [torch.split(f, layout.sizes, -1)[3 * H :] for f in flats]
    return tuple(
        (segments[0][k] > 0) | (segments[1][k] > 0) | (segments[2][k] > 0)
        | (torch.arange(c.rows.shape[-1], device=c.rows.device)
           >= c.rows.shape[-1] - recent[k])
        for k, c in enumerate(cuts)
    )  # fmt: skip


def _final_duals(
    p: AndersonProblem, p64: AndersonProblem, terms: tuple[CutTerms, ...],
    cuts: tuple[Cuts, ...], layout: Layout, state: State, start_theta: Tensor,
    start_value: Tensor | None, exact: bool,
) -> tuple[AndersonDuals, Tensor]:  # fmt: skip
    """The best duals and their float64 value; `exact` (`exact_stable`): the duals
    `evaluate_stable` used, never below the start's own value `start_value`."""
    best = layout.duals(state.best_theta)
    if exact:  # the duals evaluate_stable used; never below the start's own value
        best = evaluate_stable(p, terms, cuts, best)[2]
        value = dual_value(p64, cuts, best, sparse=True)
        # the start where it is better by more than float64 noise (a warm start that is not
        # CROWN's; from CROWN's duals the stable neurons' duals are the exact ones already)
        kept = start_value > value + 1e-12 * (1 + value.abs())
        if bool(kept.any()):
            start = layout.duals(start_theta)
            best = AndersonDuals.unflat(
                tuple(torch.where(kept.unsqueeze(-1), a, b)
                      for a, b in zip(start.flat(), best.flat()))
            )  # fmt: skip
            value = dual_value(p64, cuts, best, sparse=True)
    else:
        value = dual_value(p64, cuts, best, sparse=True)
    return best, value


def solve(
    p: AndersonProblem, config: ActiveSetConfig, init: AndersonDuals, budget: Budget | None = None,
    deadline: float | None = None, cuts: tuple[Cuts, ...] | None = None, rounds: int = 0,
) -> ActiveSetResult:  # fmt: skip
    """Maximise `d` from `init` (module docstring); never below `d(init)`. `cuts`: the
    constraints `init.beta_cut` belongs to (a warm start from an earlier result's `duals` and
    `cuts`), made in `rounds` rounds (its `stats['cut_rounds']`), which count towards
    `max_cuts`; cut rounds then start at once. The budget's seconds and `deadline`
    (`time.monotonic()`), whichever is first, are paced every iteration (host clock), keeping
    time for the float64 re-evaluation."""
    H = p.layers.hidden
    clock = Clock.from_budget(budget, config.iterations, config.check_every, deadline)
    if H == 0:  # an affine network: the box minimum is exact
        value = dual_value(p.to(torch.float64), (), init)
        stats = {**clock.stats(0), "cuts": [], "cut_rounds": 0}
        return ActiveSetResult(rounded_down(value, p.c.dtype), init, (), stats)
    tick = time.monotonic()
    given = cuts is not None
    cuts = cuts if given else tuple(no_cuts(p, k) for k in range(H))
    index = tuple(candidates(p, k) for k in range(H))  # fixed: no host sync in the loop
    weights = tuple(candidate_rows(p, k, index[k]) for k in range(H))
    supports, weights, terms = _supports_and_terms(p, cuts, index, weights)
    exact = config.exact_stable
    p.constants  # noqa: B018 (computed once here, outside any compiled step)
    free = _ambiguous(p) if exact else None
    scales = _layer_scales(init)
    widths = tuple(p.layers.width(k) for k in range(H))
    layout = _layout(scales, widths, cuts, free)
    theta = layout.flat(init) / layout.scale
    zeros = torch.zeros_like(theta)
    best_value = p.c.new_full(p.c.shape[:2], -torch.inf)
    t0 = p.c.new_zeros(())
    state = _start_state(
        p, terms, cuts, layout, theta, zeros, zeros, t0, best_value, theta, exact
    )  # fmt: skip
    start_theta = theta  # the start as given (for the final check against it)
    p64 = p.to(torch.float64)
    start_value = dual_value(p64, cuts, init, sparse=True) if exact else None  # its cuts: cheap
    per_round = [i.shape[1] if config.restrict is None else min(config.restrict, i.shape[1])
                 for i in index]  # fmt: skip
    recent = [0] * H  # cuts added by the last round, per layer (never pruned at the next)
    clock.pace(reserve=3 * (time.monotonic() - tick))
    use = should_compile(config.compile, p.c.device, cpu_default=False)
    step = step_function(as_step, use, deadline=clock.loop_deadline())
    done = 0
    for it in range(clock.iterations):
        since = it - (0 if given else config.big_m_iterations)
        if rounds < config.max_cuts and since >= 0 and since % config.cut_frequency == 0:
            keep = _kept_cuts(state, start_theta, layout, cuts, recent, H) if config.prune else None
            cuts, terms, grow = _add_round(
                p, cuts, terms, state, config, index, weights, keep, supports
            )  # fmt: skip
            recent = per_round
            start_theta = grow(start_theta)
            layout = _layout(scales, widths, cuts, free)
            state = _start_state(
                p, terms, cuts, layout, grow(state.theta), grow(state.m), grow(state.v),
                state.t, state.best_value, grow(state.best_theta), exact,
            )  # fmt: skip
            rounds += 1
        step_size = linear_step(config.initial_step, config.final_step, it, clock.iterations)
        lr = torch.full((), step_size, dtype=p.c.dtype, device=p.c.device)
        state = step(p, terms, cuts, layout, state, lr, exact)
        done = it + 1
        if clock.checkpoint(it, Best(state.best_value, None)):
            break
    best, value = _final_duals(p, p64, terms, cuts, layout, state, start_theta, start_value, exact)
    stats = clock.stats(done)
    stats["cuts"] = [int(c.active.sum()) for c in cuts]
    stats["cut_rounds"] = rounds
    return ActiveSetResult(rounded_down(value, p.c.dtype), best, cuts, stats)


register_method(
    "big-m", BigMConfig, "Big-M dual (Planet-equivalent), projected Adam on the Anderson dual"
)(anderson_method(solve, big_m_from_slopes))
register_method(
    "active-set", ActiveSetConfig,
    "Anderson relaxation by the dual active-set method (ReLU chains)",
    intermediate=anderson_intermediate(solve, ActiveSetConfig, big_m_from_slopes),
    hard_bounder=True, warm_start=True, root_intermediate=True, relaxation=Relaxation.ANDERSON,
)(anderson_method(solve, big_m_from_slopes))  # fmt: skip
