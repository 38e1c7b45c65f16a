"""The proximal block-step kernels (kernels/prox_relu_block.py): the Triton kernels (interpreter
on CPU) equal the reference, the reference equals `ReluRelaxation.argmin` and the proximal
solver's generic `_generic_block_step`, the step is the exact line search, and the ops run under torch.compile."""

from __future__ import annotations

import pytest
import torch

import verify
from benchmarks import gpu_check_prox
from bounds.dual import Duals, decompose, initial_duals, problem_from_intervals, proximal
from bounds.dual.proximal import (
    ProxState,
    _fusable,
    _generic_block_step,
    _relu_block_step,
    initial_state,
)
from bounds.methods.crown import crown, output_functional
from bounds.types import Interval
from kernels.backend import kernel_backend
from kernels.prox_relu_block import prox_block_update, prox_neg_rho, prox_relu_oracle
from kernels.prox_relu_reference import (
    prox_block_update_reference,
    prox_relu_oracle_reference,
    relu_argmin_reference,
)
from kernels.prox_relu_triton import prox_block_update_triton, prox_relu_oracle_triton
from relaxations.relu import ReluRelaxation
from tests.kernels import cpu_generated, needs_triton
from tests.model_zoo import make

KINDS = ["mixed", "stable", "ambiguous", "degenerate", "ties"]
LAYOUTS = ["batch", "spec1", "full"]


def _tol(dtype: torch.dtype) -> dict:
    return (
        {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    )


@cpu_generated
def _bounds(kind: str, shape: tuple, gen: torch.Generator, dtype) -> tuple[torch.Tensor, ...]:
    """`(lower, upper)` of shape `shape` whose neurons are of the given kind."""
    r = lambda: torch.rand(shape, generator=gen, dtype=dtype)  # noqa: E731
    if kind == "mixed":
        lower = 2 * r() - 1.2
        return lower, lower + 2 * r()
    if kind == "stable":
        passing = r() < 0.5
        lower = torch.where(passing, r(), -1 - r())
        return lower, torch.where(passing, lower + r(), -r())
    if kind == "ambiguous":
        return -r() - 0.01, r() + 0.01
    if kind == "degenerate":  # l = u, at 0 or away from it, and l = 0 < u, l < 0 = u
        point = torch.randint(-1, 2, shape, generator=gen).to(dtype)
        pick = torch.randint(0, 3, shape, generator=gen)
        lower = torch.where(pick == 2, torch.zeros_like(point), point)
        upper = torch.where(pick == 2, point.abs(), point)
        return torch.minimum(lower, upper), torch.maximum(lower, upper)
    lower = torch.randint(-2, 2, shape, generator=gen).to(dtype)  # ties: small integers
    return lower, lower + torch.randint(0, 3, shape, generator=gen).to(dtype)


def _layout(bound: torch.Tensor, layout: str, specs: int) -> torch.Tensor:
    """`[B, *shape]` as given, as `[B, 1, *shape]`, or materialised to `[B, S, *shape]`."""
    if layout == "batch":
        return bound
    spec = bound.unsqueeze(1)
    return spec if layout == "spec1" else spec.expand(-1, specs, *bound.shape[1:]).contiguous()


@cpu_generated
def _oracle_inputs(batch, specs, shape, kind, layout, dtype, seed=0) -> tuple[torch.Tensor, ...]:
    """`(anchor_in, xhB, xhA_in, eta_in, g, lower, upper)`; integer-valued for "ties"."""
    gen = torch.Generator().manual_seed(seed)
    full = (batch, specs, *shape)
    if kind == "ties":
        ints = lambda: torch.randint(-2, 3, full, generator=gen).to(dtype)  # noqa: E731
        tensors = [ints() for _ in range(4)]
        eta = torch.ones(batch, specs, dtype=dtype)
    else:
        tensors = [torch.randn(full, generator=gen, dtype=dtype) for _ in range(4)]
        eta = torch.rand(batch, specs, generator=gen, dtype=dtype) + 0.5
    lower, upper = _bounds(kind, (batch, *shape), gen, dtype)
    anchor, xhB, xhA, g = tensors
    return anchor, xhB, xhA, eta, g, _layout(lower, layout, specs), _layout(upper, layout, specs)


SHAPES = [  # (B, S, layer j-1, layer j)
    (1, 1, (1,), (1,)),
    (2, 3, (37,), (11,)),
    (3, 1, (4, 5, 7), (2, 3, 3)),
    (1, 5, (3, 9, 9), (10,)),
]


@cpu_generated
def _argmin_inputs(kind: str) -> tuple[torch.Tensor, ...]:
    """`(a, g, lower, upper)` of one layer, 3 problems x 4 specs x 50 neurons."""
    gen = torch.Generator().manual_seed(1)
    shape = (3, 4, 50)
    lower, upper = _bounds(kind, (3, 1, 50), gen, torch.float64)
    a, g = (torch.randint(-2, 3, shape, generator=gen).double() for _ in range(2))
    if kind != "ties":
        a, g = (
            torch.randn(shape, generator=gen).double(),
            torch.randn(shape, generator=gen).double(),
        )
    return a, g, lower, upper


@pytest.mark.parametrize("kind", KINDS)
def test_reference_argmin_is_relu_relaxation_argmin(kind):
    a, g, lower, upper = _argmin_inputs(kind)
    expected = ReluRelaxation().argmin(a, g, lower, upper)
    for got, want in zip(relu_argmin_reference(a, g, lower, upper), expected):
        assert torch.equal(got, want)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch, specs, shape_in, shape_out", SHAPES)
def test_oracle_kernel_equals_reference(batch, specs, shape_in, shape_out, dtype):
    for i, (kind, layout) in enumerate(zip(KINDS, LAYOUTS * 2)):
        args = _oracle_inputs(batch, specs, shape_in, kind, layout, dtype, seed=i)
        ref = prox_relu_oracle(*args, use_triton=False)
        got = prox_relu_oracle(*args, use_triton=True)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])  # element by element
        torch.testing.assert_close(got[2:], ref[2:], **_tol(dtype))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch, specs, shape_in, shape_out", SHAPES)
