"""Lagrangian decomposition on DAGs (residual Add, Split, Slice, Concat with constant blocks, a
pre-activation also used affinely): the decomposition is the Lagrangian (adjoint identity,
weak duality at sampled feasible points), the solvers' bounds contain sampled outputs and lie
below the LP (float64, identical intermediate bounds), which lies below the exact MILP, which
matches a dense brute force on tiny nets; any relaxation of the protocol works (a test-only
LeakyReLU on `polygon_argmin`)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import verify
from bounds.dual import (
    decompose,
    evaluate,
    initial_duals,
    problem_from_intervals,
    proximal,
    supergradient,
)
from bounds.dual.dag import pull_back, push_forward
from bounds.dual.decomposition import oracle, pair_coefficients, solve_block
from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph, Node
from bounds.lp.lp import planet_lp
from bounds.methods.crown import crown, output_functional
from bounds.ops import ActivationOp, BoundOp
from bounds.types import Interval
from relaxations.base import LinearBounds, LinearConstraints, Piece, polygon_argmin
from relaxations.registry import register
from tests.bad_inputs.conftest import raises_where
from tests.model_zoo import make
from tests.relaxation_checks import check_all, random_boxes
from tests.soundness import assert_contains, box_samples
from verify.bab.relu.hard_bounder import prox_split_bounds

D = torch.float64
SLOPE = 0.1


@register("test_leaky")
class LeakyTestRelaxation:
    """`x = max(xh, SLOPE xh)`: chord above, `x >= SLOPE xh` and `x >= xh` below; the oracle
    is the generic `polygon_argmin` (no closed form, no fused kernel)."""

    name = "test_leaky"
    convex = True
    monotone = True
    split_at_zero = True
    fused = None
    param_shape = ()
    pieces = (Piece(-torch.inf, 0.0, SLOPE, 0.0), Piece(0.0, torch.inf, 1.0, 0.0))

    def forward(self, xh):
        return torch.where(xh >= 0, xh, SLOPE * xh)

    def interval(self, lower, upper):
        return self.forward(lower), self.forward(upper)

    def default_params(self, lower, upper):
        return (upper > -lower).to(lower.dtype)

    def project(self, params):
        return params.clamp(0.0, 1.0)

    def needs_refinement(self, lower, upper):
        return (lower < 0) & (upper > 0)

    def _chord(self, lower, upper):
        width = upper - lower
        wide = width > 0
        safe = torch.where(wide, width, torch.ones_like(width))
        f_l, f_u = self.forward(lower), self.forward(upper)
        slope = torch.where(wide, (f_u - f_l) / safe, torch.where(lower >= 0, 1.0, SLOPE))
        return slope, f_l - slope * lower

    def linear_bounds(self, lower, upper, params=None):
        t = self.project(self.default_params(lower, upper) if params is None else params)
        ambiguous = self.needs_refinement(lower, upper)
        stable = torch.where(lower >= 0, 1.0, SLOPE).to(lower.dtype)
        low = torch.where(ambiguous, SLOPE + (1 - SLOPE) * t, stable)
        up, icpt = self._chord(lower, upper)
        return LinearBounds(low, torch.zeros_like(low), up, icpt)

    def constraints(self, lower, upper):
        up, icpt = self._chord(lower, upper)
        zeros = torch.zeros_like(lower)
        return LinearConstraints(
            torch.stack([zeros + SLOPE, zeros + 1.0]), torch.stack([zeros, zeros]),
            up.unsqueeze(0), icpt.unsqueeze(0),
        )  # fmt: skip

    def argmin(self, coeff_pre, coeff_post, lower, upper):
        return polygon_argmin(self.constraints(lower, upper), coeff_pre, coeff_post, lower, upper)


class SplitConcat(nn.Module):
    """Split and slices of an activation, a pre-activation used both by a ReLU and affinely
    (in a concatenation and a skip to the output), a concatenation of activations, the input,
    that pre-activation and a constant block."""

    def __init__(self, n_in: int = 3, hidden: int = 6) -> None:
        super().__init__()
        half = hidden // 2
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(half, 4)
        self.fc3 = nn.Linear(4 + (half - 1) + n_in + 4 + 2 + 1, 5)
        self.fc4 = nn.Linear(5, 2)
        self.fc5 = nn.Linear(4, 2)
        self.half = half
        self.register_buffer("token", torch.tensor([[0.5, -0.25]]))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        a, b = torch.split(h, [self.half, self.half], dim=1)
        p = self.fc2(a)
        g = torch.relu(p)
        u = torch.cat([g, b[:, 1:], x, p, self.token.repeat(x.shape[0], 1), h[:, :1]], dim=1)
        v = torch.relu(self.fc3(u))
        return self.fc4(v) + self.fc5(p)


def _split_concat(seed: int = 0, n_in: int = 3) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(seed)
    net = SplitConcat(n_in).to(D).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, (n_in,)


class Product(nn.Module):
    """A product of two activations (a nonlinear node with two inputs, McCormick) and a skip."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(3, 6), nn.Linear(6, 4), nn.Linear(6, 4)
        self.fc4 = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        a = self.fc2(h)
        return self.fc4(a * self.fc3(h) + a)


