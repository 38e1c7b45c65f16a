"""alpha-CROWN: CROWN with optimised relaxations (Xu et al., ICLR 2021, "Fast and Complete").

Every (start node, activation) pair has its own relaxation parameters `alpha` (the
relaxation's own, `Relaxation.default_params` / `project`: ReLU's lower slopes in [0, 1], an
S-shape's tangent points; called slopes below), one per spec and neuron: the final specs, and
the `+-e_j` specs of each ambiguous pre-activation neuron in the specs' output cone
(`bounds.graph.cone`) when `optimize_intermediate` is set. Adam ascends the sum of the final
lower bounds; intermediate bounds are recomputed each iteration and intersected with CROWN's.
Any alpha gives valid bounds: we keep the best bound per spec over all iterations, and the
output slopes that gave it (`stats['best_slopes']`: evaluated again, e.g. in float64, they
reproduce that bound). A deadline (a budget's seconds, or `deadline=`) is paced on the host
clock: the loop stops before an iteration that would pass it, and a pass that crosses it keeps
CROWN's intervals for the neurons left (valid), so a call ends within a chunk of its deadline.
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
from bounds.graph.cone import spec_cone
from bounds.graph.graph import Graph
from bounds.methods.alpha_targets import activations_before, intermediate_targets
from bounds.methods.backward import Lines, LinesFn, backward_bound, relaxation_bounds
from bounds.methods.chunks import ChunkLinesFn, neuron_chunk, predicted_past
from bounds.methods.crown import (
    bound_neurons,
    crown_intervals,
    interval_bound,
    output_functional,
    scatter_bounds,
    split_output,
    straight_through,
)
from bounds.methods.pacing import Pacer, deadline_of, passed
from bounds.methods.patches import Windows, read_windows
from bounds.methods.windows import windowed_activations
from bounds.optim import adam_ascent
from bounds.registry import IntermediateBounds, MethodResult, register_method
from bounds.rounding import in_float64, intervals_in_float64, intervals_outward
from bounds.types import Budget, Interval, rounded_down


@dataclass(frozen=True)
class AlphaCrownConfig:
    """iterations: Adam steps (overridden by a budget); lr: Adam's step; lr_decay: the step
    after k updates is `lr * lr_decay**k` (auto_LiRPA's exponential schedule uses 0.98 with lr
    0.5); optimize_intermediate: also optimise the slopes used for intermediate bounds;
    check_every: iterations between early
    stop / time checks; tolerance: stop when the summed bound improved by less than this
    (relative) over the last `check_every` iterations; compile: torch.compile the step (True /
    False / "auto": on CUDA without `optimize_intermediate`, see `bounds.compile`)."""

    iterations: int = 20
    lr: float = 0.1
    lr_decay: float = 1.0
    optimize_intermediate: bool = True
    check_every: int = 5
    tolerance: float = 1e-4
    compile: CompileMode = "auto"

    def __post_init__(self) -> None:
        check_mode(self.compile)
        if self.iterations < 0 or self.check_every < 1:
            raise ValueError("iterations must be >= 0 and check_every >= 1")
        if not self.lr > 0 or self.tolerance < 0:
            raise ValueError("lr must be > 0 and tolerance >= 0")
        if not 0 < self.lr_decay <= 1:
            raise ValueError("lr_decay must be in (0, 1]")


class AlphaState(NamedTuple):
    """All tensors: the slopes (one per (start, activation) key, in `_Problem.keys` order),
    Adam's moments and step count (0-d), the best final bounds `[B, 2S]`, the tightest
    intervals seen (`lower`/`upper` per graph node, in graph order) and, per output key (in
    `_Problem.out_index` order), the slopes that gave each spec's best bound `[B, 2S, *shape]`."""

    alphas: tuple[Tensor, ...]
    m: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    t: Tensor
    best: Tensor
    best_lower: tuple[Tensor, ...]
    best_upper: tuple[Tensor, ...]
    best_slopes: tuple[Tensor, ...]