def test_update_kernels_equal_reference(batch, specs, shape_in, shape_out, dtype):
    xhB, xhB_cg = _oracle_inputs(batch, specs, shape_in, "mixed", "batch", dtype, seed=1)[1:3]
    anchor, xhB_out, xhA, eta, xhA_cg = _oracle_inputs(batch, specs, shape_out, "mixed", "batch", dtype, seed=2)[:5]  # fmt: skip
    coeff = prox_neg_rho(anchor, xhB_out, xhA, eta, use_triton=False)
    assert torch.equal(prox_neg_rho(anchor, xhB_out, xhA, eta, use_triton=True), coeff)
    b_side = {"xhB": xhB, "xhB_cg": xhB_cg, "num_b": eta - 1, "den_b": eta}
    for eta_out in (eta, None):  # a middle block, the last block
        want = prox_block_update(coeff, xhA, xhA_cg, eta_out, **b_side, use_triton=False)
        got = prox_block_update(coeff, xhA, xhA_cg, eta_out, **b_side, use_triton=True)
        torch.testing.assert_close(got, want, **_tol(dtype))


@cpu_generated
def _update_inputs(dtype) -> tuple[torch.Tensor, ...]:
    """`(coeff, xhA, xhA_cg, eta)` of a 517-neuron layer, 2 problems x 2 specs."""
    gen = torch.Generator().manual_seed(4)
    coeff, xhA, xhA_cg = (torch.randn(2, 2, 517, generator=gen, dtype=dtype) for _ in range(3))
    return coeff, xhA, xhA_cg, torch.rand(2, 2, generator=gen, dtype=dtype) + 0.5


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_several_chunks_per_problem(dtype):
    """Rows longer than one program's chunk: partial sums, the last chunk partly masked."""
    args = _oracle_inputs(2, 2, (1031,), "mixed", "batch", dtype, seed=3)
    ref = prox_relu_oracle_reference(*args)
    got = prox_relu_oracle_triton(*args, block=128, chunk=256)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    torch.testing.assert_close(got[2:], ref[2:], **_tol(dtype))
    coeff, xhA, xhA_cg, eta = _update_inputs(dtype)
    update_args = (coeff, xhA, xhA_cg, eta, args[1], ref[0], ref[2], ref[3])
    want = prox_block_update_reference(*update_args)
    got = prox_block_update_triton(*update_args, block=128, chunk=256)
    torch.testing.assert_close(got, want, **_tol(dtype))


