"""Forward linear bounds ("symbolic intervals": Wang et al. 2018, "Formal security analysis of
neural networks using symbolic intervals" (ReluVal) and "Efficient formal safety analysis of
neural networks" (Neurify); the forward mode of Xu et al. 2020, "Automatic perturbation
analysis for scalable certified robustness and beyond", Sec. 3.2), CROWN's intervals on the
unstable neurons of the last layers (`ForwardConfig.refine_layers`), then one CROWN backward
pass from the output.

Every node `v` carries two affine functions of the (flattened) input, `F_low` and `F_up`, and
a slack `e >= 0` with `F_low(x) - e <= v(x) <= F_up(x) + e` for every `x` of the box. An affine
op maps them through its linear part (its matrix's positive part on the lower function and
negative part on the upper one, or in centre-radius form for ops without a cheap sign split);
an activation applies its relaxation's lines (chosen by their slopes' signs) to the
functions. Each node's interval is its functions' minimum and maximum over the box,
intersected with IBP's; the output's bound is CROWN's backward pass over those intervals.

The cost is one propagation of `n_in + 1` coefficient maps per box (a forward pass at batch
`2 (n_in + 1)`), where CROWN's intermediate bounds take one backward pass per unstable neuron:
for few inputs and many neurons (VNN-COMP's 16-input bias-field conv nets) it is the cheaper
bound; it is looser than CROWN's intermediate bounds.

Sound in floating point (`bounds.rounding`): every step's rounding, of the coefficients and of
the relaxations' lines, is bounded against `S`, the magnitude of the input's functions over the
box (`sum_k |F_k| max|x_k| + |F_const| + e`), and added to the slack; a float32 network's bounds
are computed on its float64 copy and rounded outward. Nodes of other kinds than single-input
affine ops, sums and single-input activations keep no functions: the nodes after them take
CROWN's intervals (`crown_intervals`), so the method holds on every network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bounds.errors import at_node
from bounds.graph.graph import Graph, Node, node_interval
from bounds.methods.backward import lower_over
from bounds.methods.crown import crown_intervals, linear_stats, needs_crown, output_bounds
from bounds.methods.pacing import deadline_of, passed
from bounds.ops import ActivationOp
from bounds.ops.add import SumOp
from bounds.ops.base import CONSTANT_ROUNDINGS, UnaryAffineOp
from bounds.registry import MethodResult, register_method
from bounds.rounding import (
    bounds_in_float64,
    error_bound,
    in_float64,
    intervals_in_float64,
    intervals_outward,
    lower_minus,
    magnitude,
    upper_plus,
)
from bounds.types import Interval


class Functions(NamedTuple):
    """`F_low(x) - slack <= v(x) <= F_up(x) + slack` on the box: `low`, `up` `[B, n_in + 1,
    *shape]` (the coefficients of the flattened input, then the constant), `slack [B, *shape]`."""

    low: Tensor
    up: Tensor
    slack: Tensor


def input_functions(box: Interval) -> Functions:
    """The input's functions: `x_k` itself, exactly."""
    batch, shape = box.lower.shape[0], box.lower.shape[1:]
    n = int(torch.Size(shape).numel())
    eye = torch.eye(n, dtype=box.lower.dtype, device=box.lower.device).reshape(n, *shape)
    coeff = torch.cat([eye, eye.new_zeros(1, *shape)]).expand(batch, n + 1, *shape)
    return Functions(coeff, coeff, box.lower.new_zeros(box.lower.shape))


def sizes(f: Functions, box: Interval) -> Tensor:
    """`S = sum_k (|F_low,k| + |F_up,k|) max|x_k| + |F_low,c| + |F_up,c| + slack` `[B, *shape]`:
    at least `|F(x)|` and `|F(x) - F'(x)|` for every x of the box (rounded up: non-negative
    terms, `error_bound`)."""
    m = magnitude(box).flatten(1)  # [B, n]
    n = m.shape[1]
    both = f.low.abs() + f.up.abs()
    value = torch.einsum("bk...,bk->b...", both[:, :n], m) + both[:, n] + f.slack
    return upper_plus(value, error_bound(value, n + 3, n + 2))


