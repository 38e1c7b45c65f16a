"""The backward pass of linear bound propagation (CROWN, Zhang et al., NeurIPS 2018; Wong and
Kolter, ICML 2018) on a DAG of BoundOps: a functional `A` on a start node pushed to the
input (affine ops by their adjoint, activations by the relaxation's lines chosen by the sign
of the coefficient) and minimised over the box in closed form, every step's rounding bounded
(`bounds.rounding`); and the pieces other backward passes share (`pairing`, `lower_over`,
`relax_backward`, `relax_rounding`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from bounds.graph.graph import Graph, Node
from bounds.ops import ActivationOp
from bounds.rounding import error_bound, lower_minus, magnitude
from bounds.types import Interval
from relaxations import LinearBounds
from relaxations.base import MultiLinearBounds

Lines = LinearBounds | MultiLinearBounds

# activation node (and windows, `patch_bound`) -> its lines for one backward pass: broadcastable
# to `[batch, specs, *shape]`, or with windows `[batch or 1, specs, C, Mh, Mw]` read at them.
LinesFn = Callable[..., Lines]
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


def relax_rounding(
    A: Tensor, new_A: Tensor | tuple[Tensor, ...], lines: Lines,
    size_in: Tensor | tuple[Tensor, ...], size_out: Tensor, ulps: int,
) -> Tensor:  # fmt: skip
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


def relaxation_bounds(
    graph: Graph, act: str, intervals: dict[str, Interval], unsqueeze: bool = False
) -> tuple[Tensor | tuple[Tensor, ...], Tensor | tuple[Tensor, ...]]:
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
    intervals: dict[str, Interval] | None = None, also: dict[str, Tensor] | None = None,
) -> Tensor:  # fmt: skip
    """Lower bound of `A . v_start` over the input box, `[batch, specs]` (plus `also`'s
    functionals on other nodes, `backward_pass`).

    `lines(act)` gives the activation's lines, broadcastable to `[batch, specs, *shape]`.
    With the (sound) `intervals` of every node the pass reaches, the bound holds in floating
    point: every step's rounding is bounded and subtracted (`backward_pass`).
    """
    return backward_linear(graph, start, A, box, lines, intervals, also)[0]


def backward_linear(
    graph: Graph, start: str, A: Tensor, box: Interval, lines: LinesFn,
    intervals: dict[str, Interval] | None = None, also: dict[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """`backward_bound`, and the functional on the input that it minimised over the box
    (`[batch, specs, *input_shape]`, None if the pass does not reach the input): with
    `intervals`, `A . v_start >= a . x + (bound - min_box a . x)` for every `x` in the box, in
    exact arithmetic on the computed `a` (`backward_pass`)."""

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

    return backward_pass(graph, start, A, box, relax, intervals, also)


def backward_pass(
    graph: Graph, start: str, A: Tensor, box: Interval, relax: RelaxFn,
    intervals: dict[str, Interval] | None = None, also: dict[str, Tensor] | None = None,
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
    (`relax` gives None) makes the bound -inf.

    `also`: functionals `[batch, specs, *shape]` on other nodes than `start` (e.g. a cut of
    the graph, `patch_bound`'s); the bound is then of their sum with `A . v_start`."""
    pending: dict[str, Tensor] = {**(also or {}), start: A}
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