def _segment_objective(gamma, block, coeff, eta_out, xhB_out, anchor_out, b):
    """Block j's part of the proximal primal QP (proximal.py) at `x + gamma (x_cg - x)`, per
    problem (one neuron dimension): the A side (the objective c, or -anchor and the proximal
    term) plus the B side (anchor and the proximal term of layer j-1)."""
    xhA = block["xhA"] + gamma * (block["xhA_cg"] - block["xhA"])
    if eta_out is None:
        value = (coeff * xhA).sum(-1)
    else:
        value = -(anchor_out * xhA).sum(-1) + ((xhB_out - xhA) ** 2).sum(-1) / (2 * eta_out)
    if b is not None:
        xhB = b["xhB"] + gamma * (b["xhB_cg"] - b["xhB"])
        proximal = ((xhB - b["xhA_in"]) ** 2).sum(-1) / (2 * b["eta_in"])
        value = value + (b["anchor_in"] * xhB).sum(-1) + proximal
    return value


@cpu_generated
def _line_search_inputs(last: bool) -> tuple[torch.Tensor | None, ...]:
    """`(anchor_out, xhB_out, xhA, xhA_cg, eta_out, c)` of 3 problems x 2 specs x 6 neurons:
    `eta_out` None for the last block, `c` (its objective) None for the others."""
    gen = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    anchor_out, xhB_out, xhA, xhA_cg = r(3, 2, 6), r(3, 2, 6), r(3, 2, 6), r(3, 2, 6)
    eta_out = None if last else torch.rand(3, 2, generator=gen).double() + 0.1
    return anchor_out, xhB_out, xhA, xhA_cg, eta_out, r(3, 2, 6) if last else None


@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=needs_triton)])
@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_step_is_the_exact_line_search(position, use_triton):
    """gamma minimises the block's convex quadratic on the segment [x, x_cg] (a theorem)."""
    anchor_out, xhB_out, xhA, xhA_cg, eta_out, c = _line_search_inputs(position == "last")
    coeff = c if eta_out is None else prox_neg_rho(anchor_out, xhB_out, xhA, eta_out)
    kwargs, b = {}, None
    if position != "first":
        oracle_args = _oracle_inputs(3, 2, (15,), "mixed", "batch", torch.float64, seed=6)
        anchor_in, xhB, xhA_in, eta_in = oracle_args[:4]
        xhB_cg, _, num_b, den_b = prox_relu_oracle(*oracle_args, use_triton=use_triton)
        kwargs = {"xhB": xhB, "xhB_cg": xhB_cg, "num_b": num_b, "den_b": den_b}
        b = {"xhB": xhB, "xhB_cg": xhB_cg, "xhA_in": xhA_in, "anchor_in": anchor_in, "eta_in": eta_in}  # fmt: skip
    _, _, gamma = prox_block_update(coeff, xhA, xhA_cg, eta_out, **kwargs, use_triton=use_triton)  # fmt: skip
    assert ((gamma >= 0) & (gamma <= 1)).all()
    block = {"xhA": xhA, "xhA_cg": xhA_cg}
    best = _segment_objective(gamma[..., None], block, coeff, eta_out, xhB_out, anchor_out, b)
    grid = torch.linspace(0, 1, 101, dtype=torch.float64).view(-1, 1, 1, 1)
    values = _segment_objective(grid, block, coeff, eta_out, xhB_out, anchor_out, b)
    assert (best <= values.min(0).values + 1e-10).all()