def concretize(f: Functions, box: Interval) -> Interval:
    """The functions' minimum and maximum over the box, `[B, *shape]`, rounded outward."""
    batch, shape = f.low.shape[0], f.low.shape[2:]
    n = box.lower[0].numel()

    def low_of(coeff: Tensor) -> Tensor:
        A = coeff[:, :n].flatten(2).transpose(1, 2)  # [B, neurons, n]: neurons as specs
        return lower_over(A, box.lower.flatten(1).unsqueeze(1), box.upper.flatten(1).unsqueeze(1))

    def finish(least: Tensor, const: Tensor, slack: Tensor, sign: float) -> Tensor:
        value = least + sign * const.flatten(1) - slack.flatten(1)
        return lower_minus(value, error_bound(least.abs() + const.abs().flatten(1)
                                              + slack.flatten(1), 2, 3))  # fmt: skip

    lower = finish(low_of(f.low), f.low[:, n], f.slack, 1.0)
    upper = -finish(low_of(-f.up), f.up[:, n], f.slack, -1.0)
    return Interval(lower.reshape(batch, *shape), upper.reshape(batch, *shape))


def affine_functions(op: UnaryAffineOp, f: Functions, size: Tensor | None) -> Functions:
    """`y = L v + b`: `L+ F_low + L- F_up + b` below and `L+ F_up + L- F_low + b` above (the
    centre-radius form `L c -+ |L| r` where the op has no sign split); slack `|L| e` plus the
    rounding, `gamma_(n + 6) (|L| S + |b|)` (`n` = fan-in); `size` None: no rounding tracked
    (slack 0)."""
    batch, k = f.low.shape[:2]
    flat = [t.reshape(batch * k, *op.in_shape) for t in (f.low, f.up)]  # each map a sample
    split = (op.linear(flat[0]), op.linear(flat[1])) if op.nonnegative else op.sign_split(*flat)
    if split is None:
        # v in [c - r - e, c + r + e] with r(x) + e >= 0 on the box, r the function
        # (F_up - F_low) / 2: L v in L c -+ |L| (r + e), its coefficients' signs kept
        centre, radius = (flat[0] + flat[1]) / 2, (flat[1] - flat[0]) / 2
        mid, spread = op.linear(centre), op.abs_linear(radius)
        split = (mid - spread, mid + spread)
    low, up = (t.reshape(batch, k, *op.out_shape) for t in split)
    b = op.bias_vector()
    if b is not None:
        low, up = low.clone(), up.clone()
        low[:, -1] = low[:, -1] + b
        up[:, -1] = up[:, -1] + b
    if size is None:
        return Functions(low, up, f.slack.new_zeros(low.shape[:1] + low.shape[2:]))
    # the centre-radius form also spreads the slack: |L| (r + e) with |r| <= S
    spread_slack = op.abs_linear(f.slack)
    mag = op.abs_linear(size) + (0.0 if b is None else b.abs())
    n = op.fan_in()
    err = error_bound(mag, n + 6 + CONSTANT_ROUNDINGS, n + 1)
    slack = upper_plus(spread_slack, err + error_bound(spread_slack, n + 2, n))
    return Functions(low, up, slack)


