"""Patches mode's walk (`bounds.methods.patches` holds the windows' arithmetic): the nodes
that the windows of a convolution's or a residual sum's neurons pass on the way to the input,
each with the union of the windows its consumers give it (`window_walk`), and the bounds of
those neurons computed along it (`patch_bound`), dense from the walk's cut."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from bounds.graph.graph import Graph, Node
from bounds.methods.backward import (
    LinesFn,
    add_rounding,
    backward_bound,
    lower_over,
    output_interval,
    pairing,
    relax_backward,
    relax_rounding,
)
from bounds.methods.patches import (
    UNIT,
    Placement,
    Windows,
    masked,
    place,
    read_windows,
    to_dense,
    union,
    unit_values,
    unit_windows,
)
from bounds.ops import ActivationOp, BoundOp, ConvOp, MultiActivationOp, SumOp
from bounds.rounding import error_bound, lower_minus, magnitude
from bounds.types import Interval
from relaxations import LinearBounds

WINDOW_SHARE = 0.25
"""Windows go on through a node while their area is at most this share of the node's; past
it, reading and scattering windows costs about what a dense functional does. TinyYOLO's root
intervals on the cone, `python -m benchmarks.yolo_crown --sample 256 --configs dag+cone
--window-share S` (one core, estimated from 256 neurons per layer): 116.0 s at 0.1, 71.7 s at
0.25, 73.6 s at 0.5, 76.6 s at 1 (`yolo_crown_dag_cone_share*.md`); 0.25 to 1 are within
this machine's run-to-run noise (59.2 s at 0.25 in another run), 0.1 goes dense too early."""


def _small(node: Node, w: Windows | Placement) -> bool:
    """Whether `node` is `[C, H, W]` and windows of `w.size` cover at most `WINDOW_SHARE` of it."""
    if len(node.shape) != 3:
        return False
    return w.size[0] * w.size[1] <= WINDOW_SHARE * node.shape[1] * node.shape[2]


def _window_step(node: Node, w: Windows | Placement) -> bool:
    """Whether windows `w` on `node` go on through it: a convolution or an elementwise
    activation of one input on a `[C, H, W]` node, the windows `_small` on it."""
    op = node.op
    if not isinstance(op, ConvOp | ActivationOp) or isinstance(op, MultiActivationOp):
        return False
    return _small(node, w)


def _sum_step(node: Node, w: Windows | Placement) -> bool:
    """Whether windows `w` go on through a sum of same-shaped `[C, H, W]` nodes (a residual
    connection's `add`), `_small` on it: the same windows on every input."""
    return isinstance(node.op, SumOp) and _small(node, w)


def patches_start(node: Node) -> bool:
    """Whether a node's neurons are bounded in patches mode (`patch_bound`): a convolution, or
    a sum of `[C, H, W]` nodes (each neuron's functional starts on a `1 x 1` window)."""
    return isinstance(node.op, ConvOp) or (isinstance(node.op, SumOp) and len(node.shape) == 3)


class WindowWalk(NamedTuple):
    """The nodes the windows of a start's neurons pass, in reverse topological order, each once
    with its windows (the union of the windows its consumers give it), the input last if they
    reach it; and the `cut`: the nodes (with their windows) where they stop, each functional
    made dense (`to_dense`) there and `backward_bound` going on from all of them at once."""

    steps: tuple[tuple[Node, Placement], ...]
    cut: tuple[tuple[Node, Placement], ...]


def window_walk(graph: Graph, start: str) -> WindowWalk:
    """The walk of `start`'s windows: node by node in reverse topological order (so each node's
    functional is complete, every consumer on the way visited, when the windows pass it),
    through convolutions, one-input activations and sums (residual connections) while the
    windows are `_small`; at the first node that cannot take them, that node and every one
    left to visit are the cut. Where two paths meet with different strides (their windows not
    translates of each other), the single path of convolutions and activations from `start`,
    cut at its first other node."""
    walk = _walk(graph, start, through_sums=True)
    return walk if walk is not None else _walk(graph, start, through_sums=False)


def _walk(graph: Graph, start: str, through_sums: bool) -> WindowWalk | None:
    """`window_walk`'s steps (None where two paths' windows on a node have different scales).
    `through_sums=False`: a single path, never None."""
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    pending, steps = {start: UNIT}, []
    while pending:
        name = max(pending, key=position.__getitem__)
        p, node = pending[name], graph[name]
        if node.op is None:
            steps.append((node, pending.pop(name)))
            continue
        if through_sums and _sum_step(node, p):
            below = [(i, p) for i in node.inputs]
        elif _window_step(node, p):
            below = [(node.inputs[0], _placement_below(node.op, p))]
        else:
            cut = sorted(pending.items(), key=lambda item: -position[item[0]])
            return WindowWalk(tuple(steps), tuple((graph[n], q) for n, q in cut))
        steps.append((node, pending.pop(name)))
        for i, q in below:
            merged = q if i not in pending else union(pending[i], q)
            if merged is None:
                return None
            pending[i] = merged
    return WindowWalk(tuple(steps), ())