@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=needs_triton)])
def test_zero_curvature_steps(use_triton):
    """den = 0 (last block without B side): gamma = 1 if the objective descends, else 0;
    a zero direction (den = 0, num = 0) does not move."""
    xhA = torch.tensor([[[1.0, -2.0, 0.5]], [[0.0, 3.0, 1.0]]])
    xhA_cg = xhA + torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]])
    for c, expected in ((-1.0, [1.0, 0.0]), (1.0, [0.0, 0.0])):
        coeff = torch.full_like(xhA, c)
        new, none, gamma = prox_block_update(coeff, xhA, xhA_cg, use_triton=use_triton)
        assert none is None
        assert gamma.flatten().tolist() == expected
        torch.testing.assert_close(new, torch.where(gamma[..., None] > 0, xhA_cg, xhA))


@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=needs_triton)])
def test_step_is_clipped(use_triton):
    """num / den > 1 takes the full step; num < 0 takes none (middle block, B side zero)."""
    xhA = torch.zeros(1, 2, 4)
    xhA_cg = torch.ones(1, 2, 4)
    coeff = torch.tensor([-10.0, 10.0]).view(1, 2, 1).expand(1, 2, 4).contiguous()
    xhB = torch.zeros(1, 2, 3)
    zeros = torch.zeros(1, 2)
    b_side = {"xhB": xhB, "xhB_cg": xhB, "num_b": zeros, "den_b": zeros}
    eta = torch.ones(1, 2)
    _, new_b, gamma = prox_block_update(coeff, xhA, xhA_cg, eta, **b_side, use_triton=use_triton)  # fmt: skip
    assert gamma.tolist() == [[1.0, 0.0]]
    assert torch.equal(new_b, xhB)


def _solver_setup(name: str) -> tuple:
    """A zoo net's problem (B=2, S=3, float64), the solver's start near CROWN's duals, and
    per-problem eta, on the default device; the net, its graph and the random numbers are made
    on the CPU (the same ones on every machine), then moved."""
    device = torch.get_default_device()
    gen = torch.Generator().manual_seed(0)
    with torch.device("cpu"):
        net, shape = make(name, seed=2)
        graph = verify.network_graph(net, shape)
        x = torch.rand(2, *shape, generator=gen, dtype=torch.float64)
        C = torch.randn(2, 3, graph.output.shape[0], generator=gen, dtype=torch.float64)
    graph, x, C = graph.to(torch.float64, device), x.to(device), C.to(device)
    box = Interval(x - 0.3, x + 0.3)
    _, _, intervals = crown(graph, box, C)
    problem = problem_from_intervals(decompose(graph), box, intervals, output_functional(graph, C))
    duals = initial_duals(problem)
    noise = Duals(tuple(0.3 * _cpu_randn(r.shape, gen, r.dtype, device) for r in duals.rho))
    state, scale = initial_state(problem, duals + noise)
    eta = tuple(s * (_cpu_rand(s.shape, gen, s.dtype, device) + 0.5) for s in scale)
    return problem, state, eta


def _cpu_randn(shape, gen: torch.Generator, dtype, device) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=dtype, device="cpu").to(device)


def _cpu_rand(shape, gen: torch.Generator, dtype, device) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=dtype, device="cpu").to(device)