def activation_functions(
    graph: Graph, node: Node, f: Functions, size: Tensor | None, intervals: dict[str, Interval]
) -> Functions:
    """`y = sigma(v)` by its relaxation's lines on `v`'s interval: `l F + t` with `F` the
    lower function where the slope `l` is >= 0 and the upper one elsewhere (and the mirror
    above); slack `|l| e` plus the products' and intercepts' rounding and the lines' own
    (`rounding_ulps`, as `bounds.methods.backward.relax_rounding` bounds them); `size` None:
    no rounding tracked (slack 0)."""
    iv = intervals[node.inputs[0]]
    relaxation = node.op.relaxation
    lines = at_node(relaxation.name, node.name, relaxation.linear_bounds, iv.lower, iv.upper)

    def image(slope: Tensor, intercept: Tensor, same: Tensor, other: Tensor) -> Tensor:
        s = slope.unsqueeze(1)
        out = s.clamp(min=0) * same + s.clamp(max=0) * other  # a new tensor
        out[:, -1] = out[:, -1] + intercept
        return out

    low = image(lines.lower_slope, lines.lower_intercept, f.low, f.up)
    up = image(lines.upper_slope, lines.upper_intercept, f.up, f.low)
    if size is None:
        return Functions(low, up, f.slack)
    slope = torch.maximum(lines.lower_slope.abs(), lines.upper_slope.abs())
    intercept = torch.maximum(lines.lower_intercept.abs(), lines.upper_intercept.abs())
    ulps = node.op.rounding_ulps()
    size_out = magnitude(intervals[node.name])
    mag = slope * (size + magnitude(iv)) + 2 * intercept + size_out
    carried = slope * f.slack
    slack = upper_plus(carried, error_bound(mag, 4 + ulps, 2) + error_bound(carried, 1, 1))
    return Functions(low, up, slack)


def sum_functions(op: SumOp, fs: list[Functions], total: Tensor | None) -> Functions:
    """`y = sum_i s_i v_i`: the sums of the functions (a negated input's swapped), slack the
    sum of the slacks plus the additions' rounding against the summed sizes `total`."""
    lows = [f.low if s > 0 else -f.up for s, f in zip(op.signs, fs)]
    ups = [f.up if s > 0 else -f.low for s, f in zip(op.signs, fs)]
    carried = sum(f.slack for f in fs)
    if total is None:
        return Functions(sum(lows), sum(ups), carried)
    slack = upper_plus(carried, error_bound(total, len(fs) + 1, len(fs) + 1))
    return Functions(sum(lows), sum(ups), slack)


def forward_intervals(
    graph: Graph, box: Interval, given: dict[str, Interval] | None = None,
    deadline: float | None = None, exact: bool = True,
) -> dict[str, Interval]:  # fmt: skip
    """Intervals of every node: IBP intersected with the forward functions' range (and the
    `given` intervals). Past `deadline`, or after a node that carries no functions, the nodes
    take CROWN's intervals on the intervals found so far (`crown_intervals`, valid either way).
    A float32 network's are computed in float64 and rounded outward; `exact=False`: in the
    network's dtype, the rounding not accounted for (for searches that recheck)."""
    if exact and box.lower.dtype != torch.float64:
        found = forward_intervals(graph.float64, in_float64(box), intervals_in_float64(given),
                                  deadline, True)  # fmt: skip
        return intervals_outward(found, box.lower.dtype)
    given = dict(given or {})
    intervals: dict[str, Interval] = {graph.input.name: box}
    functions: dict[str, Functions] = {graph.input.name: input_functions(box)}
    last_use = {i: k for k, node in enumerate(graph.nodes) for i in node.inputs}
    for index, node in enumerate(graph.nodes[1:], start=1):
        inputs = [functions.get(i) for i in node.inputs]
        for name in node.inputs:  # no later node needs them: free the memory
            if last_use[name] == index:
                functions.pop(name, None)
        if passed(deadline) or any(f is None for f in inputs):
            known = {**given, **intervals}
            return crown_intervals(graph, box, known, deadline, exact=exact)
        iv = node_interval(node, [intervals[i] for i in node.inputs])
        if node.name in given:
            iv = iv.intersect(given[node.name])
        intervals[node.name] = iv  # an activation's lines need its own interval's magnitude
        found = node_functions(graph, node, inputs, box, intervals, exact)
        if found is not None:
            functions[node.name] = found
            iv = iv.intersect(concretize(found, box))
        intervals[node.name] = iv
    return intervals