@dataclass(frozen=True)
class _Problem:
    graph: Graph
    box: Interval
    C: Tensor
    base: dict[str, Interval]  # CROWN intervals: never loosened
    targets: dict[str, Tensor]  # pre-activation node -> flat indices of its ambiguous neurons
    keys: tuple[tuple[str, str], ...]  # (start, activation) of each slope tensor
    chunks: dict[str, int]  # neurons per backward pass for each target (fixed outside compile)
    deadline: float | None = None  # time.monotonic(); None when the step is compiled
    sound: bool = False  # track the passes' rounding (`bounds.rounding`): the final evaluation
    durations: list[float] | None = None  # seconds of earlier chunks (None when compiled)

    @property
    def out_index(self) -> tuple[int, ...]:
        """Positions in `keys` of the output's slopes."""
        out = self.graph.output.name
        return tuple(i for i, (start, _) in enumerate(self.keys) if start == out)

    @property
    def projections(self) -> tuple[Callable, ...]:
        """The `project` of the relaxation of each slope tensor, in `keys` order."""
        return tuple(self.graph[act].op.relaxation.project for _, act in self.keys)


def _init_alphas(p: _Problem) -> dict[tuple[str, str], Tensor]:
    """CROWN's adaptive slopes, one copy per (start, activation): `[B, 2, k, *shape]` for an
    intermediate start with k neurons, `[B, 2S, *shape]` for the output; an activation whose
    lines a convolution's patches take at windows (`windowed_activations`) has its slopes on
    the windows only, `[B, 2, k, C, Mh, Mw]` (the others do not change its bounds)."""
    starts = {name: (2, idx.numel()) for name, idx in p.targets.items()}
    starts[p.graph.output.name] = (2 * p.C.shape[1],)
    alphas = {}
    for start, spec_dims in starts.items():
        index = p.targets.get(start)
        windows = {} if index is None else windowed_activations(p.graph, start, index)
        for act in activations_before(p.graph, start):
            lower, upper = relaxation_bounds(p.graph, act, p.base)
            relaxation = p.graph[act].op.relaxation
            if act in windows:
                shape, w = p.graph[act].shape, windows[act]
                low, up = (read_windows(t.unsqueeze(1), w, shape) for t in (lower, upper))
                alpha = relaxation.default_params(low, up)  # [B, 2k, C, Mh, Mw, ...]
                full = alpha.reshape(alpha.shape[0], *spec_dims, *alpha.shape[2:]).clone()
            else:
                alpha = relaxation.default_params(lower, upper)
                view = alpha.reshape(alpha.shape[0], *([1] * len(spec_dims)), *alpha.shape[1:])
                full = view.expand(alpha.shape[0], *spec_dims, *alpha.shape[1:]).clone()
            alphas[start, act] = full.requires_grad_(True)
    return alphas


def _lines(p: _Problem, intervals: dict[str, Interval], alpha_of) -> LinesFn:
    def lines(act: str, windows: Windows | None = None) -> Lines:
        lower, upper = relaxation_bounds(p.graph, act, intervals, unsqueeze=True)
        if windows is not None:  # `patch_bound`: the slopes are on the windows too
            shape = p.graph[act].shape
            lower, upper = read_windows(lower, windows, shape), read_windows(upper, windows, shape)
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
    """One bound computation with the given slopes: final `[B, 2S]` and the intervals (each
    never looser than CROWN's, differentiated as the slopes' own bounds: `straight_through`)."""
    intervals: dict[str, Interval] = {p.graph.input.name: p.box}
    for node in p.graph.nodes[1:]:
        iv = node.op.interval(*(intervals[i] for i in node.inputs)).intersect(p.base[node.name])
        if node.name in p.targets and not passed(p.deadline):  # past it: CROWN's (in base)
            index = p.targets[node.name]
            lines_for = _chunk_lines(p, intervals, alphas, node.name)
            step = p.chunks[node.name]
            tracked = intervals if p.sound else None
            low, up = bound_neurons(
                p.graph,
                node.name,
                index,
                p.box,
                lines_for,
                step,
                p.deadline,
                tracked,
                p.durations,
            )
            iv = scatter_bounds(iv, index, low, up, straight=True)
        intervals[node.name] = iv
    out = p.graph.output.name
    lines = _lines(p, intervals, lambda act: alphas[out, act])
    C = output_functional(p.graph, p.C)
    result = backward_bound(p.graph, out, C, p.box, lines, intervals if p.sound else None)
    tight = torch.maximum(result, interval_bound(p.C, intervals[out]))
    return straight_through(tight, result), intervals


