"""Bounds on ReLU-split domains: alpha-beta-CROWN with fixed intermediate bounds (Wang et al.,
NeurIPS 2021, "Beta-CROWN: efficient bound propagation with per-neuron split constraints",
Sec. 3.1, Thm. 3.1).

A domain fixes some ReLUs: split `s_j = +1` means `xh_j >= 0` (active), `s_j = -1` means
`xh_j <= 0` (inactive), `s_j = 0` free. On the domain, for every `beta >= 0`,

    c . f(x) >= c . f(x) - sum_j beta_j s_j xh_j,

and the right side is lower-bounded by one CROWN backward pass over the relaxation whose
intervals are clamped by the splits (`l_j = max(l_j, 0)` active, `u_j = min(u_j, 0)`
inactive): the Lagrangian term only adds `-beta s` to the functional reaching each
pre-activation node. Every `alpha` in [0, 1] and `beta >= 0` gives a valid bound; Adam ascends
it (projected), and the best bound per spec over the iterations is kept. The intervals are given
(e.g. the root's, clamped): they are never recomputed here, so a bound costs one backward pass.

`backward` also returns the functional's coefficients at every activation output (`lambda`,
the inputs of branching scores such as BaBSR) and at the input (whose box minimiser is the
primal point of the bound).

Shapes: `N` domains, `S` specs; the box is `[1 or N, *input_shape]`; `C [N, S, n_out]`;
intervals and splits per pre-activation node `[N, *shape]`; `alpha`, `beta` per activation node
`[N, S, *shape]`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.compile import (
    CompileMode,
    check_mode,
    mark_batch_dynamic,
    should_compile,
    step_function,
)
from bounds.graph.graph import Graph
from bounds.methods.backward import (
    backward_pass,
    output_interval,
    pairing,
    relax_backward,
    relax_rounding,
)
from bounds.methods.pacing import Pacer
from bounds.optim import adam_ascent
from bounds.rounding import error_bound, magnitude
from bounds.types import Interval


@dataclass(frozen=True)
class BetaCrownConfig:
    """iterations: Adam steps (0: one pass with the given slopes); lr_alpha, lr_beta: Adam's
    steps for the slopes and the split multipliers; tolerance: stop when the summed bound
    improved by less than this (relative) over the last `check_every` iterations; compile:
    `torch.compile` the step (`beta_step`; "auto": on CUDA only)."""

    iterations: int = 20
    lr_alpha: float = 0.1
    lr_beta: float = 0.05
    check_every: int = 5
    tolerance: float = 1e-4
    compile: CompileMode = "auto"

    def __post_init__(self) -> None:
        check_mode(self.compile)
        if self.iterations < 0 or self.check_every < 1 or self.tolerance < 0:
            raise ValueError("need iterations >= 0, check_every >= 1 and tolerance >= 0")
        if not (self.lr_alpha > 0 and self.lr_beta > 0):
            raise ValueError("learning rates must be > 0")


@dataclass(frozen=True)
class SplitBackward:
    """One backward pass: `lower [N, S]` bounds of `C . y`; `act_coeffs` per activation node
    the functional on its output `[N, S, *shape]`; `input_coeff [N, S, *input_shape]`."""

    lower: Tensor
    act_coeffs: dict[str, Tensor]
    input_coeff: Tensor


@dataclass(frozen=True)
class SplitResult:
    """`lower [N, S]`: the best bound per spec over the iterations; `alpha`, `beta`: the last
    iterates (copies), to warm-start children: the optimisation then continues from generation
    to generation (measured: much better than restarting children from the best iterate, whose
    neighbourhood the first Adam steps leave and rarely regain within a few steps); `last`: the
    backward pass of those iterates; `iterations` run; `best_alpha`, `best_beta` (with
    `keep_best`, else None): per spec the iterate that gave `lower` (a certificate: one
    `backward` pass with them reproduces the bound, e.g. in float64)."""

    lower: Tensor
    alpha: dict[str, Tensor]
    beta: dict[str, Tensor]
    last: SplitBackward
    iterations: int
    best_alpha: dict[str, Tensor] | None = None
    best_beta: dict[str, Tensor] | None = None


def split_intervals(base: dict[str, Interval], splits: dict[str, Tensor]) -> dict[str, Interval]:
    """`base` intervals (`[1 or N, *shape]`) clamped by the splits `[N, *shape]`: lower 0 for
    active neurons, upper 0 for inactive ones (valid on the domain: that is its definition)."""
    return {name: clamp_by_splits(base[name], split) for name, split in splits.items()}


def clamp_by_splits(interval: Interval, split: Tensor) -> Interval:
    """`interval` with lower 0 where `split > 0` (active) and upper 0 where `split < 0`."""
    lower = torch.where(split > 0, interval.lower.clamp(min=0), interval.lower)
    upper = torch.where(split < 0, interval.upper.clamp(max=0), interval.upper)
    return Interval(lower, upper)


def backward(
    graph: Graph,
    box: Interval,
    C: Tensor,
    intervals: dict[str, Interval],
    splits: dict[str, Tensor],
    alpha: dict[str, Tensor] | None = None,
    beta: dict[str, Tensor] | None = None,
    tracked: bool = False,
) -> SplitBackward:
    """Lower bounds of `C . y` on each split domain (see the module docstring). `intervals`
    must already be clamped by `splits` (`split_intervals`); `alpha` None: CROWN's adaptive
    slopes; `beta` None: zero. `tracked`: the bound holds in floating point (the pass's
    rounding bounded against IBP intervals of every node, intersected with `intervals`:
    `backward_pass`; the split term `- beta s` is one more rounding of the functional); else
    not (the search's passes; branch and bound rechecks the closing ones tracked)."""
    act_coeffs: dict[str, Tensor] = {}
    every = graph.interval(box, intervals) if tracked else None

    def relax(node, coeff: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        act_coeffs[node.name] = coeff
        pre = node.inputs[0]
        iv, slopes = intervals[pre], None if alpha is None else alpha.get(node.name)
        lower, upper = iv.lower.unsqueeze(1), iv.upper.unsqueeze(1)
        lines = node.op.relaxation.linear_bounds(lower, upper, slopes)
        new, bias = relax_backward(coeff, lines)
        split = None
        if beta is not None and node.name in beta:
            split = beta[node.name] * splits[pre].unsqueeze(1).to(coeff.dtype)  # exact: s = +-1
            new = new - split
        if every is None:
            return new, bias, None
        size_in = magnitude(every[pre]).unsqueeze(1)
        size_out = magnitude(output_interval(node, every)).unsqueeze(1)
        err = relax_rounding(coeff, new, lines, size_in, size_out, node.op.rounding_ulps())
        if split is not None:  # the subtraction, relative to both parts
            with torch.no_grad():
                parts = (new.detach() + split.detach()).abs() + split.detach().abs()
                err = err + error_bound(pairing(parts, size_in), 1, 1)
        return new, bias, err

    A = C.reshape(*C.shape[:2], *graph.output.shape)
    total, input_coeff = backward_pass(graph, graph.output.name, A, box, relax, every)
    if input_coeff is None:  # the output does not depend on the input
        input_coeff = C.new_zeros(*C.shape[:2], *graph.input.shape)
    return SplitBackward(total, act_coeffs, input_coeff)


def minimiser(input_coeff: Tensor, box: Interval) -> Tensor:
    """`[N, S, *input_shape]`: per spec the box corner minimising the input functional."""
    lower, upper = box.lower.unsqueeze(1), box.upper.unsqueeze(1)
    return torch.where(input_coeff >= 0, lower, upper)


def default_alpha(graph: Graph, intervals: dict[str, Interval], specs: int) -> dict[str, Tensor]:
    """CROWN's adaptive slopes, one copy per spec: `[N, S, *shape]` per activation."""
    out = {}
    for act, pre in graph.split_pairs():
        iv = intervals[pre]
        alpha = graph[act].op.relaxation.default_params(iv.lower, iv.upper).unsqueeze(1)
        out[act] = alpha.expand(alpha.shape[0], specs, *alpha.shape[2:]).clone()
    return out


class SplitProblem(NamedTuple):
    """What stays fixed while alpha-beta-CROWN optimises: the graph, box, `C`, the split-clamped
    intervals and the splits, the activation nodes whose slopes (`acts`) and split multipliers
    (`betas`) are optimised, and their projections (the slopes': each relaxation's `project`;
    the multipliers': onto `[0, inf)`)."""

    graph: Graph
    box: Interval
    C: Tensor
    intervals: dict[str, Interval]
    splits: dict[str, Tensor]
    acts: tuple[str, ...]
    betas: tuple[str, ...]

    def projections(self) -> tuple[Callable, ...]:
        return tuple(self.graph[a].op.relaxation.project for a in self.acts) + (
            _nonnegative,
        ) * len(self.betas)

    def pass_at(self, params: tuple[Tensor, ...]) -> SplitBackward:
        """`backward` at the slopes and multipliers `params` (slopes first, in `acts` order)."""
        n = len(self.acts)
        alpha, beta = dict(zip(self.acts, params[:n])), dict(zip(self.betas, params[n:]))
        return backward(self.graph, self.box, self.C, self.intervals, self.splits, alpha, beta)


class SplitState(NamedTuple):
    """The iterate (`params`: slopes, then multipliers), Adam's moments and step count (0-d),
    the best bound per spec `[N, S]` and (with keep-best, else empty) the iterate of each
    spec's best bound."""

    params: tuple[Tensor, ...]
    m: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    t: Tensor
    best: Tensor
    best_params: tuple[Tensor, ...]


def _objective(p: SplitProblem, params: tuple[Tensor, ...]):
    """The summed bound at `params` (what Adam ascends) and the pass's parts."""
    last = p.pass_at(params)
    return last.lower.sum(), (last.lower, last.act_coeffs, last.input_coeff)


def beta_step(
    p: SplitProblem, state: SplitState, lrs: tuple[Tensor, ...]
) -> tuple[SplitState, SplitBackward]:
    """One iteration: the bound at the current iterate (the best kept per spec), then one
    projected Adam ascent step on the summed bound (`bounds.optim.adam_ascent`, each parameter
    with its own step `lrs[i]`). Pure: a function of its arguments, returning a new state and
    the pass at the iterate it started from."""
    if torch.compiler.is_compiling():  # Dynamo traces torch.func (autograd.grad would break)
        grads, aux = torch.func.grad(_objective, argnums=1, has_aux=True)(p, state.params)
        last = SplitBackward(*aux)
    else:
        with torch.enable_grad():
            params = tuple(x.detach().requires_grad_(True) for x in state.params)
            total, aux = _objective(p, params)
            grads = torch.autograd.grad(total, params, allow_unused=True)
        last = SplitBackward(*aux)
        grads = tuple(torch.zeros_like(x) if g is None else g for x, g in zip(params, grads))
    kept = _kept(state, last.lower.detach(), state.params)
    params, m, v, t = adam_ascent(state.params, grads, state.m, state.v, state.t, lrs,
                                  p.projections())  # fmt: skip
    state = SplitState(params, m, v, t, kept.best, kept.best_params)
    return state, _detached_pass(last)


def beta_evaluate(p: SplitProblem, state: SplitState) -> tuple[SplitState, SplitBackward]:
    """`beta_step` without the gradient and the update (the last iteration)."""
    with torch.no_grad():
        last = p.pass_at(state.params)
    return _kept(state, last.lower, state.params), last


def _kept(state: SplitState, value: Tensor, params: tuple[Tensor, ...]) -> SplitState:
    """`state` with the bounds `value [N, S]` kept where better, and (with keep-best) the
    iterate `params` for those specs."""
    improved = value > state.best
    best = torch.where(improved, value, state.best)
    kept = tuple(
        torch.where(improved.reshape(*improved.shape, *([1] * (x.dim() - 2))), x.detach(), old)
        for x, old in zip(params, state.best_params)
    )
    return SplitState(state.params, state.m, state.v, state.t, best, kept)


def optimise(
    graph: Graph,
    box: Interval,
    C: Tensor,
    intervals: dict[str, Interval],
    splits: dict[str, Tensor],
    alpha: dict[str, Tensor],
    beta: dict[str, Tensor],
    config: BetaCrownConfig,
    *,
    target: Tensor | None = None,
    deadline: float | None = None,
    keep_best: bool = False,
) -> SplitResult:
    """Best lower bounds of `C . y` over `config.iterations` Adam steps (`beta_step`) on
    `alpha` (in [0, 1]) and `beta` (>= 0, only split neurons matter), starting from the given
    ones (copied).

    `target [N, S]`: stop once every domain has some spec whose bound exceeds its target;
    `deadline` (`time.monotonic()`): stop before an iteration predicted (host clock, from the
    previous ones) to end past it, and after one that passes it. Any iterate's bound is valid,
    so an early stop only loosens the result. `keep_best`: also return the iterate of each
    spec's best bound (`SplitResult.best_alpha`, `best_beta`)."""
    p = SplitProblem(graph, box, C, intervals, splits, tuple(alpha), tuple(beta))
    params = tuple(x.detach().clone() for x in (*alpha.values(), *beta.values()))
    m, v = (tuple(torch.zeros_like(x) for x in params) for _ in range(2))  # no aliasing
    best = C.new_full(C.shape[:2], -torch.inf)
    kept = tuple(x.clone() for x in params) if keep_best else ()
    state = SplitState(params, m, v, C.new_zeros(()), best, kept)
    as_tensor = lambda lr: torch.full((), lr, dtype=C.dtype, device=C.device)  # noqa: E731
    lrs = (as_tensor(config.lr_alpha),) * len(alpha) + (as_tensor(config.lr_beta),) * len(beta)
    last_check, it, pacer = None, 0, Pacer(deadline)
    use = should_compile(config.compile, C.device) and config.iterations > 0 and bool(params)
    step = step_function(beta_step, use, deadline=deadline)  # no compile past the deadline
    if use:
        bounds_ = [x for iv in intervals.values() for x in (iv.lower, iv.upper)]
        mark_batch_dynamic((C, box.lower, box.upper, state, bounds_, list(splits.values())))
    for it in range(config.iterations + 1):
        if it == config.iterations or not params:
            state, last = beta_evaluate(p, state)
            break
        state, last = step(p, state, lrs)
        if _done(state.best, target, deadline) or pacer.done():
            break  # (pacer: the next iteration would end past the deadline)
        if it and it % config.check_every == 0:
            total = state.best.sum()
            if last_check is not None and total - last_check <= config.tolerance * (
                1 + last_check.abs()
            ):
                break
            last_check = total
    n = len(alpha)
    best_alpha = dict(zip(p.acts, state.best_params[:n])) if keep_best else None
    best_beta = dict(zip(p.betas, state.best_params[n:])) if keep_best else None
    return SplitResult(state.best, dict(zip(p.acts, state.params[:n])),
                       dict(zip(p.betas, state.params[n:])), last, it, best_alpha,
                       best_beta)  # fmt: skip


def _nonnegative(beta: Tensor) -> Tensor:
    return beta.clamp(min=0.0)


def _detached(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in tensors.items()}


def _detached_pass(result: SplitBackward) -> SplitBackward:
    coeffs = {k: v.detach() for k, v in result.act_coeffs.items()}
    return SplitBackward(result.lower.detach(), coeffs, result.input_coeff.detach())


def _done(best: Tensor, target: Tensor | None, deadline: float | None) -> bool:
    if deadline is not None and time.monotonic() > deadline:
        return True
    return target is not None and bool((best > target).any(dim=1).all())
