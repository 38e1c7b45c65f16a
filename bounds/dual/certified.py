"""The Lagrangian-decomposition dual's value at given multipliers, as a bound that holds in
floating point (issue 24): an independent re-evaluation, not the solvers' `evaluate`.

At multipliers `rho` the dual value is `q(rho) = sum_s min_s`, subproblem s minimising
`rho_e . xhB_e + g_s . z_s` over its relaxed set (Bunel et al., UAI 2020, Sec. 3;
`bounds.dual.decomposition`). Weak duality in exact arithmetic only: the solvers find each
minimum at a polygon vertex computed in floats, and a vertex a rounding away from the true one
can be far above the minimum when a line is steep (exp's tangent at 40 has slope 2e17).

Here the value is certified instead. For each neuron, any convex combination of the relaxed
set's lower lines `z >= lam (a1 xh + b1) + mu (a2 xh + b2)` (`lam + mu = 1`) gives,
where `g >= 0` (upper lines where `g < 0`; LP duality of the 2-D subproblem: the minimum over
the polygon is attained by such a pair),

    rho xh + g z >= (rho + g a) xh + g b >= min over [l, u] of (rho + g a) xh  +  g b.

That is one step of a backward linear bound (CROWN's, `bounds.methods.backward.backward_pass`)
that passes `-rho` on to the node's input instead of `g a`, and concretises the residual
`rho + g a` over the input's interval. Running the whole pass with these steps gives
`q(rho)` up to the choice of `(pair, lam)` per neuron, which is the best of every pair of the
relaxation's `constraints` at the breakpoints of the concave piecewise-linear value in `lam`
(exact for one-input relaxations). The tracked pass bounds the affine steps' rounding; each
step here adds its own (`_step_error`), so the result holds in floating point.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from bounds.dual.dag import Decomposition
from bounds.graph.graph import Graph, Node
from bounds.methods.backward import (
    backward_pass,
    lower_over,
    output_interval,
    pairing,
    relaxation_bounds,
)
from bounds.rounding import error_bound, intervals_in_float64, magnitude
from bounds.types import Interval, rounded_down

# Roundings in a step's terms beyond its pairing's sum: the line's combination (two products,
# a sum), `g a` and `+ rho`, `g b`, `lam + mu = 1` within a rounding (two), the parts added.
STEP_ROUNDINGS = 10


def _stack(slopes: Tensor | tuple[Tensor, ...]) -> Tensor:
    """Slopes as `[K, n_inputs, *shape]`."""
    if isinstance(slopes, tuple):
        return torch.stack(torch.broadcast_tensors(*slopes), dim=1)
    return slopes.unsqueeze(1)


def best_lines(
    a: Tensor, b: Tensor, r: Tensor, g: Tensor, low: Tensor, up: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The pair of lines `(k1, k2)` and weights `(lam, mu)` maximising
    `sum_i min_{x_i in [low_i, up_i]} (r_i + g a_i) x_i + g b`, `a = lam a1 + mu a2`,
    `b = lam b1 + mu b2`: returns `(lam, mu, a1, a2, b1, b2)` gathered per neuron.

    a: `[K, n, *shape]` slopes, b: `[K, *shape]` intercepts, r: `[n, *shape]` the multipliers on
    the inputs, g: `[*shape]` the coefficient on the output, low/up: `[n, *shape]`. The value is
    concave and piecewise linear in `lam`, with breakpoints where a residual `r_i + g a_i` is 0:
    those and 0, 1 are the candidates. The smaller weight is the one computed (`mu` of 3e-17
    on exp's tangent at 40 matters, `1 - mu` rounds to 1), so `lam + mu = 1` within one
    rounding (`_step_error` counts it). Only the choice is made here; its value is computed,
    with its rounding, by the caller."""
    K = a.shape[0]
    i, j = torch.triu_indices(K, K, device=a.device)
    a1, a2, b1, b2 = a[i], a[j], b[i], b[j]  # [P, n, *shape], [P, *shape]
    s1, s2 = r + g * a1, r + g * a2  # residuals at lam = 1 and lam = 0
    ds = g * (a1 - a2)
    ok = (ds != 0) & torch.isfinite(ds)
    safe = torch.where(ok, ds, torch.ones_like(ds))
    lam_b = torch.where(ok, (-s2 / safe).clamp(0.0, 1.0), torch.zeros_like(ds))
    mu_b = torch.where(ok, (s1 / safe).clamp(0.0, 1.0), torch.ones_like(ds))
    small = lam_b <= 0.5
    lam_b, mu_b = torch.where(small, lam_b, 1 - mu_b), torch.where(small, 1 - lam_b, mu_b)
    zero, one = torch.zeros_like(b1).unsqueeze(1), torch.ones_like(b1).unsqueeze(1)
    lam = torch.nan_to_num(torch.cat([zero, one, lam_b], 1), nan=0.0)  # [P, n + 2, *shape]
    mu = torch.nan_to_num(torch.cat([one, zero, mu_b], 1), nan=1.0)
    slopes = lam.unsqueeze(2) * a1.unsqueeze(1) + mu.unsqueeze(2) * a2.unsqueeze(1)
    s = r + g * slopes  # [P, L, n, *shape]
    icpt = lam * b1.unsqueeze(1) + mu * b2.unsqueeze(1)
    value = torch.minimum(s * low, s * up).sum(2) + g * icpt
    value = torch.nan_to_num(value, nan=-torch.inf).flatten(0, 1)  # [P * L, *shape]
    best, top = torch.zeros_like(value[:1], dtype=torch.long), value[0]
    for k in range(1, value.shape[0]):  # argmax over a short dim 0, without a strided reduction
        better = value[k] > top
        best, top = torch.where(better, k, best), torch.where(better, value[k], top)
    pair = best // lam.shape[1]

    def pick(t: Tensor) -> Tensor:
        index = pair.unsqueeze(1) if t.dim() > b.dim() else pair
        return t.gather(0, index.expand(1, *t.shape[1:]))[0]

    return (lam.flatten(0, 1).gather(0, best)[0], mu.flatten(0, 1).gather(0, best)[0],
            pick(a1), pick(a2), pick(b1), pick(b2))  # fmt: skip