def _objective(p: _Problem, alphas: tuple[Tensor, ...]):
    """`(sum of the final lower bounds, (bounds [B, 2S], lower, upper))` for the slopes, with
    every node's interval as `lower`/`upper` tuples in graph order."""
    result, intervals = _pass(p, dict(zip(p.keys, alphas)))
    names = [n.name for n in p.graph.nodes]
    lower = tuple(intervals[n].lower.detach() for n in names)
    upper = tuple(intervals[n].upper.detach() for n in names)
    return result.sum(), (result.detach(), lower, upper)


def _gradient(p: _Problem, alphas: tuple[Tensor, ...], functional: bool):
    """`(d objective / d alphas, aux)`: by `torch.func.grad` inside compiled code (Dynamo
    traces it; `torch.autograd.grad` would break the graph), by `torch.autograd.grad` in eager
    mode (the first `torch.func` call imports torch._dynamo: seconds per process), where the
    gradient is None when its backward pass, predicted to take twice the forward's host time,
    would end past `p.deadline`."""
    if not alphas:
        return (), _objective(p, ())[1]
    if functional:
        return torch.func.grad(_objective, argnums=1, has_aux=True)(p, alphas)
    with torch.enable_grad():
        params = tuple(a.detach().requires_grad_(True) for a in alphas)
        tick = time.monotonic()
        total, aux = _objective(p, params)
        if p.deadline is not None and 3 * time.monotonic() - 2 * tick > p.deadline:
            return None, aux  # the backward (about twice the forward) would pass the deadline
        grads = torch.autograd.grad(total, params, allow_unused=True)  # unused: past-deadline
        return tuple(torch.zeros_like(a) if g is None else g for a, g in zip(alphas, grads)), aux


def _kept(p: _Problem, state: AlphaState, result: Tensor, lower, upper) -> AlphaState:
    """`state` with the bounds `result [B, 2S]` and intervals of its current slopes kept where
    better (per spec, per neuron), and the slopes of every improved spec."""
    improved = result > state.best
    slopes = []
    for i, best in zip(p.out_index, state.best_slopes):
        mask = improved.reshape(*improved.shape, *([1] * (best.dim() - 2)))
        slopes.append(torch.where(mask, state.alphas[i].detach(), best))
    lower = tuple(torch.maximum(b, n) for b, n in zip(state.best_lower, lower))
    upper = tuple(torch.minimum(b, n) for b, n in zip(state.best_upper, upper))
    best = torch.maximum(state.best, result)
    return AlphaState(state.alphas, state.m, state.v, state.t, best, lower, upper, tuple(slopes))


def alpha_step(p: _Problem, state: AlphaState, lr: Tensor) -> AlphaState:
    """Bounds at the current slopes (kept when better, per spec and per neuron), then one Adam
    ascent step on the summed final lower bound: pure, so `torch.compile` fuses the forward
    bound pass, its gradient and the update."""
    functional = torch.compiler.is_compiling()
    grads, (result, lower, upper) = _gradient(p, state.alphas, functional)
    kept = _kept(p, state, result, lower, upper)
    if grads is None:  # out of time (eager only): the same slopes, which ends the loop
        return kept
    alphas, m, v, t = adam_ascent(state.alphas, grads, state.m, state.v, state.t, lr, p.projections)
    return AlphaState(alphas, m, v, t, *kept[4:])


def alpha_evaluate(p: _Problem, state: AlphaState, lr: Tensor) -> AlphaState:
    """`alpha_step` without the gradient and the update: the bounds at the current slopes
    (the last iteration, eager mode)."""
    with torch.no_grad():
        _, (result, lower, upper) = _objective(p, state.alphas)
    return _kept(p, state, result, lower, upper)