def _replace_block(problem, state: ProxState, j: int, new_b, new_a) -> ProxState:
    """`state` with block j's new B copies (its edges) and shares (its pairs)."""
    xhB, xhA = list(state.xhB), list(state.xhA)
    for e, b in zip(problem.net.act_edges[j - 1] if j else (), new_b):
        xhB[e] = b
    for k, a in zip(problem.net.sources[j].pairs, new_a):
        xhA[k] = a
    return state._replace(xhA=tuple(xhA), xhB=tuple(xhB))


@pytest.mark.parametrize(
    "name, use_triton",
    [
        ("mlp", False),
        ("conv", False),
        ("residual", False),
        pytest.param("conv", True, marks=needs_triton),
        pytest.param("residual", True, marks=needs_triton),
    ],
)
def test_block_steps_equal_the_proximal_solver(name, use_triton):
    """Sweeps over every block (first, middle, last) of a zoo net, float64, B=2, S=3; the
    second sweep starts away from the oracle's points (one sweep for the slow interpreter).
    The residual net's blocks fit the kernels too (one share each, the skip inside a region)."""
    problem, state, eta = _solver_setup(name)
    assert all(_fusable(problem, j) for j in range(problem.n_blocks))
    start = state
    for _ in range(1 if use_triton else 2):
        for j in range(problem.n_blocks):
            want = _generic_block_step(problem, state, eta, j)
            got = _relu_block_step(problem, state, eta, j, use_triton)
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
            state = _replace_block(problem, state, j, *want)
    moved = [(a - b).abs().max() for a, b in zip(state.xhB + state.xhA, start.xhB + start.xhA)]
    assert min(moved) > 0  # every block stepped


@needs_triton
def test_solver_through_the_triton_kernels_equals_the_generic_solver():
    """The whole proximal solver with the kernel path forced (the interpreter on CPU)."""
    problem, _, _ = _solver_setup("mlp")
    config = proximal.ProximalConfig(iterations=4, inner=2, compile=False)  # the kernels only
    with kernel_backend("reference"):  # (the default on CPU; on CUDA "auto" is Triton)
        generic = proximal.solve(problem, config, initial_duals(problem))
    with kernel_backend("triton"):
        fused = proximal.solve(problem, config, initial_duals(problem))
    torch.testing.assert_close(fused.lower, generic.lower, rtol=1e-9, atol=1e-9)
    for a, b in zip(fused.duals.rho, generic.duals.rho):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_launchers_check_their_inputs():
    args = list(_oracle_inputs(2, 3, (5,), "mixed", "batch", torch.float32))
    bad_shape = args.copy()
    bad_shape[2] = args[2][:, :2]
    with pytest.raises(ValueError, match="xhA_in must have shape"):
        prox_relu_oracle_triton(*bad_shape)
    bad_dtype = args.copy()
    bad_dtype[4] = args[4].double()
    with pytest.raises(TypeError, match="float32 or float64"):
        prox_relu_oracle_triton(*bad_dtype)
    strided = args.copy()
    strided[0] = torch.randn(2, 3, 10)[..., ::2]
    with pytest.raises(ValueError, match="contiguous"):
        prox_relu_oracle_triton(*strided)
    bad_bounds = args.copy()
    bad_bounds[5] = bad_bounds[6] = args[5][:1]
    with pytest.raises(ValueError, match="lower/upper"):
        prox_relu_oracle_triton(*bad_bounds)
    xhA = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="all of xhB"):
        prox_block_update(xhA, xhA, xhA, xhB=torch.zeros(2, 3, 5))


@needs_triton
@pytest.mark.parametrize("op", ["prox_neg_rho", "prox_relu_oracle", "prox_block_update"])
def test_custom_op_registration(op):
    """Schema, fake (meta) implementation and dispatcher checks of the Triton path's op."""
    oracle_args = _oracle_inputs(2, 3, (4, 3), "mixed", "batch", torch.float64)
    anchor, xhB, xhA, eta = oracle_args[:4]
    cases = {
        "prox_neg_rho": (anchor, xhB, xhA, eta),
        "prox_relu_oracle": oracle_args,
        "prox_block_update": (anchor, xhA, xhB, eta, xhB, anchor, eta, eta),
    }
    checks = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(getattr(torch.ops.ldverify, op).default, cases[op], test_utils=checks)


