"""alpha-CROWN: CROWN with optimised lower slopes (Xu et al., ICLR 2021, "Fast and Complete").

Every (start node, activation) pair has its own slopes `alpha` in [0, 1], one per spec and
neuron: the final specs, and the `+-e_j` specs of each ambiguous pre-activation neuron when
`optimize_intermediate` is set. Adam ascends the sum of the final lower bounds; intermediate
bounds are recomputed each iteration and intersected with CROWN's, so they are never looser.
Any alpha gives valid bounds: we keep the best bound per spec over all iterations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.graph import Graph
from bounds.methods.crown import (
    ChunkLinesFn,
    LinesFn,
    backward_bound,
    bound_neurons,
    crown_intervals,
    interval_bound,
    needs_crown,
    output_functional,
    scatter_bounds,
    split_output,
    unstable_indices,
)
from bounds.types import Budget, Interval
from relaxations import LinearBounds


@dataclass(frozen=True)
class AlphaCrownConfig:
    """iterations: Adam steps (overridden by a budget); lr: Adam's step; optimize_intermediate:
    also optimise the slopes used for intermediate bounds; check_every: iterations between early
    stop / time checks; tolerance: stop when the summed bound improved by less than this
    (relative) over the last `check_every` iterations."""

    iterations: int = 20
    lr: float = 0.1
    optimize_intermediate: bool = True
    check_every: int = 5
    tolerance: float = 1e-4

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.check_every < 1:
            raise ValueError("iterations must be >= 0 and check_every >= 1")
        if not self.lr > 0 or self.tolerance < 0:
            raise ValueError("lr must be > 0 and tolerance >= 0")


@dataclass
class AdamState:
    """Adam's moments (Kingma and Ba, 2015; betas 0.9, 0.999), written out so that no optimizer
    machinery (and its import of torch._dynamo) is needed; projects onto [0, 1] after a step."""

    m: list[Tensor]
    v: list[Tensor]
    t: int = 0

    @staticmethod
    def zeros(params: list[Tensor]) -> AdamState:
        return AdamState(
            [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        )

    @torch.no_grad()
    def step(self, params: list[Tensor], grads: tuple[Tensor, ...], lr: float) -> None:
        """Descent step on the loss (ascent on the bound), then clamp to [0, 1]."""
        self.t += 1
        c1, c2 = 1 - 0.9**self.t, 1 - 0.999**self.t
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            p.sub_(lr * (m / c1) / ((v / c2).sqrt() + 1e-8)).clamp_(0.0, 1.0)


@dataclass(frozen=True)
class _Problem:
    graph: Graph
    box: Interval
    C: Tensor
    base: dict[str, Interval]  # CROWN intervals: never loosened
    targets: dict[str, Tensor]  # pre-activation node -> flat indices of its ambiguous neurons


def _activations_before(graph: Graph, start: str) -> list[str]:
    ancestors = graph.ancestors(start)
    return [n.name for n in graph.activations() if n.name in ancestors and n.name != start]


def _init_alphas(p: _Problem) -> dict[tuple[str, str], Tensor]:
    """CROWN's adaptive slopes, one copy per (start, activation): `[B, 2, k, *shape]` for an
    intermediate start with k neurons, `[B, 2S, *shape]` for the output."""
    starts = {name: (2, idx.numel()) for name, idx in p.targets.items()}
    starts[p.graph.output.name] = (2 * p.C.shape[1],)
    alphas = {}
    for start, spec_dims in starts.items():
        for act in _activations_before(p.graph, start):
            pre = p.base[p.graph[act].inputs[0]]
            alpha = p.graph[act].op.relaxation.default_alpha(pre.lower, pre.upper)
            view = alpha.reshape(alpha.shape[0], *([1] * len(spec_dims)), *alpha.shape[1:])
            full = view.expand(alpha.shape[0], *spec_dims, *alpha.shape[1:]).clone()
            alphas[start, act] = full.requires_grad_(True)
    return alphas


def _lines(p: _Problem, intervals: dict[str, Interval], alpha_of) -> LinesFn:
    def lines(act: str) -> LinearBounds:
        pre = intervals[p.graph[act].inputs[0]]
        lower, upper = pre.lower.unsqueeze(1), pre.upper.unsqueeze(1)
        return p.graph[act].op.relaxation.linear_bounds(lower, upper, alpha_of(act))

    return lines


def _chunk_lines(p, intervals, alphas, start: str) -> ChunkLinesFn:
    def lines_for(offset: int, count: int) -> LinesFn:
        def alpha_of(act: str) -> Tensor:
            a = alphas[start, act][:, :, offset : offset + count]
            return a.reshape(a.shape[0], 2 * count, *a.shape[3:])

        return _lines(p, intervals, alpha_of)

    return lines_for


def _pass(p: _Problem, alphas) -> tuple[Tensor, dict[str, Interval]]:
    """One bound computation with the given slopes: final `[B, 2S]` and the intervals."""
    intervals: dict[str, Interval] = {p.graph.input.name: p.box}
    for node in p.graph.nodes[1:]:
        iv = node.op.interval(*(intervals[i] for i in node.inputs)).intersect(p.base[node.name])
        if node.name in p.targets:
            index = p.targets[node.name]
            lines_for = _chunk_lines(p, intervals, alphas, node.name)
            low, up = bound_neurons(p.graph, node.name, index, p.box, lines_for)
            iv = scatter_bounds(iv, index, low, up)
        intervals[node.name] = iv
    out = p.graph.output.name
    lines = _lines(p, intervals, lambda act: alphas[out, act])
    result = backward_bound(p.graph, out, output_functional(p.graph, p.C), p.box, lines)
    return torch.maximum(result, interval_bound(p.C, intervals[out])), intervals


def alpha_crown(
    graph: Graph,
    box: Interval,
    C: Tensor,
    config: AlphaCrownConfig,
    budget: Budget | None = None,
    intervals: dict[str, Interval] | None = None,
) -> tuple[Tensor, Tensor, dict[str, Interval], dict]:
    """Optimised-slope bounds on `C . y`: `(lower, upper, intervals, stats)`.

    `intervals`: valid intervals of every node to start from (default: CROWN's); they are never
    loosened. `stats['final_slopes']` maps each activation to its last output slopes
    `[B, 2S, *shape]` (specs `C` then `-C`)."""
    start_time = time.perf_counter()
    base = intervals if intervals is not None else crown_intervals(graph, box)
    targets = {}
    if config.optimize_intermediate:
        for name in needs_crown(graph):
            index = unstable_indices(base[name])
            if index.numel():
                targets[name] = index
    problem = _Problem(graph, box, C, base, targets)
    alphas = _init_alphas(problem)
    iterations = (
        budget.iterations if budget and budget.iterations is not None else config.iterations
    )
    adam = AdamState.zeros(list(alphas.values())) if alphas else None
    best, best_intervals, last_check = None, base, None
    trajectory = []
    for it in range(iterations + 1):
        with torch.enable_grad():
            result, intervals = _pass(problem, alphas)
            loss = -result.sum()
        detached = result.detach()
        best = detached if best is None else torch.maximum(best, detached)
        best_intervals = {k: best_intervals[k].intersect(_detach(v)) for k, v in intervals.items()}
        if it == iterations or adam is None:
            break
        grads = torch.autograd.grad(loss, list(alphas.values()))
        adam.step(list(alphas.values()), grads, config.lr)
        if (it + 1) % config.check_every == 0:
            total = best.sum()
            elapsed = time.perf_counter() - start_time
            trajectory.append((elapsed, float(total)))
            if budget and budget.seconds is not None and elapsed > budget.seconds:
                break
            if last_check is not None and total - last_check <= config.tolerance * (
                1 + last_check.abs()
            ):
                break
            last_check = total
    lower, upper = split_output(best)
    out = graph.output.name
    slopes = {act: alphas[out, act].detach() for act in _activations_before(graph, out)}
    stats = {"iterations": it, "trajectory": trajectory, "final_slopes": slopes}
    return lower, upper, best_intervals, stats


def _detach(iv: Interval) -> Interval:
    return Interval(iv.lower.detach(), iv.upper.detach())