def _initial_state(p: _Problem, alphas: dict) -> AlphaState:
    params = tuple(alphas[k].detach() for k in p.keys)
    zeros = tuple(torch.zeros_like(a) for a in params)
    moments = tuple(torch.zeros_like(a) for a in params)
    names = [n.name for n in p.graph.nodes]
    lower = tuple(p.base[n].lower.clone() for n in names)  # no aliasing of compiled inputs
    upper = tuple(p.base[n].upper.clone() for n in names)
    best = p.box.lower.new_full((p.box.lower.shape[0], 2 * p.C.shape[1]), -torch.inf)
    slopes = tuple(params[i].clone() for i in p.out_index)
    t = p.box.lower.new_zeros(())
    return AlphaState(params, zeros, moments, t, best, lower, upper, slopes)


def _with_slopes(p: _Problem, alphas: dict, slopes: dict[str, Tensor] | None) -> dict:
    """`alphas` with the output's slopes replaced by `slopes` (`{activation: [B, 2S, *shape]}`,
    projected by the activation's relaxation); each must match the default's shape."""
    out = p.graph.output.name
    for act, given in (slopes or {}).items():
        if (out, act) not in alphas:
            raise ValueError(f"init_slopes names {act!r}, not an activation before the output")
        default = alphas[out, act]
        if tuple(given.shape) != tuple(default.shape):
            raise ValueError(
                f"init_slopes[{act!r}] has shape {tuple(given.shape)}, need {tuple(default.shape)}"
            )
        value = p.graph[act].op.relaxation.project(given.detach().to(default))
        alphas[out, act] = value.clone().requires_grad_(True)
    return alphas


def _use_compile(config: AlphaCrownConfig, device: torch.device) -> bool:
    """ "auto": on CUDA for final-layer slopes only; with `optimize_intermediate` the step
    unrolls a backward pass per chunk of every layer's neurons and compiles for minutes."""
    if config.compile == "auto" and config.optimize_intermediate:
        return False
    return should_compile(config.compile, device)


def _stalled(total: Tensor, last: Tensor | None, tolerance: float) -> bool:
    return last is not None and bool(total - last <= tolerance * (1 + last.abs()))


def _interval_result(
    graph: Graph, C: Tensor, base: dict[str, Interval], alphas: dict[tuple[str, str], Tensor]
) -> tuple[Tensor, Tensor, dict[str, Interval], dict]:
    """`alpha_crown`'s result from the output's interval (no pass fits before the deadline)."""
    out = graph.output.name
    slopes = {act: a.detach() for (start, act), a in alphas.items() if start == out}
    stats = {"iterations": 0, "trajectory": [], "final_slopes": slopes, "best_slopes": slopes}
    return *split_output(interval_bound(C, base[out])), base, stats


def _iterate(
    problem: _Problem, state: AlphaState, step: Callable, lr: Tensor, config: AlphaCrownConfig,
    iterations: int, use: bool, pacer: Pacer, start_time: float,
) -> tuple[AlphaState, tuple[Tensor, ...], list[tuple[float, float]], int]:  # fmt: skip
    """The optimisation: `(state, the slopes last evaluated, trajectory, last iteration)`;
    out of iterations or time (`pacer`, keeping back one iteration's time for the exact pass),
    or stalled."""
    stop_at = pacer.deadline
    last_check, trajectory, it = None, [], 0
    for it in range(iterations + 1):
        evaluated = state.alphas
        last = it == iterations or (it == 0 and passed(stop_at))
        state = (alpha_evaluate if last and not use else step)(problem, state, lr)
        lr = lr * config.lr_decay
        # out of iterations or time; the time kept back: one iteration's, for the exact pass
        pacer.reserve = max(pacer.durations, default=0.0)
        if last or state.alphas is evaluated or pacer.done():
            break
        if (it + 1) % config.check_every == 0:
            total = state.best.sum()
            trajectory.append((time.perf_counter() - start_time, float(total)))
            if _stalled(total, last_check, config.tolerance):
                break
            last_check = total
    return state, evaluated, trajectory, it


