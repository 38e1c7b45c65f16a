"""The linear and shape BoundOps of issue 12: forward == the torch reference, the adjoint
identity `<A, op(x) - b> = <vjp(A), x>`, interval enclosure on sampled points (exact for ops
with nonnegative coefficients) and `as_matrix` agreement."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bounds.ops import (
    ConcatOp,
    ConvOp,
    ConvTransposeOp,
    ElementwiseAffineOp,
    ExpandOp,
    IndexOp,
    LinearOp,
    MatMulOp,
    PadOp,
    PermuteOp,
    ReduceOp,
)
from bounds.ops.compose import compose, fold_affine_chains
from bounds.types import Interval

D = torch.float64


def _r(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=D)


def _cases():
    """(name, op, torch reference on `[N, *in_shape]`)."""
    g = torch.Generator().manual_seed(0)
    idx = torch.tensor([3, 0, 0, 2])
    yield "index_gather_repeats", IndexOp((2, 4, 3), 1, idx), lambda x: x[:, :, idx]
    yield "index_slice", IndexOp((5, 3), 0, [1, 2, 3]), lambda x: x[:, 1:4]
    yield "index_step", IndexOp((2, 7), 1, [6, 4, 2, 0]), lambda x: x.flip(2)[:, :, ::2]
    yield "permute", PermuteOp((2, 3, 4), (2, 0, 1)), lambda x: x.permute(0, 3, 1, 2)
    yield "permute_swap", PermuteOp((5, 2), (1, 0)), lambda x: x.transpose(1, 2)
    yield "expand", ExpandOp((3, 1), (2, 3, 4)), lambda x: x.unsqueeze(1).expand(-1, 2, 3, 4)
    yield "expand_same_rank", ExpandOp((1, 4), (3, 4)), lambda x: x.expand(-1, 3, 4)
    yield "reduce_sum", ReduceOp((2, 3, 4), (0, 2), keepdim=True), lambda x: x.sum((1, 3), True)
    yield "reduce_mean", ReduceOp((2, 3, 4), (1,), False, mean=True), lambda x: x.mean(2)
    widths = ((0, 0), (1, 2), (2, -1))
    pad = PadOp((2, 3, 4), widths, 0.5, D)
    yield "pad_crop", pad, lambda x: F.pad(x, [2, -1, 1, 2], value=0.5)
    yield "pad_zero", PadOp((3,), ((1, 1),), 0.0, D), lambda x: F.pad(x, [1, 1])
    w = _r(g, 4, 3)
    yield "matmul_right", MatMulOp(w, (2, 5, 4), True, _r(g, 3)), None
    wl = _r(g, 3, 5)
    yield "matmul_left", MatMulOp(wl, (2, 5, 4), False, None), lambda x: wl @ x
    wt, bt = _r(g, 4, 2, 3, 3), _r(g, 4)
    yield (
        "conv_transpose",
        ConvTransposeOp(wt, bt, (4, 4, 5), (2, 2), (1, 0), (1, 0), (1, 1), 2),
        (lambda x: F.conv_transpose2d(x, wt, bt, (2, 2), (1, 0), (1, 0), 2, (1, 1))),
    )
    wd = _r(g, 2, 3, 2, 2)
    yield "conv_transpose_dilated", ConvTransposeOp(wd, None, (2, 3, 3), (1, 2), (0, 1), (0, 1), (2, 2)), (
        lambda x: F.conv_transpose2d(x, wd, None, (1, 2), (0, 1), (0, 1), 1, (2, 2))
    )  # fmt: skip


CASES = {name: (op, ref) for name, op, ref in _cases()}


def _inputs(op, seed: int, n: int = 3) -> torch.Tensor:
    return torch.randn(n, *op.in_shape, generator=torch.Generator().manual_seed(seed), dtype=D)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_torch(name):
    op, ref = CASES[name]
    x = _inputs(op, 1)
    y = op.forward(x)
    assert tuple(y.shape[1:]) == op.out_shape
    if ref is None:  # matmul_right: x @ W + b
        ref = lambda x: x @ op.weight + op.bias  # noqa: E731
    torch.testing.assert_close(y, ref(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_adjoint_identity(name):
    op, _ = CASES[name]
    gen = torch.Generator().manual_seed(2)
    x = _inputs(op, 3, n=2)
    A = torch.randn(2, 4, *op.out_shape, generator=gen, dtype=D)
    lhs = (A * op.forward(x).unsqueeze(1)).flatten(2).sum(-1) - op.bias_term(A)
    (back,) = op.vjp(A)
    assert back.shape == (2, 4, *op.in_shape)
    rhs = (back * x.unsqueeze(1)).flatten(2).sum(-1)
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(CASES))
def test_interval_encloses_samples_and_matrix_agrees(name):
    op, _ = CASES[name]
    gen = torch.Generator().manual_seed(4)
    lower = _inputs(op, 5, n=1)
    upper = lower + torch.rand(1, *op.in_shape, generator=gen, dtype=D)
    iv = op.interval(Interval(lower, upper))
    pts = lower + torch.rand(300, *op.in_shape, generator=gen, dtype=D) * (upper - lower)
    corners = torch.stack([lower[0], upper[0]])
    y = op.forward(torch.cat([pts, corners]))
    assert (y >= iv.lower - 1e-12).all() and (y <= iv.upper + 1e-12).all()
    W, b = op.as_matrix()
    torch.testing.assert_close(pts.flatten(1) @ W.T + b, op.forward(pts).flatten(1))
    # The interval of an affine map is exact: each bound is attained at a box corner.
    lo = (W.clamp(min=0) @ lower.flatten() + W.clamp(max=0) @ upper.flatten()) + b
    torch.testing.assert_close(iv.lower.flatten(), lo)


def test_concat_with_constant_block():
    gen = torch.Generator().manual_seed(6)
    const = _r(gen, 2, 1, 3)
    op = ConcatOp([(2, 4, 3), (2, 2, 3)], 1, [1, const, 0])
    x0, x1 = _r(gen, 3, 2, 4, 3), _r(gen, 3, 2, 2, 3)
    y = op.forward(x0, x1)
    torch.testing.assert_close(y, torch.cat([x1, const.expand(3, 2, 1, 3), x0], 2))
    assert op.out_shape == (2, 7, 3) and op.n_inputs == 2
    A = _r(gen, 3, 5, *op.out_shape)
    lhs = (A * y.unsqueeze(1)).flatten(2).sum(-1) - op.bias_term(A)
    a0, a1 = op.vjp(A)
    rhs = (a0 * x0.unsqueeze(1)).flatten(2).sum(-1) + (a1 * x1.unsqueeze(1)).flatten(2).sum(-1)
    torch.testing.assert_close(lhs, rhs)
    iv = op.interval(Interval(x0 - 1, x0 + 1), Interval(x1 - 0.5, x1 + 0.5))
    torch.testing.assert_close(iv.lower, torch.cat([x1 - 0.5, const.expand(3, 2, 1, 3), x0 - 1], 2))
    moved = op.to(torch.float32, "cpu")
    assert moved.forward(x0.float(), x1.float()).dtype == torch.float32


@pytest.mark.parametrize(
    "build",
    [
        lambda: IndexOp((3,), 0, [3]),
        lambda: IndexOp((3,), 1, [0]),
        lambda: PermuteOp((2, 3), (0, 0)),
        lambda: ExpandOp((2,), (3,)),
        lambda: ReduceOp((2,), (1,), True),
        lambda: PadOp((2,), ((-1, -1),)),
        lambda: MatMulOp(torch.ones(3, 2), (4,), True),
        lambda: ConcatOp([(2,), (3, 1)], 0, [0, 1]),
        lambda: ConcatOp([(2, 3)], 0, [0, 0]),
    ],
    ids=[
        "index_range",
        "index_axis",
        "perm",
        "expand",
        "reduce_axis",
        "pad_empty",
        "matmul",
        "concat_rank",
        "concat_twice",
    ],
)
def test_malformed_ops_raise(build):
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "name", ["index_gather_repeats", "pad_crop", "matmul_right", "conv_transpose"]
)
def test_to_changes_dtype(name):
    op, _ = CASES[name]
    moved = op.to(torch.float32, "cpu")
    x = _inputs(op, 7)
    torch.testing.assert_close(moved.forward(x.float()), op.forward(x).float())


def _compose_cases():
    g = torch.Generator().manual_seed(8)
    ct = ConvTransposeOp(_r(g, 4, 3, 3, 3), _r(g, 6), (4, 3, 3), (2, 2), (1, 1), (0, 0), (1, 1), 2)
    yield "linear", LinearOp(_r(g, 5, 3), None), ElementwiseAffineOp((5,), _r(g, 5), _r(g, 5))
    yield (
        "conv",
        ConvOp(_r(g, 3, 2, 3, 3), _r(g, 3), (2, 5, 5)),
        ElementwiseAffineOp((3, 3, 3), _r(g, 3, 1, 1), _r(g, 3, 1, 1)),
    )
    yield "conv_transpose", ct, ElementwiseAffineOp(ct.out_shape, _r(g, 6, 1, 1), None)
    mm = MatMulOp(_r(g, 4, 2), (3, 4), True, _r(g, 3, 2))
    yield "matmul", mm, ElementwiseAffineOp((3, 2), _r(g, 2), _r(g, 3, 2))
    yield (
        "elementwise",
        ElementwiseAffineOp((2, 3), _r(g, 3), None),
        ElementwiseAffineOp((2, 3), _r(g, 2, 1), _r(g, 3)),
    )


@pytest.mark.parametrize("case", list(_compose_cases()), ids=lambda c: c[0])
def test_folded_ops_compute_the_composition(case):
    _, prev, ew = case
    merged = compose(prev, ew)
    assert merged is not None and type(merged) is type(prev)
    x = _inputs(prev, 9)
    torch.testing.assert_close(merged.forward(x), ew.forward(prev.forward(x)))


def test_fold_refuses_what_is_not_per_channel():
    g = torch.Generator().manual_seed(10)
    conv = ConvOp(_r(g, 3, 2, 3, 3), _r(g, 3), (2, 5, 5))
    assert compose(conv, ElementwiseAffineOp((3, 3, 3), _r(g, 3, 3, 3), None)) is None
    specs = [("input", None, (), (3,)), ("fc", LinearOp(_r(g, 2, 3), None), ("input",), (2,)),
             ("bn", ElementwiseAffineOp((2,), _r(g, 2), None), ("fc",), (2,)),
             ("other", ElementwiseAffineOp((2,), None, _r(g, 2)), ("fc",), (2,))]  # fmt: skip
    assert [s[0] for s in fold_affine_chains(specs)] == [
        "input",
        "fc",
        "bn",
        "other",
    ]  # fc used twice


@pytest.mark.parametrize("name", list(CASES))
def test_nonnegative_ops_have_no_negative_entry(name):
    """An op that declares `nonnegative` (its interval is `[L l + b, L u + b]`) has
    `|L| x == L x` on random inputs; the others compute their interval by centre and radius."""
    op, _ = CASES[name]
    x = _inputs(op, 3)
    if op.nonnegative:
        torch.testing.assert_close(op.abs_linear(x), op.linear(x), rtol=0, atol=0)
    else:
        assert not torch.equal(op.abs_linear(x), op.linear(x))


def test_sums_and_reshapes_keep_infinite_and_huge_ends():
    """A sum of an exact 1 and terms in `[0, inf]` or `[0, 1e300]` (a softmax's sum of exps)
    keeps its lower end 1: no `inf - inf = nan`, no cancellation to 0; a reshape passes infinite
    ends through."""
    lower = torch.tensor([[1.0, 0.0, 0.0]], dtype=D)
    for top in (torch.inf, 1e300):
        upper = torch.tensor([[1.0, top, 2.0]], dtype=D)
        out = ReduceOp((3,), (0,), keepdim=False).interval(Interval(lower, upper))
        # widened outward by the sum's proven rounding bound (bounds.rounding), no further
        assert 1.0 - 1e-12 < out.lower.item() <= 1.0 and out.upper.item() >= top
    iv = IndexOp((3,), 0, [1, 2]).interval(
        Interval(lower, torch.tensor([[1.0, torch.inf, 2.0]], dtype=D))
    )
    assert iv.lower.tolist() == [[0.0, 0.0]] and iv.upper.tolist() == [[torch.inf, 2.0]]
