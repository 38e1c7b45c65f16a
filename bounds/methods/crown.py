"""Backward linear bound propagation: CROWN (Zhang et al., NeurIPS 2018) / Wong and Kolter
(ICML 2018), on a DAG of BoundOps.

A functional `A` on a start node is pushed backward through every op: affine ops by their
adjoint (bias terms collected), activations by the relaxation's lines chosen by the sign of the
coefficient, and at the input it is minimised over the box in closed form. Pre-activation bounds
are computed node by node in topological order (IBP, then CROWN on the neurons IBP leaves
ambiguous; the intersection of both is kept).

The backward pass itself and its rounding are in `bounds.methods.backward`, the chunking of a
layer's neurons and the deadline in `bounds.methods.chunks`; here: the neurons' bounds (dense,
from a fully connected layer's rows, or in patches mode on a convolution's windows), CROWN's
intervals and its bounds on the output.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from bounds.errors import at_node
from bounds.graph.cone import in_cone, spec_cone
from bounds.graph.graph import Graph, Node, node_interval
from bounds.methods.backward import (
    Lines,
    LinesFn,
    add_rounding,
    backward_bound,
    backward_linear,
    concretize,
    relaxation_bounds,
)
from bounds.methods.chunks import ChunkLinesFn, bound_in_chunks, predicted_past, unit_functionals
from bounds.methods.copies import CopyChain, copy_chain, source_elements
from bounds.methods.pacing import deadline_of, passed
from bounds.methods.patches import (
    Windows,
)
from bounds.methods.windows import patch_bound, patches_start, window_lines
from bounds.ops import (
    ActivationOp,
    LinearOp,
    UnaryAffineOp,
)
from bounds.registry import IntermediateBounds, MethodResult, NoConfig, register_method
from bounds.rounding import (
    bounds_in_float64,
    in_float64,
    intervals_in_float64,
    intervals_outward,
    lower_minus,
)
from bounds.types import Interval
from relaxations import LinearBounds


def unstable_indices(graph: Graph, name: str, bounds: Interval) -> Tensor:
    """Flat indices of the neurons of node `name` (with intervals `bounds`) whose relaxation in
    some activation it feeds is not exact (`Relaxation.needs_refinement`), in any batch element."""
    mask = torch.zeros_like(bounds.lower, dtype=torch.bool)
    for act in graph.consumers(name):
        if isinstance(act.op, ActivationOp):
            mask = mask | act.op.relaxation.needs_refinement(bounds.lower, bounds.upper)
    return mask.flatten(1).any(0).nonzero().flatten()


def _rows_bound(
    graph: Graph, start: str, index: Tensor, box: Interval, lines: LinesFn,
    intervals: dict[str, Interval] | None = None,
) -> Tensor:  # fmt: skip
    """`backward_bound` of `+e_j` then `-e_j` (`j` in `index`) on a fully connected layer
    `y = W x + b`, its first step taken as the rows `+-W_j` on its input and the bias `+-b_j`
    (no identity times `W`)."""
    op, batch = graph[start].op, box.lower.shape[0]
    rows = op.weight.index_select(0, index)
    A = torch.cat([rows, -rows]).unsqueeze(0).expand(batch, -1, -1)
    bias = box.lower.new_zeros(1, 2 * index.numel())
    if op.bias is not None:
        b = op.bias.index_select(0, index)
        bias = torch.cat([b, -b]).unsqueeze(0)
    below = backward_bound(graph, graph[start].inputs[0], A, box, lines, intervals)
    if intervals is None:
        return bias + below
    total, err = add_rounding(bias, below)
    return lower_minus(total, err)


def bound_neurons(
    graph: Graph, node: str, index: Tensor, box: Interval, lines_for: ChunkLinesFn,
    step: int | None = None, deadline: float | None = None,
    intervals: dict[str, Interval] | None = None, durations: list[float] | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """CROWN lower/upper bounds `[batch, k]` of the flat neurons `index` of `node`;
    `lines_for(offset, count)` gives the lines for the chunk `index[offset:offset+count]`;
    chunks after `deadline` are skipped (`-inf` / `+inf`, see `bound_in_chunks`). The neurons
    of a convolution are bounded in patches mode (`patch_bound`), those of a fully connected
    layer from its rows (`_rows_bound`), others by `backward_bound` on `unit_functionals`."""
    batch = box.lower.shape[0]
    shape = graph[node].shape

    def lower_bound(part: Tensor, offset: int) -> Tensor:
        lines = lines_for(offset, part.numel())
        if patches_start(graph[node]):
            return patch_bound(graph, node, part, box, lines, intervals)
        if isinstance(graph[node].op, LinearOp):
            return _rows_bound(graph, node, part, box, lines, intervals)
        A = unit_functionals(part, shape, batch, box.lower)
        return backward_bound(graph, node, A, box, lines, intervals)

    return bound_in_chunks(
        graph, node, index, batch, box.lower, lower_bound, step, deadline, durations
    )


def straight_through(value: Tensor, surrogate: Tensor) -> Tensor:
    """`value`, differentiated as `surrogate` (Bengio et al., 2013, "straight-through").

    Used where a bound is the intersection of the slopes' own bound with a fixed valid one
    (CROWN's intervals, IBP, the output's interval): the value stays the tighter one (sound),
    the gradient is the slopes' own, so a slope whose bound is currently looser still ascends.
    The intersection's own gradient is zero there: after a large Adam step most intermediate
    bounds fall behind CROWN's and their slopes froze (measured on ACAS Xu: looser bounds as the
    learning rate rose; benchmarks/peer_bounds.py). Where `surrogate` is not finite (a chunk
    skipped past the deadline), `value` with its own gradient. The result is `value` exactly:
    `value + (s - s)` with `s - s = 0` in floating point, where `s + (value - s)` would round
    `value - s` and could come out above a valid lower bound."""
    surrogate = torch.where(torch.isfinite(surrogate), surrogate, value)
    return value.detach() + (surrogate - surrogate.detach())


def scatter_bounds(
    prior: Interval, index: Tensor, lower: Tensor, upper: Tensor, straight: bool = False
) -> Interval:
    """`prior` tightened at the flat `index` by `lower`/`upper` (intersection: both are valid);
    `straight`: differentiated at `index` as `lower`/`upper` alone (`straight_through`)."""
    flat_l, flat_u = prior.lower.flatten(1), prior.upper.flatten(1)
    low = torch.maximum(flat_l[:, index], lower)
    up = torch.minimum(flat_u[:, index], upper)
    if straight:
        low, up = straight_through(low, lower), straight_through(up, upper)
    new_l, new_u = flat_l.index_copy(1, index, low), flat_u.index_copy(1, index, up)
    return Interval(new_l.reshape(prior.lower.shape), new_u.reshape(prior.upper.shape))


def is_first_affine(graph: Graph, node: Node) -> bool:
    """A single affine op on the input box: IBP is already exact there."""
    return isinstance(node.op, UnaryAffineOp) and node.inputs == (graph.input.name,)


def default_lines(graph: Graph, intervals: dict[str, Interval]) -> LinesFn:
    """CROWN's lines (adaptive lower slope) from the pre-activation intervals."""
    cache: dict[str, LinearBounds] = {}

    def lines(act: str, windows: Windows | None = None) -> Lines:
        if act not in cache:
            lower, upper = relaxation_bounds(graph, act, intervals, unsqueeze=True)
            relaxation = graph[act].op.relaxation
            cache[act] = at_node(relaxation.name, act, relaxation.linear_bounds, lower, upper)
        line = cache[act]
        return line if windows is None else window_lines(line, windows, graph[act].shape)

    return lines


