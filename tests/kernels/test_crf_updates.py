"""Dense-CRF update kernels (kernels/crf_updates.py): Triton (the interpreter on CPU) against the
torch references on awkward shapes, the references against their definitions (softmax, the
Frank-Wolfe vertex, the optimality conditions of the simplex projection), custom-op checks."""

from __future__ import annotations

import pytest
import torch

from kernels.crf_updates import (
    SIMPLEX_KERNEL_MAX_LABELS,
    _frank_wolfe_direction_triton,
    _frank_wolfe_update_triton,
    _meanfield_normalise_triton,
    _project_simplex_triton,
    frank_wolfe_direction,
    frank_wolfe_update,
    meanfield_normalise,
    meanfield_normalise_reference,
    project_simplex,
    project_simplex_reference,
)
from tests.kernels import DTYPES, cpu_generated, needs_triton

# (..., M): one label, odd pixel counts, non-power-of-2 label counts, few labels (the
# transposed softmax path), more than 128 labels (beyond the simplex kernel).
SHAPES = [(1, 1), (7, 1), (3, 11, 5), (2, 33, 21), (5, 37), (1, 3, 130)]


def _tol(dtype: torch.dtype) -> dict:
    return (
        {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-13}
    )


@cpu_generated
def _randn(shape, dtype, seed, scale=3.0) -> torch.Tensor:
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@cpu_generated
def _randint(high: int, shape, seed: int) -> torch.Tensor:
    """Integers in [0, high): ties for the argmin and the sorting."""
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_meanfield_normalise_kernel(shape, dtype):
    msg, unary = _randn(shape, dtype, 0), _randn(shape, dtype, 1)
    out = meanfield_normalise(msg, unary, use_triton=True)
    ref = meanfield_normalise_reference(msg, unary)
    torch.testing.assert_close(out, ref, **_tol(dtype))
    torch.testing.assert_close(ref, torch.softmax(msg - unary, -1), **_tol(dtype))
    torch.testing.assert_close(out.sum(-1), torch.ones(shape[:-1], dtype=dtype), **_tol(dtype))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_frank_wolfe_direction_kernel_with_ties(shape, dtype):
    """Integer-valued gradients make ties: both pick the first minimum (torch.argmin)."""
    g = _randint(3, shape, seed=2).to(dtype)
    y = torch.rand(shape, dtype=dtype)
    out = frank_wolfe_direction(g, y, use_triton=True)
    vertex = torch.nn.functional.one_hot(g.argmin(-1), shape[-1]).to(dtype)
    assert torch.equal(out, vertex - y)
    assert torch.equal(frank_wolfe_direction(g, y, use_triton=False), vertex - y)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bnm", [(1, 1, 1), (1, 7, 1), (3, 13, 5), (2, 129, 21)])
def test_frank_wolfe_update_kernel(bnm, dtype):
    y, g, r, pr = (_randn(bnm, dtype, s) for s in range(4))
    alpha = torch.rand(bnm[0], 1, 1, dtype=torch.float64)  # one step per image, float64
    out = frank_wolfe_update(y, g, r, pr, alpha, use_triton=True)
    ref = frank_wolfe_update(y, g, r, pr, alpha, use_triton=False)
    a = alpha.to(dtype)
    for o, rf, exact in zip(out, ref, (y + a * r, g + 2 * a * pr)):
        torch.testing.assert_close(o, rf, **_tol(dtype))
        torch.testing.assert_close(rf, exact, **_tol(dtype))


def _assert_is_projection(v: torch.Tensor, y: torch.Tensor, dtype) -> None:
    """KKT conditions of min |y - v|^2 on the simplex: y >= 0, sum y = 1, and y = max(v - t, 0)
    for one threshold t per row (v - y = t on the support, v <= t off it)."""
    tol = _tol(dtype)
    assert float(y.min()) >= 0.0
    torch.testing.assert_close(y.sum(-1), torch.ones(v.shape[:-1], dtype=dtype), **tol)
    support = y > 0
    t = torch.where(support, v - y, -torch.inf).amax(-1, keepdim=True)
    torch.testing.assert_close(torch.where(support, v - y, t), t.expand_as(v), **tol)
    assert bool((torch.where(support, -torch.inf, v) <= t + 1e-6).all())


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [*SHAPES[:-1], (4, 128)])
def test_project_simplex_kernel(shape, dtype):
    v = _randn(shape, dtype, 3, scale=0.7)
    ties = _randint(4, shape, seed=4).to(dtype) / 3
    for x in (v, ties, v.abs() / v.abs().sum(-1, keepdim=True)):  # random, tied, on the simplex
        out = project_simplex(x, use_triton=True)
        ref = project_simplex_reference(x)
        torch.testing.assert_close(out, ref, **_tol(dtype))
        _assert_is_projection(x, ref, dtype)