def node_functions(
    graph: Graph, node: Node, inputs: list[Functions], box: Interval,
    intervals: dict[str, Interval], exact: bool,
) -> Functions | None:  # fmt: skip
    """The node's functions, or None for an op of another kind; `exact`: with their rounding
    in the slack."""
    op = node.op

    def size(f: Functions) -> Tensor | None:
        return sizes(f, box) if exact else None

    if isinstance(op, UnaryAffineOp):
        return affine_functions(op, inputs[0], size(inputs[0]))
    if isinstance(op, ActivationOp) and len(node.inputs) == 1 and op.n_inputs == 1:
        return activation_functions(graph, node, inputs[0], size(inputs[0]), intervals)
    if isinstance(op, SumOp) and all(f.low.shape == inputs[0].low.shape for f in inputs):
        total = sum(sizes(f, box) for f in inputs) if exact else None
        return sum_functions(op, inputs, total)
    return None


@dataclass(frozen=True)
class ForwardConfig:
    """refine_layers: the last pre-activation layers whose unstable neurons CROWN bounds
    again after the forward pass (its backward passes cost per neuron; the forward functions
    lose most of their tightness in the last layers; 0: the forward pass alone). With 2, on a
    16-input bias-field conv net (VNN-COMP 2022's cifar_biasfield shape), a box's worst bound
    is -5.949 where CROWN's is -5.915, in 0.14 s against 0.50 s
    (`python -m benchmarks.forward_bounds`); the forward pass alone answers 11 of the 16
    bias-field instances where 2 layers answer 14 (`benchmarks/results/input_splitting.md`)."""

    refine_layers: int = 2

    def __post_init__(self) -> None:
        if self.refine_layers < 0:
            raise ValueError(f"refine_layers must be >= 0, got {self.refine_layers}")


def forward_crown(
    graph: Graph, box: Interval, C: Tensor, given: dict[str, Interval] | None = None,
    deadline: float | None = None, exact: bool = True, linear: dict[str, Tensor] | None = None,
    refine_layers: int = ForwardConfig.refine_layers,
) -> tuple[Tensor, Tensor, dict[str, Interval]]:  # fmt: skip
    """Bounds on `C . y` (`[B, S]` each, and the intervals): the forward functions'
    intervals, CROWN on the unstable neurons of the last `refine_layers` pre-activation layers,
    then CROWN's backward pass from the output; `linear`: as `crown`'s."""
    if exact and box.lower.dtype != torch.float64:
        args = (deadline, True, linear, refine_layers)
        return bounds_in_float64(forward_crown, graph, box, C, given, *args)
    intervals = refined(graph, box, forward_intervals(graph, box, given, deadline, exact),
                        deadline, exact, refine_layers)  # fmt: skip
    lower, upper = output_bounds(graph, box, C, intervals, exact, linear, not passed(deadline))
    return lower, upper, intervals


def refined(
    graph: Graph, box: Interval, intervals: dict[str, Interval], deadline: float | None,
    exact: bool, layers: int,
) -> dict[str, Interval]:  # fmt: skip
    """`intervals` with CROWN's on the unstable neurons of the last `layers` pre-activation
    layers (`crown_intervals` with those targets; unchanged once `deadline` has passed)."""
    targets = needs_crown(graph)
    targets = targets[max(0, len(targets) - layers) :]
    if not targets or passed(deadline):
        return intervals
    return crown_intervals(graph, box, intervals, deadline, exact=exact, targets=targets)


def forward_intermediate(
    graph: Graph, box: Interval, C: Tensor, iterations: int = 50,
    given: dict[str, Interval] | None = None, deadline: float | None = None, start=None,
) -> dict[str, Interval]:  # fmt: skip
    """The forward functions' intervals, CROWN's on the last layers (`IntermediateBounds`)."""
    intervals = forward_intervals(graph, box, given, deadline)
    return refined(graph, box, intervals, deadline, True, ForwardConfig.refine_layers)


@register_method(
    "forward", ForwardConfig,
    "forward linear bounds (symbolic intervals), CROWN on the last layers, then a CROWN "
    "backward pass",
    intermediate=forward_intermediate,
)  # fmt: skip
def _forward(graph, box, C, config, budget, given, exact=True) -> MethodResult:
    """stats: "input_functional" and "linear_lower", as CROWN's (`crown`)."""
    linear: dict[str, Tensor] = {}
    deadline = deadline_of(budget)
    found = forward_crown(graph, box, C, given, deadline, exact, linear, config.refine_layers)
    return (*found, linear_stats(linear))