def constant_lines(lines: LinesFn) -> ChunkLinesFn:
    """The same lines for every chunk of specs."""
    return lambda offset, count: lines


def output_functional(graph: Graph, C: Tensor) -> Tensor:
    """`[batch, 2S, *out_shape]`: `C` then `-C` (lower bounds of both give lower and upper)."""
    batch, specs = C.shape[:2]
    both = torch.cat([C, -C], dim=1)
    return both.reshape(batch, 2 * specs, *graph.output.shape)


def split_output(result: Tensor) -> tuple[Tensor, Tensor]:
    """Lower and upper bounds from the stacked `[C; -C]` result."""
    specs = result.shape[1] // 2
    return result[:, :specs], -result[:, specs:]


def needs_crown(graph: Graph) -> list[str]:
    """Pre-activation nodes whose bounds CROWN can tighten (not a single affine op on the box)."""
    names = dict.fromkeys(graph.pre_activation_names())
    return [n for n in names if graph[n].op is not None and not is_first_affine(graph, graph[n])]


def crown_intervals(
    graph: Graph,
    box: Interval,
    given: dict[str, Interval] | None = None,
    deadline: float | None = None,
    every_neuron: bool = False,
    exact: bool = True,
    durations: list[float] | None = None,
    targets: list[str] | None = None,
    cone: dict[str, Tensor] | None = None,
) -> dict[str, Interval]:
    """Intervals of every node: IBP, intersected with CROWN on the ambiguous pre-activations
    and with the `given` intervals (valid on the region: e.g. the ReLU splits of a branch-and-
    bound domain, `lower = 0` for an active neuron, `upper = 0` for an inactive one). Once
    `deadline` (`time.monotonic()`) has passed, the remaining neurons keep their IBP intervals
    (valid, looser): the call ends within one chunk of the deadline.

    A neuron ambiguous in any batch element is bounded by CROWN in all of them, which can
    tighten an element's (stable) neuron and so its later layers: a box's bounds depend a
    little on its batch. `every_neuron`: bound every neuron of those nodes by CROWN (at least
    as tight for each box as any batch gives it; used to re-check a batch's bounds).

    Sound in floating point (`bounds.rounding`): a float32 network's intervals are computed in
    float64 (`Graph.float64`) and rounded outward. `exact=False`: in the network's dtype, the
    backward passes' rounding not accounted for (faster; not sound in floating point: for
    searches whose closing bounds are rechecked exactly). `targets`: the pre-activations CROWN
    bounds (default: `needs_crown`); the others keep IBP's intervals (with `given`). `cone`
    (`bounds.graph.cone.spec_cone`): CROWN bounds only the neurons in it, the others keep
    their IBP intervals (the bounds on the cone's outputs are the same)."""
    if exact and box.lower.dtype != torch.float64:
        found = crown_intervals(
            graph.float64, in_float64(box), intervals_in_float64(given), deadline, every_neuron,
            True, durations, targets, cone,
        )  # fmt: skip
        return intervals_outward(found, box.lower.dtype)
    intervals: dict[str, Interval] = {graph.input.name: box}
    durations = [] if durations is None else durations  # one chunk's seconds predict the next
    targets = set(needs_crown(graph) if targets is None else targets)
    given = given or {}
    done: dict[str, Tensor] = {}  # per copied node, its elements bounded (`_through_copies`)
    for node in graph.nodes[1:]:
        iv = node_interval(node, [intervals[i] for i in node.inputs])
        if node.name in given:
            iv = iv.intersect(given[node.name])
        if node.name in targets and not passed(deadline):
            index = unstable_indices(graph, node.name, iv)
            if every_neuron:
                index = torch.arange(iv.lower[0].numel(), device=iv.lower.device)
            index = in_cone(cone, node.name, index)
            if index.numel():
                chain = copy_chain(graph, node.name)
                bound = partial(_crown_neurons, graph, box, intervals, deadline, exact, durations)
                if chain is None:
                    iv = scatter_bounds(iv, index, *bound(node.name, index))
                else:
                    iv = _through_copies(graph, chain, index, intervals, given, bound, done)
        intervals[node.name] = iv
    return intervals