def _stats(
    problem: _Problem, state: AlphaState, evaluated: tuple[Tensor, ...],
    trajectory: list[tuple[float, float]], it: int,
) -> tuple[dict[tuple[str, str], Tensor], dict]:  # fmt: skip
    """The last evaluated slopes by key, and `alpha_crown`'s stats."""
    graph = problem.graph
    out = graph.output.name
    final = dict(zip(problem.keys, evaluated))
    slopes = {act: final[out, act] for act in activations_before(graph, out)}
    best_slopes = {problem.keys[i][1]: t for i, t in zip(problem.out_index, state.best_slopes)}
    stats = {"iterations": it, "trajectory": trajectory, "final_slopes": slopes}
    stats["best_slopes"] = best_slopes
    stats["unsound_best"] = state.best.detach()  # the iterations' own (untracked) bounds
    return final, stats


def _result(
    problem: _Problem, final: dict[tuple[str, str], Tensor], state: AlphaState, stats: dict,
    exact: bool, pacer: Pacer,
) -> tuple[Tensor, Tensor, dict[str, Interval], dict]:  # fmt: skip
    """`alpha_crown`'s result after the optimisation: the iterations' own bounds (not
    `exact`), the output's interval when the exact pass would end past the deadline, else the
    exact pass's (`_sound_pass`)."""
    graph, C, base, stop_at = problem.graph, problem.C, problem.base, pacer.deadline
    if not exact:
        names = [n.name for n in graph.nodes]
        best = {n: Interval(lo, up) for n, lo, up in zip(names, state.best_lower, state.best_upper)}
        return *split_output(state.best), best, stats
    if stop_at is not None and time.monotonic() + max(pacer.durations, default=0.0) > stop_at:
        # the exact pass (about an iteration's time) would end past the deadline: the output's
        # interval from the exact intervals the call started from
        result = interval_bound(C, base[graph.output.name])
        return *split_output(result), base, stats
    result, sound_intervals = _sound_pass(problem, final, state)
    return *split_output(result), sound_intervals, stats


def alpha_crown(
    graph: Graph,
    box: Interval,
    C: Tensor,
    config: AlphaCrownConfig,
    budget: Budget | None = None,
    intervals: dict[str, Interval] | None = None,
    *,
    deadline: float | None = None,
    init_slopes: dict[str, Tensor] | None = None,
    exact: bool = True,
    durations: list[float] | None = None,
) -> tuple[Tensor, Tensor, dict[str, Interval], dict]:
    """Optimised-slope bounds on `C . y`: `(lower, upper, intervals, stats)`.

    `intervals`: valid intervals of every node to start from (default: CROWN's); they are never
    loosened. `deadline` (`time.monotonic()`) and `budget.seconds` (from the call): whichever
    comes first ends the call (see the module docstring). `init_slopes`: output slopes to start
    from (`{activation: [B, 2S, *shape]}`, e.g. a previous run's `best_slopes`; with 0
    iterations the bound at exactly those slopes). `stats['final_slopes']` maps each activation
    to its last output slopes `[B, 2S, *shape]` (specs `C` then `-C`), `stats['best_slopes']`
    to the slopes of each spec's best bound. `durations`: the seconds of the chunks that
    computed `intervals` (`crown_intervals(..., durations=)`): they predict the first pass, so
    a call whose first chunk would end past the deadline gives the output's interval at once.

    The optimisation's passes do not track their rounding; the result is one more pass with
    tracked rounding (`_sound_pass`, float64). `exact=False`: the iterations' own best bounds
    and intervals instead (faster; not sound in floating point)."""
    start_time = time.perf_counter()
    stop_at = deadline_of(budget, deadline)
    durations = [] if durations is None else durations  # CROWN's chunks predict the first pass
    cone = spec_cone(graph, C)
    base = intervals if intervals is not None else crown_intervals(
        graph, box, deadline=stop_at, exact=exact, durations=durations, cone=cone)  # fmt: skip
    predicted = predicted_past(stop_at, durations)  # not even a chunk fits
    targets = intermediate_targets(
        graph, box, base, config.optimize_intermediate, stop_at, predicted, cone
    )
    batch = box.lower.shape[0]
    chunks = {n: neuron_chunk(graph, batch, index.numel()) for n, index in targets.items()}
    problem = _Problem(graph, box, C, base, targets, (), chunks)
    alphas = _with_slopes(problem, _init_alphas(problem), init_slopes)
    use = _use_compile(config, box.lower.device) and bool(alphas)
    inner = None if use else stop_at  # compiled steps: paced between iterations only
    problem = _Problem(
        graph, box, C, base, targets, tuple(alphas), chunks, inner,
        durations=None if use else durations,
    )  # fmt: skip
    iterations = (
        budget.iterations if budget and budget.iterations is not None else config.iterations
    )
    if predicted:  # the output's interval
        return _interval_result(graph, C, base, alphas)
    state = _initial_state(problem, alphas)
    if not alphas:  # nothing to optimise (no ambiguous neuron): one bound pass
        iterations = 0
    step = step_function(alpha_step, use, deadline=stop_at)  # no compile past the deadline
    if use:
        base_tensors = [(iv.lower, iv.upper) for iv in base.values()]
        mark_batch_dynamic((box.lower, box.upper, C, base_tensors, state))
    lr = torch.full((), config.lr, dtype=box.lower.dtype, device=box.lower.device)
    pacer = Pacer(stop_at)
    state, evaluated, trajectory, it = _iterate(
        problem, state, step, lr, config, iterations, use, pacer, start_time
    )
    final, stats = _stats(problem, state, evaluated, trajectory, it)
    return _result(problem, final, state, stats, exact, pacer)