def _product(seed: int = 0) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(seed)
    net = Product().to(D).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net, (3,)


NETS = {
    "residual": lambda seed: make("residual", seed=seed),
    "split_concat": _split_concat,
    "product": _product,
}
EPS = {"residual": 0.1, "split_concat": 0.5, "product": 0.5}


def _with_relaxation(graph: Graph, relaxation) -> Graph:
    """`graph` with every activation's relaxation replaced."""
    nodes = tuple(
        Node(n.name, ActivationOp(relaxation, n.shape), n.inputs, n.shape)
        if isinstance(n.op, ActivationOp)
        else n
        for n in graph.nodes
    )
    return Graph(nodes)


def _graph(name: str, seed: int, relaxation: str) -> Graph:
    net, shape = NETS[name](seed)
    graph = verify.network_graph(net, shape)
    if relaxation == "relu":
        return graph
    from relaxations import get_relaxation

    return _with_relaxation(graph, get_relaxation(relaxation))


def _setup(name: str, seed: int = 0, relaxation: str = "relu", specs: int = 2, batch: int = 1):
    graph = _graph(name, seed, relaxation)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, *graph.input.shape, generator=gen, dtype=D)
    box = Interval(x - EPS[name], x + EPS[name])
    C = torch.randn(batch, specs, *graph.output.shape, generator=gen, dtype=D)
    _, _, intervals = crown(graph, box, C)
    problem = problem_from_intervals(decompose(graph), box, intervals, output_functional(graph, C))
    return graph, box, C, intervals, problem