def _crown_neurons(
    graph: Graph, box: Interval, intervals: dict[str, Interval], deadline: float | None,
    exact: bool, durations: list[float], name: str, index: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`bound_neurons` on the flat `index` of node `name`, CROWN's lines from `intervals`."""
    lines_for = constant_lines(default_lines(graph, intervals))
    tracked = intervals if exact else None
    return bound_neurons(graph, name, index, box, lines_for, None, deadline, tracked, durations)


def _through_copies(
    graph: Graph, chain: CopyChain, index: Tensor, intervals: dict[str, Interval],
    given: dict[str, Interval], bound: Callable[[str, Tensor], tuple[Tensor, Tensor]],
    done: dict[str, Tensor],
) -> Interval:  # fmt: skip
    """The interval of the copy at the end of `chain` once the source elements of its flat
    `index` are bounded by CROWN (`bounds.methods.copies`; those in `done`, bounded already
    for another copy, are not bounded again): the source's interval is tightened in
    `intervals` and carried along the chain by its (exact) intervals, `given` applied."""
    source = chain.source
    first = source == graph.input.name or is_first_affine(graph, graph[source])
    src = source_elements(chain, index, done.get(source))
    if not first and src.numel():
        intervals[source] = scatter_bounds(intervals[source], src, *bound(source, src))
        mask = done.get(source)
        if mask is None:
            mask = src.new_zeros(intervals[source].lower[0].numel(), dtype=torch.bool)
        done[source] = mask.index_fill(0, src, True)
    iv = intervals[source]
    for node in chain.nodes:
        iv = node_interval(node, [iv])
        if node.name in given:
            iv = iv.intersect(given[node.name])
    return iv


def interval_bound(C: Tensor, output: Interval) -> Tensor:
    """Lower bounds of `C . y` and `-C . y` `[B, 2S]` from the output's interval (valid, cheap)."""
    A = torch.cat([C, -C], dim=1)
    return concretize(A, Interval(output.lower.flatten(1), output.upper.flatten(1)))


def crown(
    graph: Graph, box: Interval, C: Tensor, given: dict[str, Interval] | None = None,
    every_neuron: bool = False, deadline: float | None = None, exact: bool = True,
    linear: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor, dict[str, Interval]]:  # fmt: skip
    """CROWN bounds on `C . y`: `(lower [B, S], upper [B, S], intervals per node)`
    (`every_neuron`, `deadline`: see `crown_intervals`; past the deadline the neurons left keep
    their IBP intervals, and if it has passed before the output's backward pass, or that pass
    is predicted (as long as the longest intermediate chunk) to end past it, the output's
    interval gives the bounds: a pass through a large network can take seconds). A float32
    network's bounds are computed in float64 and rounded outward (`bounds.rounding`);
    `exact=False`: see `crown_intervals`.

    `linear` (a dict, filled when the output's pass ran): "A" `[B, S, n_in]`, the functional
    on the (flattened) input of the lower bounds of `C . y`, and "lower" `[B, S]` the bounds
    that pass gave (before the interval bound's maximum): `C . y >= A . x + (lower - min_box
    A . x)` on the box, exactly when `exact` (in float64 then, also for a float32 network;
    `backward_linear`)."""
    if exact and box.lower.dtype != torch.float64:
        args = (every_neuron, deadline, True, linear)
        return bounds_in_float64(crown, graph, box, C, given, *args)
    durations: list[float] = []
    cone = spec_cone(graph, C)
    intervals = crown_intervals(
        graph, box, given, deadline, every_neuron, exact, durations, cone=cone
    )
    # the output's pass, predicted to take as long as the longest intermediate chunk
    run = not passed(deadline) and not predicted_past(deadline, durations)
    return (*output_bounds(graph, box, C, intervals, exact, linear, run), intervals)


def output_bounds(
    graph: Graph, box: Interval, C: Tensor, intervals: dict[str, Interval], exact: bool,
    linear: dict[str, Tensor] | None = None, backward: bool = True,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Lower and upper bounds `[B, S]` of `C . y` on the nodes' `intervals`: the output
    interval's, and (`backward`) the better of those and CROWN's backward pass from the
    output (its rounding tracked when `exact`); `linear`: filled as `crown` says."""
    result = interval_bound(C, intervals[graph.output.name])
    if backward:
        A = output_functional(graph, C)
        lines = default_lines(graph, intervals)
        tracked = intervals if exact else None
        found, functional = backward_linear(graph, graph.output.name, A, box, lines, tracked)
        result = torch.maximum(result, found)
        if linear is not None and functional is not None:
            specs = C.shape[1]
            linear["A"] = functional[:, :specs].flatten(2)
            linear["lower"] = found[:, :specs]
    return split_output(result)


def linear_stats(linear: dict[str, Tensor]) -> dict[str, Tensor]:
    """A method's stats from `crown`'s `linear`: "input_functional" and "linear_lower" (none
    when the output's pass did not run)."""
    return {"input_functional": linear["A"], "linear_lower": linear["lower"]} if linear else {}


def crown_intermediate(
    graph: Graph, box: Interval, C: Tensor, iterations: int = 50,
    given: dict[str, Interval] | None = None, deadline: float | None = None,
    start: IntermediateBounds | None = None,
) -> dict[str, Interval]:  # fmt: skip
    """CROWN's intervals (`IntermediateBounds`), of the neurons in the cone of `C`."""
    return crown_intervals(graph, box, given, deadline, cone=spec_cone(graph, C))


@register_method(
    "crown", NoConfig, "CROWN / Wong-Kolter backward linear bounds", intermediate=crown_intermediate
)
def _crown(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    """stats: "input_functional" and "linear_lower", the output pass's `linear` (`crown`)."""
    linear: dict[str, Tensor] = {}
    found = crown(graph, box, C, given, deadline=deadline_of(budget), exact=exact, linear=linear)
    return (*found, linear_stats(linear))
