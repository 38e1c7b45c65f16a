"""Checks every relaxation must pass (`relaxations.base.Relaxation`), on dense samples of
random and degenerate boxes, in float64. A relaxation's test file calls `check_all(relaxation,
boxes)` (or the single checks) with boxes suited to its domain (`random_boxes`, plus its own
degenerate cases), and adds whatever is specific to it."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

import verify
from bounds.graph.graph import Graph, Node
from bounds.ops import ActivationOp, LinearOp
from relaxations.base import Relaxation, polygon_vertices
from tests.soundness import assert_contains, box_samples

D = torch.float64
TOL = 1e-9


def random_boxes(
    n: int = 300, seed: int = 0, scale: float = 3.0, special: tuple[tuple[float, float], ...] = ()
) -> tuple[Tensor, Tensor]:
    """`n` random boxes `[lower, upper]` (centres ~ N(0, scale), widths up to 2 scale, some
    tiny), followed by the `special` ones and the degenerate `l = u` of a few of them."""
    gen = torch.Generator().manual_seed(seed)
    lower = torch.randn(n, generator=gen, dtype=D) * scale
    width = torch.rand(n, generator=gen, dtype=D) * 2 * scale
    width[: n // 10] *= 1e-6  # nearly degenerate
    upper = lower + width
    degenerate = lower[n // 10 : n // 10 + 5]
    extra_l = torch.tensor([s[0] for s in special], dtype=D)
    extra_u = torch.tensor([s[1] for s in special], dtype=D)
    return torch.cat([lower, extra_l, degenerate]), torch.cat([upper, extra_u, degenerate])


def grid(lower: Tensor, upper: Tensor, k: int = 201) -> Tensor:
    """`[k, n]` points spanning each box, ends included."""
    t = torch.linspace(0, 1, k, dtype=D).unsqueeze(1)
    return (lower + t * (upper - lower)).clamp(lower, upper)


def _slack(value: Tensor) -> Tensor:
    return TOL * (1 + value.abs())


def random_params(relaxation: Relaxation, lower: Tensor, upper: Tensor, seed: int) -> Tensor:
    """Parameters around the default, projected (plus unprojected noise: `linear_bounds` must
    project them itself)."""
    gen = torch.Generator().manual_seed(seed)
    default = relaxation.default_params(lower, upper)
    return default + torch.randn(default.shape, generator=gen, dtype=D) * 2


def check_interval(relaxation: Relaxation, lower: Tensor, upper: Tensor) -> None:
    xh = grid(lower, upper)
    y = relaxation.forward(xh)
    low, up = relaxation.interval(lower, upper)
    assert (y >= low - _slack(y)).all() and (y <= up + _slack(y)).all()


def check_lines(relaxation: Relaxation, lower: Tensor, upper: Tensor, seeds=(0, 1, 2)) -> None:
    """The lines contain the function on the box, for the default and random parameters."""
    xh = grid(lower, upper)
    y = relaxation.forward(xh)
    params = [None] + [random_params(relaxation, lower, upper, s) for s in seeds]
    for p in params:
        lines = relaxation.linear_bounds(lower, upper, p)
        low = lines.lower_slope * xh + lines.lower_intercept
        up = lines.upper_slope * xh + lines.upper_intercept
        bad = ((low > y + _slack(y)) | (up < y - _slack(y))).any(0)
        assert not bad.any(), f"invalid lines at boxes {bad.nonzero().flatten()[:5].tolist()}"


def check_params(relaxation: Relaxation, lower: Tensor, upper: Tensor) -> None:
    """The default is feasible, `project` is idempotent, shapes follow `param_shape`, and
    parameters with an extra leading dimension broadcast."""
    default = relaxation.default_params(lower, upper)
    assert tuple(default.shape) == (*lower.shape, *relaxation.param_shape)
    torch.testing.assert_close(relaxation.project(default), default)
    noisy = random_params(relaxation, lower, upper, 7)
    once = relaxation.project(noisy)
    torch.testing.assert_close(relaxation.project(once), once)
    stacked = torch.stack([default, once])
    lines = relaxation.linear_bounds(lower.unsqueeze(0), upper.unsqueeze(0), stacked)
    assert lines.lower_slope.shape[0] == 2


def check_exact_where_not_refined(relaxation: Relaxation, lower: Tensor, upper: Tensor) -> None:
    """Where `needs_refinement` is False, the default lines are exact on the box."""
    keep = ~relaxation.needs_refinement(lower, upper)
    if not keep.any():
        return
    lower, upper = lower[keep], upper[keep]
    xh = grid(lower, upper)
    y = relaxation.forward(xh)
    lines = relaxation.linear_bounds(lower, upper)
    for slope, icpt in ((lines.lower_slope, lines.lower_intercept),
                        (lines.upper_slope, lines.upper_intercept)):  # fmt: skip
        assert ((slope * xh + icpt - y).abs() <= 1e-7 * (1 + y.abs())).all()


def check_constraints(relaxation: Relaxation, lower: Tensor, upper: Tensor) -> None:
    """The explicit set contains the function's graph on the box (validity, the theorem; how
    tight it is, is the relaxation's own test's business)."""
    xh = grid(lower, upper)
    y = relaxation.forward(xh)
    cons = relaxation.constraints(lower, upper)
    assert (cons.lower_envelope(xh) <= y + _slack(y)).all()
    assert (cons.upper_envelope(xh) >= y - _slack(y)).all()


def _feasible_points(relaxation: Relaxation, lower: Tensor, upper: Tensor, k: int = 41):
    """Points `(xh, x)` of the relaxed set: on a grid of `xh`, `x` between the envelopes."""
    cons = relaxation.constraints(lower, upper)
    xh = grid(lower, upper, k)
    low, up = cons.lower_envelope(xh), cons.upper_envelope(xh)
    t = torch.linspace(0, 1, 11, dtype=D).reshape(-1, 1, 1)
    x = torch.lerp(low, torch.maximum(low, up), t)  # lerp: t = 1 lands on `up` exactly
    return xh.expand_as(x), x, (low <= up + _slack(up)).expand_as(x)


def _line_error(slopes: Tensor, intercepts: Tensor, xh: Tensor) -> Tensor:
    """`4 eps max_k (|a_k xh| + |b_k|)`: how far rounding moves any of these lines at `xh`."""
    return 4 * torch.finfo(D).eps * (slopes * xh).abs().add(intercepts.abs()).amax(0)


def check_argmin(relaxation: Relaxation, lower: Tensor, upper: Tensor, seed: int = 5) -> None:
    """`argmin` is feasible and no sampled point of the set (nor any polygon vertex) has a lower
    objective."""
    gen = torch.Generator().manual_seed(seed)
    for scale in (1.0, 1e-3):
        cp, cq = torch.randn(2, lower.numel(), generator=gen, dtype=D) * scale
        cp[:3], cq[:3] = 0.0, 1.0  # pure x objectives
        xh_star, x_star = relaxation.argmin(cp, cq, lower, upper)
        best = cp * xh_star + cq * x_star
        cons = relaxation.constraints(lower, upper)
        assert ((xh_star >= lower - _slack(lower)) & (xh_star <= upper + _slack(upper))).all()
        env_l = cons.lower_envelope(xh_star.unsqueeze(0))[0]
        env_u = cons.upper_envelope(xh_star.unsqueeze(0))[0]
        # Each envelope is as exact as its lines' evaluation: a steep line (exp's tangent at
        # 40, slope 2e17) is off by ~1e3 near its root, more than the vertex's own size.
        err_l = _line_error(cons.lower_slopes, cons.lower_intercepts, xh_star)
        err_u = _line_error(cons.upper_slopes, cons.upper_intercepts, xh_star)
        assert (x_star >= env_l - 1e-7 * (1 + env_l.abs()) - err_l).all()
        assert (x_star <= env_u + 1e-7 * (1 + env_u.abs()) + err_u).all()
        xh, x, ok = _feasible_points(relaxation, lower, upper)
        values = torch.where(ok, cp * xh + cq * x, torch.inf).flatten(0, 1).min(0).values
        assert (best <= values + 1e-9 * (1 + values.abs())).all()
        vx, vy, feasible = polygon_vertices(cons, lower, upper)
        vertex = torch.where(feasible, cp * vx + cq * vy, torch.inf).min(0).values
        assert (best <= vertex + 1e-9 * (1 + vertex.abs())).all()


def check_pieces(relaxation: Relaxation, lower: Tensor, upper: Tensor) -> None:
    """`pieces` (when given) cover the line and agree with `forward`."""
    if relaxation.pieces is None:
        return
    xh = grid(lower, upper).flatten()
    y = relaxation.forward(xh)
    covered = torch.zeros_like(xh, dtype=torch.bool)
    for piece in relaxation.pieces:
        inside = (xh >= piece.start) & (xh <= piece.end)
        covered |= inside
        value = piece.slope * xh + piece.intercept
        ok = (value - y).abs() <= 1e-9 * (1 + y.abs())
        # At a jump, the closed pieces meet the function's value on one side only.
        strict = (xh > piece.start) & (xh < piece.end)
        assert ok[strict].all()
    assert covered.all()


def check_all(relaxation: Relaxation, lower: Tensor, upper: Tensor) -> None:
    check_interval(relaxation, lower, upper)
    check_lines(relaxation, lower, upper)
    check_params(relaxation, lower, upper)
    check_exact_where_not_refined(relaxation, lower, upper)
    check_constraints(relaxation, lower, upper)
    check_argmin(relaxation, lower, upper)
    check_pieces(relaxation, lower, upper)


def activation_graph(
    relaxation: Relaxation, sizes: tuple[int, ...] = (3, 8, 8, 2), seed: int = 0, scale: float = 1.0
):
    """A `Graph` `Linear -> act -> Linear -> act -> ... -> Linear` (float64, seeded) with the
    given layer sizes and `relaxation` after every hidden layer; `scale` multiplies the weights
    (to push pre-activations across a function's kinks)."""
    gen = torch.Generator().manual_seed(seed)
    nodes, last = [Node("input", None, (), (sizes[0],))], "input"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        weight = torch.randn(n_out, n_in, generator=gen, dtype=D) * scale / n_in**0.5
        bias = torch.randn(n_out, generator=gen, dtype=D) * 0.5
        nodes.append(Node(f"linear{i}", LinearOp(weight, bias), (last,), (n_out,)))
        last = f"linear{i}"
        if i < len(sizes) - 2:
            nodes.append(Node(f"act{i}", ActivationOp(relaxation, (n_out,)), (last,), (n_out,)))
            last = f"act{i}"
    return Graph(tuple(nodes))


METHODS = ("ibp", "crown", "alpha-crown")


def check_methods_sound(
    relaxation: Relaxation, methods: tuple[str, ...] = METHODS, seeds=(0, 1), scale: float = 2.0,
    center: float = 0.0, radius: float = 1.0, samples: int = 4000,
) -> None:  # fmt: skip
    """Every method's bounds contain the outputs of sampled inputs (corners included) on
    `activation_graph` nets, over the box `center +- radius`."""
    for seed in seeds:
        graph = activation_graph(relaxation, seed=seed, scale=scale)
        n = graph.input.shape[0]
        lower = torch.full((1, n), center - radius, dtype=D)
        upper = torch.full((1, n), center + radius, dtype=D)
        points = box_samples(lower, upper, samples, seed=seed)
        values = graph.forward(points[0]).unsqueeze(0)
        for method in methods:
            found = verify.bounds(graph, lower=lower, upper=upper, method=method)
            assert_contains(found.lower, found.upper, values)
