"""Backward linear bound propagation: CROWN (Zhang et al., NeurIPS 2018) / Wong and Kolter
(ICML 2018), on a DAG of BoundOps.

A functional `A` on a start node is pushed backward through every op: affine ops by their
adjoint (bias terms collected), activations by the relaxation's lines chosen by the sign of the
coefficient, and at the input it is minimised over the box in closed form. Pre-activation bounds
are computed node by node in topological order (IBP, then CROWN on the neurons IBP leaves
ambiguous; the intersection of both is kept).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from bounds.errors import at_node
from bounds.graph.graph import Graph, Node, node_interval
from bounds.methods.pacing import Pacer, passed
from bounds.methods.patches import (
    Windows,
    masked,
    read_windows,
    to_dense,
    unit_values,
    unit_windows,
)
from bounds.ops import ActivationOp, ConvOp, LinearOp, MultiActivationOp, UnaryAffineOp
from bounds.rounding import (
    bounds_in_float64,
    error_bound,
    in_float64,
    intervals_in_float64,
    intervals_outward,
    lower_minus,
    magnitude,
)
from bounds.types import Interval
from relaxations import LinearBounds
from relaxations.base import MultiLinearBounds

Lines = LinearBounds | MultiLinearBounds

# Largest functional (batch x specs x elements of a node) processed at once: 2^25 floats.
MAX_FUNCTIONAL_ELEMENTS = 1 << 25

# Neurons per chunk below which a deadline does not split a layer's bound further.
DEADLINE_CHUNK = 32

# activation node (and windows, `patch_bound`) -> its lines for one backward pass: broadcastable
# to `[batch, specs, *shape]`, or with windows `[batch or 1, specs, C, Mh, Mw]` read at them.
LinesFn = Callable[..., Lines]
ChunkLinesFn = Callable[[int, int], LinesFn]  # (first neuron, count) of a chunk -> lines
RelaxFn = Callable[[Node, Tensor], tuple[Tensor, Tensor, Tensor | None]]  # see `backward_pass`


PAIRING_MATVEC = 1 << 15  # elements of `A` from which a shared `t` pays as a matvec


def pairing(A: Tensor, t: Tensor) -> Tensor:
    """`A . t` per spec, `[batch, specs]`, for `t` broadcastable to `A [batch, specs, *shape]`;
    a `t` shared by the specs (`[batch or 1, 1, *shape]`) on a large `A` is a matrix-vector
    product (no `A`-sized temporary; on small ones its extra ops cost more than they save:
    ACAS Xu's CROWN pass 0.56 ms of 4.6)."""
    shared = t.dim() == A.dim() and t.shape[1] == 1 and t.shape[2:] == A.shape[2:]
    if shared and A.numel() >= PAIRING_MATVEC:
        return (A.flatten(2) @ t.flatten(2).transpose(1, 2)).squeeze(-1)
    return (A * t).flatten(2).sum(-1)


def lower_over(A: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """`min A . x` over the box `low <= x <= high` (broadcast against `A [batch, specs, ...]`),
    shape `[batch, specs]`: `A+ . low + A- . high` from the endpoints (a centre and radius
    would cancel), minus its proven rounding error (`bounds.rounding`), rounded down."""
    pos, neg = A.clamp(min=0), A.clamp(max=0)
    value = pairing(pos, low) + pairing(neg, high)
    with torch.no_grad():
        # each end's own terms (a wide box must not loosen a bound near 0 of a tight end)
        mag = pairing(pos.detach(), low.abs()) - pairing(neg.detach(), high.abs())
        # each non-zero term: one product, then at most `nonzero - 1` additions that are not of
        # zeros (adding an exact zero does not round), and the parts' sum
        nonzero = (A.detach() != 0).flatten(2).sum(-1) if A.dim() > 2 else (A.detach() != 0).long()
        err = error_bound(mag, nonzero + 1, nonzero)
    return lower_minus(value, err)


def concretize(A: Tensor, box: Interval) -> Tensor:
    """`min_{x in box} A . x`, shape `[batch, specs]` (sound in floating point)."""
    return lower_over(A, box.lower.unsqueeze(1), box.upper.unsqueeze(1))


def output_interval(node: Node, intervals: dict[str, Interval]) -> Interval:
    """The node's interval: as given, or (the start of a pass, not bounded yet) its op's
    interval of its inputs' (sound either way)."""
    if node.name in intervals:
        return intervals[node.name]
    return node.op.interval(*(intervals[i] for i in node.inputs))


def add_rounding(total: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """`total + value` and the bound on that addition's rounding."""
    new = total + value
    return new, error_bound(new.detach().abs(), 1, 1)


def relax_rounding(A: Tensor, new_A, lines: Lines, size_in, size_out: Tensor, ulps: int) -> Tensor:
    """A proven bound `[batch, specs]` on the rounding of `relax_backward(A, lines)` and of the
    lines themselves, as they enter a linear bound: the lines' formulas are within `ulps` ulps
    of exact ones, `|line(x) - exact| <= ulps u (|s| |x| + |t| + |f(x)|)` (`bounds.rounding`),
    the new functional is one rounding per element, and the intercepts' pairing a sum of `N`
    terms. `size_in` / `size_out`: magnitudes of the activation's input(s) and output,
    broadcastable to `A`."""
    with torch.no_grad():
        A = A.detach()
        parts = new_A if isinstance(new_A, tuple) else (new_A,)
        sizes = size_in if isinstance(size_in, tuple) else (size_in,)
        # |A| . (|f| + |t|) with the larger intercept of the two lines: one product with a
        # vector the specs share (the intercept chosen by A's sign would not be)
        intercept = torch.maximum(lines.lower_intercept.abs(), lines.upper_intercept.abs())
        mag = pairing(A.abs(), size_out + intercept)
        for part, size in zip(parts, sizes):
            mag = mag + pairing(part.detach().abs(), size)
        n = int(A[0, 0].numel())
        return error_bound(mag, n + 2 + ulps, n)


def relax_backward(A: Tensor, lines: Lines) -> tuple[Tensor | tuple[Tensor, ...], Tensor]:
    """Replace an activation by its lower line where `A >= 0`, its upper line elsewhere: the
    functional on its input (a tuple, one per input, for `MultiLinearBounds`) and the bias."""
    pos, neg = A.clamp(min=0), A.clamp(max=0)
    if isinstance(lines, MultiLinearBounds):
        new_A = tuple(
            pos * low + neg * up for low, up in zip(lines.lower_slopes, lines.upper_slopes)
        )
    else:
        new_A = pos * lines.lower_slope + neg * lines.upper_slope
    return new_A, pairing(pos, lines.lower_intercept) + pairing(neg, lines.upper_intercept)


def relaxation_bounds(graph: Graph, act: str, intervals: dict[str, Interval], unsqueeze=False):
    """The `(lower, upper)` that activation `act`'s relaxation takes, from its inputs'
    intervals (tensors, or tuples for a several-input op); `unsqueeze`: with a spec dimension
    (dim 1) inserted, to broadcast against `[batch, specs, *shape]` parameters."""
    node = graph[act]
    lower, upper = node.op.relaxation_bounds(*(intervals[i] for i in node.inputs))
    if unsqueeze:
        lower, upper = _map(lambda t: t.unsqueeze(1), lower), _map(lambda t: t.unsqueeze(1), upper)
    return lower, upper


def _map(fn, value):
    return tuple(fn(v) for v in value) if isinstance(value, tuple) else fn(value)


def backward_bound(
    graph: Graph, start: str, A: Tensor, box: Interval, lines: LinesFn,
    intervals: dict[str, Interval] | None = None,
) -> Tensor:  # fmt: skip
    """Lower bound of `A . v_start` over the input box, `[batch, specs]`.

    `lines(act)` gives the activation's lines, broadcastable to `[batch, specs, *shape]`.
    With the (sound) `intervals` of every node the pass reaches, the bound holds in floating
    point: every step's rounding is bounded and subtracted (`backward_pass`).
    """

    def relax(node: Node, coeff: Tensor):
        line = lines(node.name)
        new, bias = relax_backward(coeff, line)
        if intervals is None:
            return new, bias, None
        size_in = tuple(magnitude(intervals[i]).unsqueeze(1) for i in node.inputs)
        ulps = node.op.rounding_ulps()
        size_out = magnitude(output_interval(node, intervals)).unsqueeze(1)
        return (
            new,
            bias,
            relax_rounding(
                coeff, new, line, size_in if len(size_in) > 1 else size_in[0], size_out, ulps
            ),
        )

    return backward_pass(graph, start, A, box, relax, intervals)[0]


def _window_step(node: Node, w: Windows) -> bool:
    """Whether windows `w` on `node` go on through it: a convolution or an elementwise
    activation of one input on a `[C, H, W]` node larger than the window. (Every op on the way
    from the start then has one input, so no other path reaches the nodes passed: their
    functionals are complete when the windows pass them.)"""
    op = node.op
    if not isinstance(op, ConvOp | ActivationOp) or isinstance(op, MultiActivationOp):
        return False
    return len(node.shape) == 3 and w.size[0] * w.size[1] < node.shape[1] * node.shape[2]


def window_chain(graph: Graph, start: str, index: Tensor) -> Iterator[tuple[Node, Windows]]:
    """The nodes that the windows of the neurons `index` of the convolution `start` reach, each
    with its windows: from `start` to the input, or to the first node that is not a window step
    (`_window_step`), where the dense functional takes over."""
    node = graph[start]
    w = unit_windows(index, node.shape)
    while True:
        yield node, w
        if node.op is None or not _window_step(node, w):
            return
        if isinstance(node.op, ConvOp):
            w = Windows(*node.op.window_below(w.rows, w.cols, w.size))
        node = graph[node.inputs[0]]


def windowed_activations(graph: Graph, start: str, index: Tensor) -> dict[str, Windows]:
    """The activations whose lines `patch_bound` from the neurons `index` of `start` takes at
    windows, with the windows (none when `start` is not a convolution)."""
    if not isinstance(graph[start].op, ConvOp):
        return {}
    return {
        node.name: w
        for node, w in window_chain(graph, start, index)
        if isinstance(node.op, ActivationOp) and _window_step(node, w)
    }


def window_lines(line: LinearBounds, w: Windows, shape: tuple[int, ...]) -> LinearBounds:
    """Lines broadcastable to `[B, S, *shape]` read at the windows `w`: `[B or 1, S, C, Mh, Mw]`."""
    parts = (line.lower_slope, line.lower_intercept, line.upper_slope, line.upper_intercept)
    return LinearBounds(*(read_windows(t, w, shape) for t in parts))


def patch_bound(
    graph: Graph, start: str, index: Tensor, box: Interval, lines: LinesFn,
    intervals: dict[str, Interval] | None = None,
) -> Tensor:  # fmt: skip
    """Lower bounds `[batch, 2k]` of `+e_j` then `-e_j` for the flat neurons `index` of the
    convolution `start`: `backward_bound` on `unit_functionals` (the same sums, in another
    order), with the functionals kept on windows (`bounds.methods.patches`) along
    `window_chain`, each activation's lines taken at the windows (`lines(act, windows)`), and
    concretised at the input box read at the windows; where the chain stops before the input,
    the windows become the dense functional and `backward_bound` goes on from there. With
    `intervals`, sound in floating point as `backward_pass` is (each window step's rounding
    bounded against the magnitudes read at the windows)."""
    batch = box.lower.shape[0]
    values = unit_values(index, graph[start].shape, batch, box.lower)
    total = values.new_zeros(values.shape[:2])
    err = None if intervals is None else torch.zeros_like(total)

    def at(t: Tensor, w: Windows, shape) -> Tensor:
        return read_windows(t.unsqueeze(1), w, shape)

    def finish(value: Tensor) -> Tensor:
        result, added = add_rounding(total, value)
        return result if err is None else lower_minus(result, err + added)

    for node, w in window_chain(graph, start, index):
        if node.op is None:
            low, high = at(box.lower, w, node.shape), at(box.upper, w, node.shape)
            return finish(lower_over(values, low, high))
        if not _window_step(node, w):
            dense = to_dense(values, w, node.shape)
            return finish(backward_bound(graph, node.name, dense, box, lines, intervals))
        if isinstance(node.op, ConvOp):
            if err is not None:
                err = err + _window_conv_rounding(node, values, w, intervals)
            bias = node.op.bias_term(values)
            grown = node.op.adjoint_window(values.flatten(0, 1))
            below = Windows(*node.op.window_below(w.rows, w.cols, w.size))
            values = masked(
                grown.reshape(*values.shape[:2], *grown.shape[1:]), below, node.op.in_shape
            )
        else:
            line = lines(node.name, w)
            new, bias = relax_backward(values, line)
            if err is not None:
                size_in = at(magnitude(intervals[node.inputs[0]]), w, node.shape)
                size_out = at(magnitude(output_interval(node, intervals)), w, node.shape)
                ulps = node.op.rounding_ulps()
                err = err + relax_rounding(values, new, line, size_in, size_out, ulps)
            values = new
        total, added = add_rounding(total, bias)
        err = None if err is None else err + added
    raise AssertionError("window_chain ends at the input or at a dense step")


def _window_conv_rounding(node: Node, values: Tensor, w: Windows, intervals) -> Tensor:
    """`ConvOp.backward_error` for functionals on windows `w` of the convolution's output:
    `|L| m` and `|b|` read at the windows."""
    op = node.op
    with torch.no_grad():
        absV = values.detach().abs()
        spread = op.abs_linear(magnitude(intervals[node.inputs[0]]))
        n = op.fan_out()
        err = error_bound(pairing(absV, read_windows(spread.unsqueeze(1), w, node.shape)), n + 2, n)
        if op.bias is not None:
            full = torch.broadcast_to(op.bias_vector().abs(), node.shape).unsqueeze(0).unsqueeze(1)
            m = int(values[0, 0].numel())
            err = err + error_bound(pairing(absV, read_windows(full, w, node.shape)), m + 2, m)
        return err


def backward_pass(
    graph: Graph, start: str, A: Tensor, box: Interval, relax: RelaxFn,
    intervals: dict[str, Interval] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The backward pass of `A . v_start` to the input: `(lower bound [batch, specs], the
    functional on the input [batch, specs, *input_shape] or None if it does not reach it)`.
    `relax(node, coeff)` replaces activation `node` seen with functional `coeff` on its output:
    it returns the functional on the activation's input, the bias term `[batch, specs]` and a
    bound on that step's rounding, or None (CROWN: `relax_backward` and `relax_rounding`;
    beta-CROWN adds its split multipliers).

    With `intervals` (sound intervals of every node the pass reaches), the bound holds in
    floating point (`bounds.rounding`): the computed functionals are the multipliers, and each
    step's deviation from the exact identity it stands for is bounded against the magnitudes of
    the nodes' values (`BoundOp.backward_error`, `relax_rounding`, the merges of functionals
    and the running sum), then subtracted, rounded down. A step whose rounding is unknown
    (`relax` gives None) makes the bound -inf."""
    pending: dict[str, Tensor] = {start: A}
    total = A.new_zeros(A.shape[:2])
    err = A.new_zeros(A.shape[:2]) if intervals is not None else None
    sizes: dict[str, Tensor] = {}

    def size(name: str) -> Tensor:
        if name not in sizes:
            sizes[name] = magnitude(intervals[name])
        return sizes[name]

    input_coeff = None
    for node in reversed(graph.nodes):
        coeff = pending.pop(node.name, None)
        if coeff is None:
            continue
        if node.op is None:
            total, added = add_rounding(total, concretize(coeff, box))
            err = None if err is None else err + added
            input_coeff = coeff
            continue
        if isinstance(node.op, ActivationOp):
            coeff, bias, step_err = relax(node, coeff)
            parts = coeff if isinstance(coeff, tuple) else (coeff,)
        else:
            bias = node.op.bias_term(coeff)
            parts = node.op.vjp(coeff)
            step_err = None
            if err is not None:
                with torch.no_grad():
                    step_err = node.op.backward_error(
                        coeff.detach(), [size(i) for i in node.inputs]
                    )
        total, added = add_rounding(total, bias)
        if err is not None:
            step_err = torch.full_like(err, torch.inf) if step_err is None else step_err
            err = err + added + step_err
        for name, part in zip(node.inputs, parts):
            if name in pending:
                pending[name] = pending[name] + part
                if err is not None:
                    with torch.no_grad():
                        merged = pairing(pending[name].detach().abs(), size(name).unsqueeze(1))
                        err = err + error_bound(merged, 1, 1)
            else:
                pending[name] = part
    if err is not None:
        total = lower_minus(total, err)
    return total, input_coeff


def unstable_indices(graph: Graph, name: str, bounds: Interval) -> Tensor:
    """Flat indices of the neurons of node `name` (with intervals `bounds`) whose relaxation in
    some activation it feeds is not exact (`Relaxation.needs_refinement`), in any batch element."""
    mask = torch.zeros_like(bounds.lower, dtype=torch.bool)
    for act in graph.consumers(name):
        if isinstance(act.op, ActivationOp):
            mask = mask | act.op.relaxation.needs_refinement(bounds.lower, bounds.upper)
    return mask.flatten(1).any(0).nonzero().flatten()


def unit_functionals(index: Tensor, shape: tuple[int, ...], batch: int, like: Tensor) -> Tensor:
    """`[batch, 2k, *shape]`: rows `+e_j` then `-e_j` for each flat index `j` in `index`."""
    k = index.numel()
    numel = 1
    for d in shape:
        numel *= d
    eye = like.new_zeros(k, numel)
    eye[torch.arange(k), index] = 1.0
    both = torch.cat([eye, -eye]).reshape(2 * k, *shape)
    return both.unsqueeze(0).expand(batch, *both.shape)


def spec_chunk(graph: Graph, batch: int) -> int:
    """Specs per backward pass so the largest functional stays under MAX_FUNCTIONAL_ELEMENTS."""
    widest = max(int(torch.Size(n.shape).numel()) for n in graph.nodes)
    return max(1, MAX_FUNCTIONAL_ELEMENTS // (batch * widest))


def neuron_chunk(graph: Graph, batch: int, count: int) -> int:
    """Neurons per backward pass (each gives two specs, `+e_j` and `-e_j`), at most `count`."""
    return min(count, max(1, spec_chunk(graph, batch) // 2))


def predicted_past(deadline: float | None, durations: list[float] | None) -> bool:
    """Whether a pass as long as the longest of `durations` would end past `deadline`."""
    if deadline is None or not durations:
        return False
    return time.monotonic() + max(durations) > deadline


def bound_in_chunks(
    graph: Graph, node: str, index: Tensor, batch: int, like: Tensor, lower_bound: Callable,
    step: int | None = None, deadline: float | None = None,
    durations: list[float] | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Lower/upper bounds `[batch, k]` of the flat neurons `index` of `node`, chunked so the
    functionals stay under MAX_FUNCTIONAL_ELEMENTS: `lower_bound(part, offset)` gives lower
    bounds `[batch, 2 count]` of `+e_j` then `-e_j` for the flat neurons `part =
    index[offset:offset+count]` (e.g. `unit_functionals(part, ...)`, or `patch_bound`).
    `step`: neurons per chunk (default `neuron_chunk`; compiled callers fix it outside).
    `deadline` (`time.monotonic()`): at most an eighth of the neurons (and no fewer than
    `DEADLINE_CHUNK`) per chunk, and the chunks left once it has passed, or once the next one
    is predicted (from the last two) to end past it, are not bounded: their neurons get
    `-inf` / `+inf` (no information: the caller's intervals stay as they are). `durations`:
    the seconds of earlier chunks (of other layers too; appended to): a first chunk predicted
    from them to end past the deadline is not started either."""
    step = step or neuron_chunk(graph, batch, index.numel())
    if deadline is not None:  # finer chunks: a chunk that crosses the deadline is small
        step = min(step, max(DEADLINE_CHUNK, -(-index.numel() // 8)))
    lowers, uppers = [], []
    pacer = None if deadline is None else Pacer(deadline)  # None: compiled callers
    stop = passed(deadline) or predicted_past(deadline, durations)
    for offset in range(0, index.numel(), step):
        part = index[offset : offset + step]
        if stop:
            lowers.append(like.new_full((batch, part.numel()), -torch.inf))
            uppers.append(like.new_full((batch, part.numel()), torch.inf))
            continue
        tick = time.monotonic() if durations is not None else 0.0  # no clock in compiled code
        result = lower_bound(part, offset)
        lowers.append(result[:, : part.numel()])
        uppers.append(-result[:, part.numel() :])
        if durations is not None:
            durations.append(time.monotonic() - tick)
        stop = pacer is not None and pacer.done()
    return torch.cat(lowers, 1), torch.cat(uppers, 1)


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
        if isinstance(graph[node].op, ConvOp):
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
    searches whose closing bounds are rechecked exactly)."""
    if exact and box.lower.dtype != torch.float64:
        found = crown_intervals(
            graph.float64, in_float64(box), intervals_in_float64(given), deadline, every_neuron,
            True, durations,
        )  # fmt: skip
        return intervals_outward(found, box.lower.dtype)
    intervals: dict[str, Interval] = {graph.input.name: box}
    durations = [] if durations is None else durations  # one chunk's seconds predict the next
    targets = set(needs_crown(graph))
    given = given or {}
    for node in graph.nodes[1:]:
        iv = node_interval(node, [intervals[i] for i in node.inputs])
        if node.name in given:
            iv = iv.intersect(given[node.name])
        if node.name in targets and not passed(deadline):
            index = unstable_indices(graph, node.name, iv)
            if every_neuron:
                index = torch.arange(iv.lower[0].numel(), device=iv.lower.device)
            if index.numel():
                lines_for = constant_lines(default_lines(graph, intervals))
                tracked = intervals if exact else None
                low, up = bound_neurons(
                    graph, node.name, index, box, lines_for, None, deadline, tracked, durations
                )
                iv = scatter_bounds(iv, index, low, up)
        intervals[node.name] = iv
    return intervals


def interval_bound(C: Tensor, output: Interval) -> Tensor:
    """Lower bounds of `C . y` and `-C . y` `[B, 2S]` from the output's interval (valid, cheap)."""
    A = torch.cat([C, -C], dim=1)
    return concretize(A, Interval(output.lower.flatten(1), output.upper.flatten(1)))


def crown(
    graph: Graph, box: Interval, C: Tensor, given: dict[str, Interval] | None = None,
    every_neuron: bool = False, deadline: float | None = None, exact: bool = True,
) -> tuple[Tensor, Tensor, dict[str, Interval]]:  # fmt: skip
    """CROWN bounds on `C . y`: `(lower [B, S], upper [B, S], intervals per node)`
    (`every_neuron`, `deadline`: see `crown_intervals`; past the deadline the neurons left keep
    their IBP intervals, and if it has passed before the output's backward pass, or that pass
    is predicted (as long as the longest intermediate chunk) to end past it, the output's
    interval gives the bounds: a pass through a large network can take seconds). A float32
    network's bounds are computed in float64 and rounded outward (`bounds.rounding`);
    `exact=False`: see `crown_intervals`."""
    if exact and box.lower.dtype != torch.float64:
        return bounds_in_float64(crown, graph, box, C, given, every_neuron, deadline)
    durations: list[float] = []
    intervals = crown_intervals(graph, box, given, deadline, every_neuron, exact, durations)
    result = interval_bound(C, intervals[graph.output.name])
    # the output's pass, predicted to take as long as the longest intermediate chunk
    if not passed(deadline) and not predicted_past(deadline, durations):
        A = output_functional(graph, C)
        lines = default_lines(graph, intervals)
        tracked = intervals if exact else None
        result = torch.maximum(
            result, backward_bound(graph, graph.output.name, A, box, lines, tracked)
        )
    lower, upper = split_output(result)
    return lower, upper, intervals
