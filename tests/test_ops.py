"""Each BoundOp: adjoint identity <A, op(x) - b> = <vjp(A), x>, interval enclosure, as_matrix."""

from __future__ import annotations

import pytest
import torch

from bounds.ops import (
    ConvOp,
    ElementwiseAffineOp,
    LinearOp,
    ReshapeOp,
    SumOp,
    avg_pool_as_conv,
)
from bounds.types import Interval

D = torch.float64


def _ops(gen: torch.Generator):
    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=D)

    yield "linear", LinearOp(r(7, 5), r(7))
    yield "linear_nobias", LinearOp(r(3, 4), None)
    yield "conv", ConvOp(r(4, 3, 3, 3), r(4), (3, 7, 6), (2, 2), (1, 1), (1, 1), 1)
    yield "conv_odd", ConvOp(r(2, 3, 2, 3), None, (3, 9, 8), (3, 2), (0, 1), (1, 1), 1)
    yield "conv_dilated_grouped", ConvOp(r(4, 2, 3, 3), r(4), (4, 8, 8), (1, 2), (2, 1), (2, 1), 2)
    yield "avgpool", avg_pool_as_conv((3, 6, 5), (2, 2), (2, 2), (0, 0), D)
    yield "avgpool_pad", avg_pool_as_conv((2, 5, 5), (3, 3), (2, 2), (1, 1), D)
    yield "elementwise", ElementwiseAffineOp((3, 4, 4), r(3, 1, 1), r(3, 1, 1))
    yield "elementwise_shift", ElementwiseAffineOp((5,), None, r(5))
    yield "reshape", ReshapeOp((2, 3, 4), (24,))


OPS = dict(_ops(torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("name", list(OPS))
def test_adjoint_identity(name):
    op = OPS[name]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, *op.in_shape, generator=gen, dtype=D)
    A = torch.randn(2, 3, *op.out_shape, generator=gen, dtype=D)
    y = op.forward(x)
    lhs = (A * y.unsqueeze(1)).flatten(2).sum(-1) - op.bias_term(A)
    rhs = (op.vjp(A)[0] * x.unsqueeze(1)).flatten(2).sum(-1)
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(OPS))
def test_interval_encloses_and_matrix_agrees(name):
    op = OPS[name]
    gen = torch.Generator().manual_seed(2)
    lower = torch.randn(1, *op.in_shape, generator=gen, dtype=D)
    upper = lower + torch.rand(1, *op.in_shape, generator=gen, dtype=D)
    iv = op.interval(Interval(lower, upper))
    pts = lower + torch.rand(200, *op.in_shape, generator=gen, dtype=D) * (upper - lower)
    y = op.forward(pts)
    assert (y >= iv.lower - 1e-12).all() and (y <= iv.upper + 1e-12).all()
    W, b = op.as_matrix()
    torch.testing.assert_close(pts.flatten(1) @ W.T + b, y.flatten(1))


def test_sum_op_adjoint_and_interval():
    op = SumOp((3, 2), (1.0, -1.0))
    gen = torch.Generator().manual_seed(3)
    x1, x2 = (torch.randn(2, 3, 2, generator=gen, dtype=D) for _ in range(2))
    A = torch.randn(2, 4, 3, 2, generator=gen, dtype=D)
    y = op.forward(x1, x2)
    lhs = (A * y.unsqueeze(1)).flatten(2).sum(-1)
    a1, a2 = op.vjp(A)
    rhs = (a1 * x1.unsqueeze(1)).flatten(2).sum(-1) + (a2 * x2.unsqueeze(1)).flatten(2).sum(-1)
    torch.testing.assert_close(lhs, rhs)
    iv = op.interval(Interval(x1 - 1, x1 + 1), Interval(x2 - 0.5, x2 + 0.5))
    torch.testing.assert_close(iv.lower, y - 1.5)
    torch.testing.assert_close(iv.upper, y + 1.5)


def test_conv_adjoint_restores_input_size_when_stride_does_not_divide():
    op = OPS["conv"]  # 7x6 input, stride 2: one row is read by no output
    A = torch.ones(1, 1, *op.out_shape, dtype=D)
    assert op.vjp(A)[0].shape == (1, 1, *op.in_shape)