def _step(args, use_triton: bool) -> tuple:
    """Pass 1 and 2 of a middle block step (the affine maps replaced by fixed tensors), and a
    first-and-last block's update (no B side, no proximal term: zeros made inside)."""
    anchor_in, xhB, xhA_in, eta_in, g, lower, upper, anchor_out, xhB_out, xhA_out, xhA_cg = args
    coeff = prox_neg_rho(anchor_out, xhB_out, xhA_out, eta_in, use_triton=use_triton)
    xhB_cg, _, num_b, den_b = prox_relu_oracle(
        anchor_in, xhB, xhA_in, eta_in, g, lower, upper, use_triton=use_triton
    )
    b_side = {"xhB": xhB, "xhB_cg": xhB_cg, "num_b": num_b, "den_b": den_b}
    middle = prox_block_update(coeff, xhA_out, xhA_cg, eta_in, **b_side, use_triton=use_triton)
    single = prox_block_update(coeff, xhA_out, xhA_cg, use_triton=use_triton)
    return (*middle, single[0], single[2])


@cpu_generated
def _compile_inputs() -> tuple:
    oracle_args = _oracle_inputs(2, 3, (3, 4, 4), "mixed", "batch", torch.float32)
    gen = torch.Generator().manual_seed(7)
    return (*oracle_args, *(torch.randn(2, 3, 10, generator=gen) for _ in range(4)))


@pytest.mark.compile
@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=needs_triton)])
def test_ops_trace_into_one_graph(use_triton):
    """fullgraph tracing of the reference and of the custom ops (their fake implementations);
    aot_eager: no code generation."""
    args = _compile_inputs()
    step = torch.compile(lambda a: _step(a, use_triton), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(step(args), _step(args, use_triton))


@needs_triton
@pytest.mark.compile
@pytest.mark.slow
def test_ops_inside_inductor_fullgraph():
    """Inductor around the custom ops and the reference (a cold compile takes 12-20 s)."""
    args = _compile_inputs()
    both = lambda a: (_step(a, False), _step(a, True))  # noqa: E731
    compiled = torch.compile(both, fullgraph=True)
    torch.testing.assert_close(compiled(args), both(args))


@needs_triton
def test_gpu_check_smoke():
    """The benchmark's smoke size on CUDA where there is one (real Triton), else on the CPU
    (the interpreter: tests/conftest.py sets it only on machines without CUDA)."""
    rows = gpu_check_prox.run("cuda" if torch.cuda.is_available() else "cpu", smoke=True)
    checks = [row for row in rows if "ok" in row]
    assert checks and all(row["ok"] for row in checks)
    assert {row["impl"] for row in rows if "ms" in row} >= {"reference", "triton"}


@pytest.mark.gpu
@pytest.mark.parametrize("batch, specs, shape_in, shape_out", SHAPES)
def test_kernels_equal_reference_on_cuda(batch, specs, shape_in, shape_out):
    cpu = _oracle_inputs(batch, specs, shape_in, "mixed", "batch", torch.float32)
    args = [t.cuda() for t in cpu]
    ref = prox_relu_oracle_reference(*args)
    got = prox_relu_oracle(*args)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    torch.testing.assert_close(got[2:], ref[2:], **_tol(torch.float32))
    coeff, xhA, xhA_cg = (torch.randn(batch, specs, *shape_out, device="cuda") for _ in range(3))
    update_args = (coeff, xhA, xhA_cg, args[3], args[1], ref[0], ref[2], ref[3])
    torch.testing.assert_close(
        prox_block_update_triton(*update_args), prox_block_update_reference(*update_args)
    )