def _placement_below(op: BoundOp, p: Placement) -> Placement:
    """The windows on an op's input that its output's windows `p` read: a convolution's
    (`ConvOp.window_below`, the scale times its stride), an elementwise op's the same."""
    if not isinstance(op, ConvOp):
        return p
    shift_r, shift_c, size = op.window_below(p.shift[0], p.shift[1], p.size)
    return Placement(
        (p.scale[0] * op.stride[0], p.scale[1] * op.stride[1]), (shift_r, shift_c), size
    )


def _unit_origins(index: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """The rows and columns `[2k]` of `+e_j` then `-e_j` (`unit_windows`)."""
    w = unit_windows(index, shape)
    return w.rows, w.cols


def windowed_activations(graph: Graph, start: str, index: Tensor) -> dict[str, Windows]:
    """The activations whose lines `patch_bound` from the neurons `index` of `start` takes at
    windows, with the windows (none when `start` does not take patches: `patches_start`)."""
    if not patches_start(graph[start]):
        return {}
    rows, cols = _unit_origins(index, graph[start].shape)
    return {
        node.name: p.windows(rows, cols)
        for node, p in window_walk(graph, start).steps
        if isinstance(node.op, ActivationOp)
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
    convolution or sum `start` (`patches_start`): `backward_bound` on `unit_functionals` (the
    same sums, in another order), with the functionals kept on windows
    (`bounds.methods.patches`) along `window_walk`, each activation's lines taken at the
    windows (`lines(act, windows)`), two paths' functionals on one node added on the union of
    their windows, and concretised at the input box read at the windows; where the walk ends
    before the input, the functionals on its cut become dense and `backward_bound` goes on
    from all of them. With `intervals`, sound in floating point as `backward_pass` is (each window
    step's rounding, and each merge's, bounded against the magnitudes read at the windows)."""
    batch = box.lower.shape[0]
    walk = window_walk(graph, start)
    placements = {node.name: p for node, p in walk.steps + walk.cut}
    rows, cols = _unit_origins(index, graph[start].shape)
    pending = {start: unit_values(index, graph[start].shape, batch, box.lower)}
    total = box.lower.new_zeros(batch, 2 * index.numel())
    err = None if intervals is None else torch.zeros_like(total)

    def at(t: Tensor, w: Windows, shape) -> Tensor:
        return read_windows(t.unsqueeze(1), w, shape)

    def finish(value: Tensor) -> Tensor:
        result, added = add_rounding(total, value)
        return result if err is None else lower_minus(result, err + added)

    def push(name: str, values: Tensor, p: Placement) -> None:
        nonlocal err
        values = place(values, p, placements[name])
        if name not in pending:
            pending[name] = values
            return
        pending[name] = pending[name] + values
        if err is not None:
            with torch.no_grad():
                w, shape = placements[name].windows(rows, cols), graph[name].shape
                size = at(magnitude(intervals[name]), w, shape)
                err = err + error_bound(pairing(pending[name].detach().abs(), size), 1, 1)

    for node, p in walk.steps:
        values, w = pending.pop(node.name), p.windows(rows, cols)
        if node.op is None:
            low, high = at(box.lower, w, node.shape), at(box.upper, w, node.shape)
            return finish(lower_over(values, low, high))
        if isinstance(node.op, SumOp):  # the same windows on every input; negations exact
            for name, sign in zip(node.inputs, node.op.signs):
                push(name, values if sign > 0 else -values, p)
            continue
        if isinstance(node.op, ConvOp):
            if err is not None:
                err = err + _window_conv_rounding(node, values, w, intervals)
            bias = node.op.bias_term(values)
            grown = node.op.adjoint_window(values.flatten(0, 1))
            q = _placement_below(node.op, p)
            shaped = grown.reshape(*values.shape[:2], *grown.shape[1:])
            push(node.inputs[0], masked(shaped, q.windows(rows, cols), node.op.in_shape), q)
        else:
            line = lines(node.name, w)
            new, bias = relax_backward(values, line)
            if err is not None:
                size_in = at(magnitude(intervals[node.inputs[0]]), w, node.shape)
                size_out = at(magnitude(output_interval(node, intervals)), w, node.shape)
                ulps = node.op.rounding_ulps()
                err = err + relax_rounding(values, new, line, size_in, size_out, ulps)
            push(node.inputs[0], new, p)
        total, added = add_rounding(total, bias)
        err = None if err is None else err + added
    dense = {node.name: to_dense(pending.pop(node.name), p.windows(rows, cols), node.shape)
             for node, p in walk.cut}  # fmt: skip
    (first, A), *rest = dense.items()
    return finish(backward_bound(graph, first, A, box, lines, intervals, dict(rest)))


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
