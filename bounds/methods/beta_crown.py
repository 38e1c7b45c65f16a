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

import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.graph import Graph
from bounds.methods.crown import backward_pass, relax_backward
from bounds.methods.pacing import Pacer
from bounds.types import Interval


@dataclass(frozen=True)
class BetaCrownConfig:
    """iterations: Adam steps (0: one pass with the given slopes); lr_alpha, lr_beta: Adam's
    steps for the slopes and the split multipliers; tolerance: stop when the summed bound
    improved by less than this (relative) over the last `check_every` iterations."""

    iterations: int = 20
    lr_alpha: float = 0.1
    lr_beta: float = 0.05
    check_every: int = 5
    tolerance: float = 1e-4

    def __post_init__(self) -> None:
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


def relu_nodes(graph: Graph) -> list[tuple[str, str]]:
    """`(activation, pre-activation)` node names in topological order. Split bounds need every
    activation to be exact on each side of `xh = 0` (`Relaxation.split_at_zero`: ReLU-like);
    UnsupportedOperationError naming the first that is not."""
    pairs = []
    for node in graph.activations():
        if not node.op.relaxation.split_at_zero:
            raise UnsupportedOperationError(
                node.op.relaxation.name, node.name, "splitting at 0 does not make it exact"
            )
        pairs.append((node.name, node.inputs[0]))
    return pairs


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
) -> SplitBackward:
    """Lower bounds of `C . y` on each split domain (see the module docstring). `intervals`
    must already be clamped by `splits` (`split_intervals`); `alpha` None: CROWN's adaptive
    slopes; `beta` None: zero."""
    act_coeffs: dict[str, Tensor] = {}

    def relax(node, coeff: Tensor) -> tuple[Tensor, Tensor]:
        act_coeffs[node.name] = coeff
        pre = node.inputs[0]
        iv, slopes = intervals[pre], None if alpha is None else alpha.get(node.name)
        lower, upper = iv.lower.unsqueeze(1), iv.upper.unsqueeze(1)
        lines = node.op.relaxation.linear_bounds(lower, upper, slopes)
        coeff, bias = relax_backward(coeff, lines)
        if beta is not None and node.name in beta:
            coeff = coeff - beta[node.name] * splits[pre].unsqueeze(1).to(coeff.dtype)
        return coeff, bias

    A = C.reshape(*C.shape[:2], *graph.output.shape)
    total, input_coeff = backward_pass(graph, graph.output.name, A, box, relax)
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
    for act, pre in relu_nodes(graph):
        iv = intervals[pre]
        alpha = graph[act].op.relaxation.default_params(iv.lower, iv.upper).unsqueeze(1)
        out[act] = alpha.expand(alpha.shape[0], specs, *alpha.shape[2:]).clone()
    return out


class _Adam:
    """Adam (Kingma and Ba, 2015; betas 0.9, 0.999) on a list of tensors, each with its own
    step and projection (alpha: its relaxation's `project`; beta onto [0, inf))."""

    def __init__(self, params: list[Tensor], lrs: list[float], projections: list[Callable]):
        self.params, self.lrs, self.projections = params, lrs, projections
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads: tuple[Tensor, ...]) -> None:
        """Descent on the loss (ascent on the bound), then projection."""
        self.t += 1
        c1, c2 = 1 - 0.9**self.t, 1 - 0.999**self.t
        for p, g, m, v, lr, project in zip(
            self.params, grads, self.m, self.v, self.lrs, self.projections
        ):
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            p.copy_(project(p - lr * (m / c1) / ((v / c2).sqrt() + 1e-8)))


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
    """Best lower bounds of `C . y` over `config.iterations` Adam steps on `alpha` (in [0, 1])
    and `beta` (>= 0, only split neurons matter), starting from the given ones (copied).

    `target [N, S]`: stop once every domain has some spec whose bound exceeds its target;
    `deadline` (`time.monotonic()`): stop before an iteration predicted (host clock, from the
    previous ones) to end past it, and after one that passes it. Any iterate's bound is valid,
    so an early stop only loosens the result. `keep_best`: also return the iterate of each
    spec's best bound (`SplitResult.best_alpha`, `best_beta`)."""
    alpha = {k: v.detach().clone().requires_grad_(True) for k, v in alpha.items()}
    beta = {k: v.detach().clone().requires_grad_(True) for k, v in beta.items()}
    params = list(alpha.values()) + list(beta.values())
    lrs = [config.lr_alpha] * len(alpha) + [config.lr_beta] * len(beta)
    projections = [graph[act].op.relaxation.project for act in alpha]
    adam = _Adam(params, lrs, projections + [_nonnegative] * len(beta))
    best, last_check, it, pacer = None, None, 0, Pacer(deadline)
    kept: tuple[dict, dict] | None = None
    for it in range(config.iterations + 1):
        with torch.enable_grad():
            last = backward(graph, box, C, intervals, splits, alpha, beta)
        value = last.lower.detach()
        if keep_best:
            kept = _keep_best(kept, value, best, alpha, beta)
        best = value if best is None else torch.maximum(best, value)
        if it == config.iterations or not params or _done(best, target, deadline):
            break
        if pacer.done():  # the next iteration would end past the deadline
            break
        if it and it % config.check_every == 0:
            total = best.sum()
            if last_check is not None and total - last_check <= config.tolerance * (
                1 + last_check.abs()
            ):
                break
            last_check = total
        grads = torch.autograd.grad(-last.lower.sum(), params, allow_unused=True)
        adam.step(tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)))
    best_alpha, best_beta = kept if kept is not None else (None, None)
    return SplitResult(best, _detached(alpha), _detached(beta), _detached_pass(last), it,
                       best_alpha, best_beta)  # fmt: skip


def _nonnegative(beta: Tensor) -> Tensor:
    return beta.clamp(min=0.0)


def _keep_best(kept, value: Tensor, best: Tensor | None, alpha: dict, beta: dict):
    """`(alpha, beta)` per spec from the iterate of `value [N, S]` where it beats `best`."""
    if kept is None or best is None:
        return _detached(alpha), _detached(beta)
    improved = value > best

    def pick(new: dict, old: dict) -> dict:
        out = {}
        for k, t in new.items():
            mask = improved.reshape(*improved.shape, *([1] * (t.dim() - 2)))
            out[k] = torch.where(mask, t.detach(), old[k])
        return out

    return pick(alpha, kept[0]), pick(beta, kept[1])


def _detached(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in tensors.items()}


def _detached_pass(result: SplitBackward) -> SplitBackward:
    coeffs = {k: v.detach() for k, v in result.act_coeffs.items()}
    return SplitBackward(result.lower.detach(), coeffs, result.input_coeff.detach())


def _done(best: Tensor, target: Tensor | None, deadline: float | None) -> bool:
    if deadline is not None and time.monotonic() > deadline:
        return True
    return target is not None and bool((best > target).any(dim=1).all())