def test_project_simplex_is_identity_on_the_simplex_and_falls_back_beyond_128_labels():
    p = torch.rand(9, 130, dtype=torch.float64)
    p = p / p.sum(-1, keepdim=True)
    torch.testing.assert_close(project_simplex(p), p)  # auto: reference (130 > 128 labels)
    with pytest.raises(ValueError):
        project_simplex(p, use_triton=True)
    assert SIMPLEX_KERNEL_MAX_LABELS == 128


@needs_triton
def test_custom_ops_registrations():
    """Schema and fake (meta) implementations of the four custom ops."""
    x, y = torch.randn(5, 3), torch.rand(5, 3)
    torch.library.opcheck(_meanfield_normalise_triton, (x, y))
    torch.library.opcheck(_frank_wolfe_direction_triton, (x, y))
    torch.library.opcheck(_project_simplex_triton, (x,))
    b = torch.randn(2, 3, 4)
    alpha = torch.rand(2, dtype=torch.float64)
    torch.library.opcheck(_frank_wolfe_update_triton, (b, b + 1, b * 2, b - 1, alpha))


@pytest.mark.parametrize(
    "call",
    [
        lambda: meanfield_normalise(torch.zeros(3, 4), torch.zeros(3, 5)),
        lambda: meanfield_normalise(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.float64)),
        lambda: frank_wolfe_direction(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4)),
        lambda: frank_wolfe_update(*(torch.zeros(2, 3, 4),) * 4, torch.zeros(3)),
        lambda: frank_wolfe_update(*(torch.zeros(3, 4),) * 4, torch.zeros(3)),
        lambda: project_simplex(torch.zeros(3, 4, dtype=torch.int32)),
    ],
)
def test_bad_arguments_raise(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_match_cpu_references(dtype):
    shape = (2, 5001, 21)
    msg, unary, v = (_randn(shape, dtype, s, device="cpu") for s in range(3))
    out = meanfield_normalise(msg.cuda(), unary.cuda())  # auto: Triton on CUDA
    torch.testing.assert_close(out.cpu(), meanfield_normalise_reference(msg, unary), **_tol(dtype))
    torch.testing.assert_close(
        project_simplex(v.cuda()).cpu(), project_simplex_reference(v), **_tol(dtype)
    )
    alpha = torch.rand(2, 1, 1, dtype=torch.float64, device="cpu")
    gpu = frank_wolfe_update(*(t.cuda() for t in (msg, unary, v, msg)), alpha.cuda())
    for o, rf in zip(gpu, frank_wolfe_update(msg, unary, v, msg, alpha, use_triton=False)):
        torch.testing.assert_close(o.cpu(), rf, **_tol(dtype))
    direction = frank_wolfe_direction(unary.cuda(), v.cuda()).cpu()
    torch.testing.assert_close(direction, frank_wolfe_direction(unary, v, use_triton=False))


def _projection_by_definition(v: torch.Tensor) -> torch.Tensor:
    """Held, Wolfe and Crowder / Duchi et al.: sort, the last index with u_k > (css_k - 1) / k."""
    u = torch.sort(v, dim=-1, descending=True).values
    css = torch.cumsum(u, -1) - 1.0
    k = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype)
    rho = ((u - css / k) > 0).to(torch.int64).cumsum(-1).argmax(-1, keepdim=True)
    return torch.clamp(v - torch.gather(css, -1, rho) / (rho + 1).to(v.dtype), min=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 2, 5, 21])
def test_project_simplex_cpu_fast_path(m, dtype):
    """The eager CPU reference (numpy sort, max over the prefix thresholds, in place with
    ``overwrite``) equals the textbook projection; ties and constant rows included."""
    if torch.get_default_device().type != "cpu":
        pytest.skip("the numpy path is for CPU tensors")
    g = torch.Generator().manual_seed(m)
    v = torch.randn(300, m, generator=g, dtype=dtype) * 3
    v[:20] = 0.25  # constant rows
    v[20:40, : m // 2] = 1.0  # ties at the top
    ref = _projection_by_definition(v)
    out = project_simplex_reference(v)
    torch.testing.assert_close(out, ref, **_tol(dtype))
    torch.testing.assert_close(out.sum(-1), torch.ones(300, dtype=dtype), **_tol(dtype))
    w = v.clone()
    assert project_simplex(w, overwrite=True).data_ptr() == w.data_ptr()  # written in place
    torch.testing.assert_close(w, ref, **_tol(dtype))
    before = v.clone()
    project_simplex(v)
    assert torch.equal(v, before)  # the default leaves the input alone