def _step_error(
    g: Tensor, rho: Sequence[Tensor], mag_a: Tensor, mag_b: Tensor, sizes: Sequence[Tensor],
    size_out: Tensor, ulps: int,
) -> Tensor:  # fmt: skip
    """A bound `[batch, specs]` on one step's rounding: the combined lines are within `ulps`
    ulps of valid ones relative to `mag_a |x| + mag_b + |z|` (`mag_a = lam |a1| + mu |a2|`, per
    input), the residual `rho + g a` and the bias `g b` pass through `STEP_ROUNDINGS` roundings
    each (one more for `lam + mu = 1` within a rounding: the combination is `(1 + d)` times a
    valid one, `|d| <= u`), and the pairing is a sum of `n` terms."""
    G = g.abs()
    mag = pairing(G, mag_b + size_out)
    for k, (r, size) in enumerate(zip(rho, sizes)):
        mag = mag + pairing(r.abs() + G * mag_a[k], size)
    n = int(g[0, 0].numel())
    return error_bound(mag, n + STEP_ROUNDINGS + ulps, n)


def certified_value(
    net: Decomposition, box: Interval, intervals: dict[str, Interval], c: Tensor,
    rho: Sequence[Tensor],
) -> Tensor:  # fmt: skip
    """A lower bound `[B, S]` of `min c . y` over the box that holds in floating point: the
    decomposition dual at `rho` (per edge, `[B, S, *shape]`), certified (module docstring).
    `intervals`: sound intervals of every node (as the solvers' problem took them). Computed
    in float64 on `Graph.float64`, rounded down to the box's dtype."""
    dtype = box.lower.dtype
    graph: Graph = net.graph.float64 if dtype != torch.float64 else net.graph
    ivs = intervals_in_float64(intervals)
    box64 = Interval(box.lower.double(), box.upper.double())
    rho64 = [r.double() for r in rho]
    index = {a.name: j for j, a in enumerate(net.acts)}

    def relax(node: Node, g: Tensor):
        edges = net.act_edges[index[node.name]]
        lower, upper = relaxation_bounds(graph, node.name, ivs, unsqueeze=True)
        lowers = lower if isinstance(lower, tuple) else (lower,)
        uppers = upper if isinstance(upper, tuple) else (upper,)
        cons = node.op.relaxation.constraints(lower, upper)
        shape = g.shape
        r = torch.stack([rho64[e].expand(shape) for e in edges])
        low = torch.stack([t.expand(shape) for t in lowers])
        up = torch.stack([t.expand(shape) for t in uppers])
        sides = []
        for slopes, intercepts, sign in (
            (cons.lower_slopes, cons.lower_intercepts, g >= 0),
            (cons.upper_slopes, cons.upper_intercepts, g < 0),
        ):
            a = _stack(slopes).expand(-1, len(edges), *shape)
            b = intercepts.expand(-1, *shape)
            gs = torch.where(sign, g, torch.zeros_like(g))
            sides.append(best_lines(a, b, r, gs, low, up))
        (lam_l, mu_l, a1l, a2l, b1l, b2l), (lam_u, mu_u, a1u, a2u, b1u, b2u) = sides
        pos, neg = g.clamp(min=0), g.clamp(max=0)
        a_l, a_u = lam_l * a1l + mu_l * a2l, lam_u * a1u + mu_u * a2u  # [n, *shape]
        b_l, b_u = lam_l * b1l + mu_l * b2l, lam_u * b1u + mu_u * b2u
        residual = r + pos * a_l + neg * a_u
        bias = pairing(pos, b_l) + pairing(neg, b_u)
        for k in range(len(edges)):
            bias = bias + lower_over(residual[k], low[k], up[k])
        with torch.no_grad():
            use_l = g >= 0
            mag_a = torch.where(use_l, lam_l * a1l.abs() + mu_l * a2l.abs(),
                                lam_u * a1u.abs() + mu_u * a2u.abs())  # fmt: skip
            mag_b = torch.where(use_l, lam_l * b1l.abs() + mu_l * b2l.abs(),
                                lam_u * b1u.abs() + mu_u * b2u.abs())  # fmt: skip
            sizes = [magnitude(ivs[i]).unsqueeze(1) for i in node.inputs]
            size_out = magnitude(output_interval(node, ivs)).unsqueeze(1)
            err = _step_error(g, [r[k] for k in range(len(edges))], mag_a, mag_b, sizes,
                              size_out, node.op.rounding_ulps())  # fmt: skip
        parts = tuple(-r[k] for k in range(len(edges)))
        return (parts if len(parts) > 1 else parts[0]), bias, err

    value, _ = backward_pass(graph, graph.output.name, c.double(), box64, relax, ivs)
    return rounded_down(value, dtype)