def _sound_pass(p: _Problem, final: dict, state: AlphaState) -> tuple[Tensor, dict[str, Interval]]:
    """The bounds `[B, 2S]` and intervals that hold in floating point (`bounds.rounding`): one
    pass with tracked rounding, in float64 (`Graph.float64`) and rounded outward, at the best
    output slopes of each spec and the last intermediate slopes. (The optimisation's passes
    do not track their rounding: that would cost each iteration a float64 pass.)"""
    dtype = p.box.lower.dtype
    alphas = dict(final)
    for i, best in zip(p.out_index, state.best_slopes):
        alphas[p.keys[i]] = best
    with torch.no_grad():
        problem = _Problem(
            p.graph.float64, in_float64(p.box), p.C.double(),
            intervals_in_float64(p.base), p.targets, p.keys, p.chunks,
            p.deadline, sound=True, durations=p.durations,
        )  # fmt: skip
        result, intervals = _pass(problem, {k: a.detach().double() for k, a in alphas.items()})
    result = rounded_down(result, dtype)
    sound = intervals_outward(intervals, dtype)
    return result, {k: iv.intersect(p.base[k]) for k, iv in sound.items()}


def alpha_crown_intermediate(
    graph: Graph, box: Interval, C: Tensor, iterations: int = 50,
    given: dict[str, Interval] | None = None, deadline: float | None = None,
    start: IntermediateBounds | None = None,
) -> dict[str, Interval]:  # fmt: skip
    """alpha-CROWN's intervals, its slopes optimised for `C` (`IntermediateBounds`; its
    default iterations), CROWN's chunks predicting its first pass."""
    durations: list[float] = []
    base = crown_intervals(graph, box, given, deadline, durations=durations,
                           cone=spec_cone(graph, C))  # fmt: skip
    return alpha_crown(graph, box, C, AlphaCrownConfig(), intervals=base, deadline=deadline,
                       durations=durations)[2]  # fmt: skip


@register_method(
    "alpha-crown", AlphaCrownConfig, "CROWN with optimised slopes (Adam)",
    intermediate=alpha_crown_intermediate,
)  # fmt: skip
def _alpha_crown(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    deadline = deadline_of(budget)
    cone = spec_cone(graph, C)  # the neurons C's rows depend on
    base = crown_intervals(graph, box, given, deadline, exact=exact, cone=cone) if given else None
    return alpha_crown(graph, box, C, config, budget, intervals=base, deadline=deadline,
                       exact=exact)  # fmt: skip