def _forward_with(graph: Graph, x: Tensor, z: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every node's value with the nonlinear nodes' outputs replaced by `z` (flat batch)."""
    values = {graph.input.name: x}
    for node in graph.nodes[1:]:
        if node.name in z:
            values[node.name] = z[node.name]
        else:
            values[node.name] = node.op.forward(*(values[i] for i in node.inputs))
    return values


PIECEWISE = [("residual", "relu"), ("split_concat", "relu"), ("split_concat", "test_leaky")]
CASES = [*PIECEWISE, ("product", "relu")]


def test_the_test_relaxation_is_valid():
    lower, upper = random_boxes(200, special=((-1.0, 0.0), (0.0, 1.0), (0.0, 0.0)))
    check_all(LeakyTestRelaxation(), lower, upper)


@pytest.mark.parametrize("name", ["residual", "split_concat"])
def test_decomposition_structure(name):
    """Every affine node's value is the sum of its sources' shares: the split-concat net has
    targets with several sources and sources with several targets; on the residual net every
    source has one share (the skip connection lies inside a region)."""
    graph, _, _, _, problem = _setup(name)
    net = problem.net
    assert [s.name for s in net.sources] == [graph.input.name] + [a.name for a in net.acts]
    counts = [len(ks) for ks in net.target_pairs]
    if name == "residual":
        assert all(len(s.pairs) == 1 for s in net.sources) and counts == [1] * len(counts)
    else:
        assert max(counts) >= 3 and max(len(s.pairs) for s in net.sources) >= 3
        assert any(step.offset is not None for s in net.sources for step in s.region)


@pytest.mark.parametrize("name, relaxation", CASES)
def test_adjoint_identity_and_shares_sum_to_the_values(name, relaxation):
    """`<pull_back(A), dz> = sum_k <A_k, share_k(z + dz) - share_k(z)>` per source, and the
    shares of every target sum to its value in a plain forward pass with the nonlinear nodes'
    outputs replaced."""
    graph, _, _, _, problem = _setup(name, relaxation=relaxation, specs=3, batch=2)
    net = problem.net
    gen = torch.Generator().manual_seed(1)
    lead = problem.c.shape[:2]
    z = {}
    for s, source in enumerate(net.sources):
        shape = graph[source.name].shape
        z[source.name] = torch.randn(*lead, *shape, generator=gen, dtype=D)
        dz = torch.randn(*lead, *shape, generator=gen, dtype=D)
        coeffs = tuple(
            torch.randn(*lead, *graph[net.pairs[k].node].shape, generator=gen, dtype=D)
            for k in source.pairs
        )
        g = pull_back(net, s, coeffs)
        moved = push_forward(net, s, z[source.name] + dz)
        base = push_forward(net, s, z[source.name])
        lhs = (g * dz).flatten(2).sum(-1)
        rhs = sum((A * (m - b)).flatten(2).sum(-1) for A, m, b in zip(coeffs, moved, base))
        torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-10)
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in z.items()}
    values = _forward_with(graph, flat.pop(graph.input.name), flat)
    shares = [None] * len(net.pairs)
    for s, source in enumerate(net.sources):
        for k, share in zip(source.pairs, push_forward(net, s, z[source.name])):
            shares[k] = share
    for ks in net.target_pairs:
        node = net.pairs[ks[0]].node
        total = sum(shares[k] for k in ks)
        torch.testing.assert_close(total.reshape(-1, *total.shape[2:]), values[node])


@pytest.mark.parametrize("name, relaxation", CASES)
def test_dual_value_is_the_lagrangian_minimum(name, relaxation):
    """For random multipliers, `q(rho)` is the Lagrangian at the oracle's points (recomputed by
    a plain forward pass) and no sampled feasible point has a lower Lagrangian."""
    graph, box, _, _, problem = _setup(name, relaxation=relaxation, specs=2)
    net = problem.net
    gen = torch.Generator().manual_seed(2)
    init = initial_duals(problem)
    rho = tuple(r + torch.randn(r.shape, generator=gen, dtype=D) for r in init.rho)
    value, _ = evaluate(problem, type(init)(rho))

    def lagrangian(z: dict[str, Tensor], xhB: list[Tensor]) -> Tensor:
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in z.items()}
        values = _forward_with(graph, flat.pop(graph.input.name), flat)
        lead = problem.c.shape[:2]
        total = (problem.c * values[graph.output.name].reshape(*lead, -1)).flatten(2).sum(-1)
        for e, edge in enumerate(net.edges):
            a = values[edge.pre].reshape(*lead, *xhB[e].shape[2:])
            total = total + (rho[e] * (xhB[e] - a)).flatten(2).sum(-1)
        return total

    z, xhB = {}, [None] * net.n_edges
    for s, source in enumerate(net.sources):
        g = pull_back(net, s, pair_coefficients(problem, rho, s))
        b, z[source.name] = oracle(problem, rho, s, g)
        for e, t in zip(net.act_edges[s - 1] if s else (), b):
            xhB[e] = t
    torch.testing.assert_close(lagrangian(z, xhB), value, rtol=1e-10, atol=1e-10)
    for trial in range(20):  # random feasible points: inputs in the box, (xhB, z) in the sets
        u = torch.rand(problem.c.shape[:2] + box.lower.shape[1:], generator=gen, dtype=D)
        z = {graph.input.name: box.lower.unsqueeze(1) + u * (box.upper - box.lower).unsqueeze(1)}
        for j, act in enumerate(net.acts):
            edges = net.act_edges[j]
            if len(edges) > 1:  # the function's graph lies in the relaxed set
                for e in edges:
                    lower, upper = problem.lower[e].unsqueeze(1), problem.upper[e].unsqueeze(1)
                    t = torch.rand(rho[e].shape, generator=gen, dtype=D)
                    xhB[e] = lower + t * (upper - lower)
                z[act.name] = act.op.relaxation.forward(*(xhB[e] for e in edges))
                continue
            (e,) = edges
            lower, upper = problem.lower[e].unsqueeze(1), problem.upper[e].unsqueeze(1)
            xh = lower + torch.rand(rho[e].shape, generator=gen, dtype=D) * (upper - lower)
            cons = act.op.relaxation.constraints(lower, upper)
            low, up = cons.lower_envelope(xh[None])[0], cons.upper_envelope(xh[None])[0]
            t = torch.rand(xh.shape, generator=gen, dtype=D)
            xhB[e], z[act.name] = xh, low + t * (up - low).clamp(min=0)
        assert (lagrangian(z, xhB) >= value - 1e-9 * (1 + value.abs())).all(), trial


def _prox_objective(problem, xhB, xhA, anchor, eta) -> Tensor:
    """The proximal QP's objective `[B, S]`: `c . y + sum_e anchor_e . (xhB_e - xhA_e) +
    ||xhB_e - xhA_e||^2 / (2 eta_e)`, with `xhA_e` and `y` the sums of their shares."""
    net = problem.net

    def total(t: int) -> Tensor:
        return sum(xhA[k] for k in net.target_pairs[t])

    value = (problem.c * total(net.n_edges)).flatten(2).sum(-1)
    for e in range(net.n_edges):
        gap = xhB[e] - total(e)
        value = value + (anchor[e] * gap).flatten(2).sum(-1)
        value = value + (gap * gap).flatten(2).sum(-1) / (2 * eta[e])
    return value


def _moved(state, edges, pairs, cg, gamma: float):
    """`(xhB, xhA)` of `state` moved by `gamma` towards the conditional gradient `cg`."""
    xhB, xhA = list(state.xhB), list(state.xhA)
    for e, b in zip(edges, cg.xhB):
        xhB[e] = state.xhB[e] + gamma * (b - state.xhB[e])
    for k, a in zip(pairs, cg.xhA):
        xhA[k] = state.xhA[k] + gamma * (a - state.xhA[k])
    return xhB, xhA


@pytest.mark.parametrize("name, relaxation", CASES)
def test_block_steps_are_exact_line_searches(name, relaxation):
    """Each Frank-Wolfe block step (blocks with several shares included) minimises the proximal
    objective along its direction: no step on a fine grid of [0, 1] does better."""
    _, _, _, _, problem = _setup(name, relaxation=relaxation, specs=2, batch=2)
    gen = torch.Generator().manual_seed(3)
    init = initial_duals(problem)
    noisy = type(init)(tuple(r + torch.randn(r.shape, generator=gen, dtype=D) for r in init.rho))
    state, scale = proximal.initial_state(problem, noisy)
    eta = tuple(0.5 * sc for sc in scale)
    net = problem.net
    for sweep in range(2):
        for s in range(problem.n_blocks):
            rho = proximal._block_rho(problem, state, eta, s)
            cg = solve_block(problem, rho, s)
            edges, pairs = net.act_edges[s - 1] if s else (), net.sources[s].pairs
            new_b, new_a = proximal._generic_block_step(problem, state, eta, s)

            grid = torch.stack([
                _prox_objective(problem, *_moved(state, edges, pairs, cg, g), state.anchor, eta)
                for g in torch.linspace(0, 1, 201, dtype=D).tolist()
            ]).min(0).values  # fmt: skip
            xhB, xhA = list(state.xhB), list(state.xhA)
            for e, b in zip(edges, new_b):
                xhB[e] = b
            for k, a in zip(pairs, new_a):
                xhA[k] = a
            got = _prox_objective(problem, xhB, xhA, state.anchor, eta)
            assert (got <= grid + 1e-9 * (1 + grid.abs())).all(), (sweep, s, got, grid)
            state = state._replace(xhB=tuple(xhB), xhA=tuple(xhA))


@pytest.mark.parametrize("name, relaxation", CASES)
def test_initial_duals_are_at_least_crown(name, relaxation):
    """`q` at the duals read off CROWN's backward pass is >= CROWN's bound (same intervals)."""
    graph, box, C, _, problem = _setup(name, relaxation=relaxation)
    low, up, _ = crown(graph, box, C)
    value, _ = evaluate(problem, initial_duals(problem))
    assert (value >= torch.cat([low, -up], 1) - 1e-9).all()


@pytest.fixture(scope="module")
def lp_cache():
    return {}


def _lp(lp_cache, name, relaxation):
    if (name, relaxation) not in lp_cache:
        graph, box, C, intervals, _ = _setup(name, relaxation=relaxation)
        lp_cache[name, relaxation] = planet_lp(graph, box, C, intervals)[2]["raw"]
    return lp_cache[name, relaxation]


SOLVERS = {
    "supergradient": (supergradient.solve, supergradient.SupergradientConfig),
    "prox": (proximal.solve, proximal.ProximalConfig),
}


@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("name, relaxation", CASES)
def test_between_crown_start_and_lp(lp_cache, name, relaxation, solver):
    """Never below the start, never above the LP with the same intermediate bounds, and it
    moves."""
    _, _, _, _, problem = _setup(name, relaxation=relaxation)
    solve, config = SOLVERS[solver]
    init = initial_duals(problem)
    start, _ = evaluate(problem, init)
    result = solve(problem, config(iterations=200), init)
    lp = _lp(lp_cache, name, relaxation)
    assert (result.lower >= start - 1e-10).all()
    assert (result.lower <= lp + 1e-7 * (1 + lp.abs())).all()
    assert (result.lower > start + 1e-6).any()


@pytest.mark.parametrize("name, relaxation", CASES)
def test_prox_converges_to_the_lp(lp_cache, name, relaxation):
    _, _, _, _, problem = _setup(name, relaxation=relaxation)
    result = proximal.solve(
        problem, proximal.ProximalConfig(iterations=1500), initial_duals(problem)
    )
    lp = _lp(lp_cache, name, relaxation)
    gap = (lp - result.lower) / (1 + lp.abs())
    assert (gap >= -1e-7).all() and (gap <= 2e-3).all(), gap


@pytest.mark.parametrize("method", ["prox", "supergradient", "lp"])
@pytest.mark.parametrize("intermediate", ["crown", "prox"])
@pytest.mark.parametrize("name, relaxation", CASES)
def test_public_methods_contain_samples(name, relaxation, method, intermediate):
    """Bounds and intermediate bounds contain sampled values; LD intermediate bounds are no
    looser than CROWN's."""
    graph = _graph(name, 1, relaxation)
    x = torch.rand(2, *graph.input.shape, generator=torch.Generator().manual_seed(4), dtype=D)
    eps = EPS[name]
    kwargs = {"intermediate": intermediate, "intermediate_iterations": 20}
    if method != "lp":
        kwargs["iterations"] = 30
    result = verify.bounds(graph, eps, x=x, method=method, **kwargs)
    base = verify.bounds(graph, eps, x=x, method="crown")
    points = box_samples(x - eps, x + eps, 500)
    values = graph.forward(points.flatten(0, 1), all_values=True)
    y = values[graph.output.name].reshape(2, -1, *graph.output.shape)
    assert_contains(result.lower, result.upper, y)
    for node, iv in result.intermediate.items():
        v = values[node].reshape(2, -1, *iv.lower.shape[1:])
        assert (v >= iv.lower.unsqueeze(1) - 1e-9).all() and (
            v <= iv.upper.unsqueeze(1) + 1e-9
        ).all()
        assert (iv.lower >= base.intermediate[node].lower - 1e-9).all(), node
        assert (iv.upper <= base.intermediate[node].upper + 1e-9).all(), node
    if intermediate == "prox":
        tighter = [
            (iv.upper - iv.lower).sum()
            < (base.intermediate[n].upper - base.intermediate[n].lower).sum() - 1e-6
            for n, iv in result.intermediate.items()
        ]
        assert any(tighter)


def test_split_domain_bounds_on_a_residual_net():
    """The branch-and-bound prox stage on a DAG: each domain's bound (intervals clamped by its
    splits) is below the LP of the same intervals and not below its start."""
    graph, box, C, intervals, problem = _setup("residual")
    act = problem.net.acts[1]
    pre = act.inputs[0]
    flat = intervals[pre].lower.flatten(1)
    j = int(((intervals[pre].lower < 0) & (intervals[pre].upper > 0)).flatten(1)[0].nonzero()[0])
    lows, ups = [], []
    for side in (1, -1):  # active child, inactive child
        lower, upper = (
            intervals[pre].lower.flatten(1).clone(),
            intervals[pre].upper.flatten(1).clone(),
        )
        if side > 0:
            lower[0, j] = 0.0
        else:
            upper[0, j] = 0.0
        lows.append(lower.reshape(intervals[pre].lower.shape))
        ups.append(upper.reshape(intervals[pre].upper.shape))
    assert flat.shape[0] == 1
    domain = {
        k: Interval(v.lower.expand(2, *v.lower.shape[1:]), v.upper.expand(2, *v.upper.shape[1:]))
        for k, v in intervals.items()
    }
    domain[pre] = Interval(torch.cat(lows), torch.cat(ups))
    box2 = Interval(
        box.lower.expand(2, *box.lower.shape[1:]), box.upper.expand(2, *box.upper.shape[1:])
    )
    c = output_functional(graph, C).expand(2, -1, *graph.output.shape)
    slopes = tuple(
        a.op.relaxation.default_params(domain[a.inputs[0]].lower, domain[a.inputs[0]].upper)
        .unsqueeze(1)
        .expand(2, c.shape[1], *a.shape)
        for a in problem.net.acts
    )
    lower, lower64, *_ = prox_split_bounds(problem.net, box2, domain, c, slopes, 60)
    assert lower64 is None
    start, _ = evaluate(
        problem_from_intervals(problem.net, box2, domain, c),
        initial_duals(problem_from_intervals(problem.net, box2, domain, c), slopes),
    )
    assert (lower >= start - 1e-10).all()
    lp = planet_lp(graph, box2, C.expand(2, -1, -1), domain)[2]["raw"]
    assert (lower <= lp + 1e-7 * (1 + lp.abs())).all()


class _Opaque(BoundOp):
    """A nonlinear op that is not a relaxed activation (e.g. a future several-input op)."""

    is_affine = False

    def forward(self, x):
        return x * x

    def interval(self, x):
        return Interval(torch.zeros_like(x.lower), torch.maximum(x.lower**2, x.upper**2))


def _opaque_graph() -> Graph:
    graph = _graph("split_concat", 0, "relu")
    nodes = list(graph.nodes)
    k = next(i for i, n in enumerate(nodes) if n.name == "fc2")
    nodes.insert(k + 1, Node("square", _Opaque(), ("fc2",), nodes[k].shape))
    nodes = [
        Node(
            n.name,
            n.op,
            tuple("square" if i == "fc2" and n.name != "square" else i for i in n.inputs),
            n.shape,
        )
        for n in nodes
    ]
    return Graph(tuple(nodes))


@pytest.mark.parametrize("method", ["prox", "lp"])
def test_an_unsupported_nonlinear_op_is_named(method):
    graph = _opaque_graph()
    x = torch.zeros(1, *graph.input.shape, dtype=D)
    with raises_where(UnsupportedOperationError, "square", "_Opaque"):
        verify.bounds(graph, 0.1, x=x, method=method, intermediate="ibp")
