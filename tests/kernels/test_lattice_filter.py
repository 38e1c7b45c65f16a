"""Permutohedral splat / blur / slice kernels (kernels/lattice_filter.py): Triton (the
interpreter on CPU) against the torch references on awkward shapes, the references against
the CSR matrices of a real lattice, the custom ops' registrations, the argument checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from crf.lattice import build_lattice, scipy_product
from kernels import backend
from kernels.lattice_filter import (
    _lattice_blur_triton,
    _lattice_slice_triton,
    _lattice_splat_triton,
    lattice_blur,
    lattice_blur_reference,
    lattice_filter,
    lattice_slice,
    lattice_slice_reference,
    lattice_splat,
    lattice_splat_reference,
)
from tests.kernels import DTYPES, cpu_generated, needs_triton

# (points P, channels C, vertices per point d+1, lattice rows R): 1 point / 1 channel, odd and
# non-power-of-2 sizes, more channels than one 64-wide tile.
SHAPES = [(1, 1, 2, 2), (7, 3, 3, 5), (37, 5, 6, 23), (130, 21, 3, 61), (9, 70, 4, 11)]


def _tol(dtype: torch.dtype) -> dict:
    return (
        {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    )


@cpu_generated
def random_lattice(p, c, d1, rows, dtype, seed=0):
    """Values (P, C), offsets / weights (P, d+1) into rows [0, R-1) (R-1 = padding row),
    neighbours (d+1, 2, R) with the padding row its own neighbour."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(p, c, generator=g, dtype=dtype)
    offsets = torch.randint(0, max(rows - 1, 1), (p, d1), generator=g)
    weights = torch.rand(p, d1, generator=g, dtype=dtype)
    neighbours = torch.randint(0, rows, (d1, 2, rows), generator=g)
    neighbours[:, :, rows - 1] = rows - 1
    return [values, offsets, weights, neighbours]


@cpu_generated
def _features_and_values(seed: int, points: int, dims: int, channels: int, dtype):
    """Lattice features (2 "images" of `points` points in `dims` dimensions, float64) and
    values `(2 * points, channels)` of `dtype`."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(2, points, dims, generator=g, dtype=torch.float64) * 4
    return feats, torch.rand(2 * points, channels, generator=g, dtype=dtype)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernels_match_references(shape, dtype):
    p, c, d1, rows = shape
    values, offsets, weights, neighbours = random_lattice(p, c, d1, rows, dtype)
    tol = _tol(dtype)
    lat = lattice_splat(values, offsets, weights, rows, use_triton=True)
    ref = lattice_splat_reference(values, offsets, weights, rows)
    torch.testing.assert_close(lat, ref, **tol)
    assert lat.shape == (rows, c) and lat.dtype == dtype
    blurred = lattice_blur(ref, neighbours, use_triton=True)
    torch.testing.assert_close(blurred, lattice_blur_reference(ref, neighbours), **tol)
    out = lattice_slice(blurred, offsets, weights, use_triton=True)
    torch.testing.assert_close(out, lattice_slice_reference(blurred, offsets, weights), **tol)
    assert out.shape == (p, c)


@needs_triton
def test_int32_indices_and_strided_values():
    _, offsets, weights, neighbours = random_lattice(19, 6, 3, 9, torch.float32, seed=3)
    strided = torch.randn(6, 19).t()  # not contiguous
    a = lattice_splat(strided, offsets.int(), weights, 9, use_triton=True)
    torch.testing.assert_close(a, lattice_splat_reference(strided, offsets, weights, 9))
    b = lattice_blur(a, neighbours.int(), use_triton=True)
    torch.testing.assert_close(b, lattice_blur_reference(a, neighbours))


@needs_triton
def test_blur_keeps_input_and_padding_row():
    values, offsets, weights, neighbours = random_lattice(11, 4, 3, 8, torch.float64, seed=1)
    lat = lattice_splat_reference(values, offsets, weights, 8)
    before = lat.clone()
    out = lattice_blur(lat, neighbours, use_triton=True)
    assert torch.equal(lat, before)  # functional: the input is not overwritten
    assert float(out[-1].abs().max()) == 0.0  # the padding row stays zero


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_real_lattice_filter_matches_csr_path(dtype):
    """On a built lattice, the Triton filter equals the eager sparse-matrix splat / blur /
    slice (scipy on CPU, torch CSR on CUDA: the reference mode keeps Triton out of it)."""
    feats, values = _features_and_values(2, 23, 5, 3, dtype)
    lat = build_lattice(feats, dtype=dtype)
    args = (values, lat.offsets, lat.weights, lat.slice_weights, lat.neighbours)
    with backend.kernel_backend("reference"):
        csr = lat.filter(values)
    torch.testing.assert_close(lattice_filter(*args, use_triton=True), csr, **_tol(dtype))
    torch.testing.assert_close(lattice_filter(*args, use_triton=False), csr, **_tol(dtype))


def test_references_equal_the_eager_cpu_matrices_exactly():
    """The index-based references sum in the order of the eager CPU path's scipy matrices
    (CSC splat, CSR slice): bit-identical (a claim about the CPU's sums: run on the CPU
    whatever the default device). torch's CPU CSR product, which no path uses, sums the splat
    otherwise on some builds (torch 2.13 with MKL on an AVX-512 CPU: 1 ulp in 14 of 152)."""
    with torch.device("cpu"):
        feats = torch.rand(40, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        lat = build_lattice(feats * 5, dtype=torch.float32)
        values = torch.rand(40, 4, generator=torch.Generator().manual_seed(5))
        splat_matrix, slice_matrix = lat.cpu_matrices
        splat = lattice_splat_reference(values, lat.offsets, lat.weights, lat.n_vertices + 1)
        assert torch.equal(splat, scipy_product(splat_matrix, values))
        sliced = lattice_slice_reference(splat, lat.offsets, lat.slice_weights)
        assert torch.equal(sliced, scipy_product(slice_matrix, splat))
        assert torch.equal(lat.filter(values), scipy_product(slice_matrix, lat.blur(splat)))


@needs_triton
def test_custom_ops_registrations():
    """Schema, fake (meta) implementations and dynamic shapes of the three custom ops."""
    values, offsets, weights, neighbours = random_lattice(6, 3, 3, 5, torch.float32, seed=6)
    lat = lattice_splat_reference(values, offsets, weights, 5)
    torch.library.opcheck(_lattice_splat_triton, (values, offsets, weights, 5))
    torch.library.opcheck(_lattice_blur_triton, (lat, neighbours))
    torch.library.opcheck(_lattice_slice_triton, (lat, offsets, weights))


CUDA_LIKE = SimpleNamespace(is_cuda=True)  # `use_triton` reads only `is_cuda` of its tensor


@pytest.mark.parametrize(
    "x",
    [
        pytest.param(torch.zeros(2, 2, device="cpu"), id="cpu"),
        pytest.param(CUDA_LIKE, id="cuda-like"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ],
)
def test_dispatch_follows_backend_mode(x):
    """The "auto" mode runs Triton for CUDA tensors only (a GPU machine's kernel tests make CUDA
    tensors by default, so the expectation depends on the tensor, not on the mode alone),
    "triton" always, "reference" never; forcing Triton on a CPU tensor needs the interpreter."""
    if isinstance(x, str):
        x = torch.zeros(2, 2, device=x)
    runnable = backend.HAS_TRITON and (x.is_cuda or backend.INTERPRET)
    with backend.kernel_backend("auto"):
        assert backend.use_triton(x) is (x.is_cuda and backend.HAS_TRITON)
    with backend.kernel_backend("reference"):
        assert backend.use_triton(x) is False
        if runnable:
            assert backend.use_triton(x, True) is True
        else:
            with pytest.raises(RuntimeError, match="triton"):
                backend.use_triton(x, True)
    if runnable:
        with backend.kernel_backend("triton"):
            assert backend.use_triton(x) is True
    with pytest.raises(ValueError), backend.kernel_backend("fast"):
        pass


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("float offsets", lambda v, o, w, n: lattice_splat(v, o.double(), w, 5)),
        ("weights dtype", lambda v, o, w, n: lattice_splat(v, o, w.double(), 5)),
        ("points", lambda v, o, w, n: lattice_splat(v[:-1], o, w, 5)),
        ("int values", lambda v, o, w, n: lattice_slice(v.long(), o, w)),
        ("neighbour rows", lambda v, o, w, n: lattice_blur(torch.zeros(4, 3), n)),
        ("neighbour dtype", lambda v, o, w, n: lattice_blur(torch.zeros(5, 3), n.float())),
    ],
)
def test_bad_arguments_raise(name, call):
    values, offsets, weights, neighbours = random_lattice(6, 3, 3, 5, torch.float32)
    with pytest.raises(ValueError):
        call(values, offsets, weights, neighbours)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_match_cpu_references(dtype):
    p, c, d1, rows = 5000, 21, 6, 1201
    cpu = random_lattice(p, c, d1, rows, dtype, seed=7, device="cpu")
    values, offsets, weights, neighbours = (t.cuda() for t in cpu)
    out = lattice_filter(values, offsets, weights, weights, neighbours)  # auto: Triton on CUDA
    lat = lattice_splat_reference(cpu[0], cpu[1], cpu[2], rows)
    ref = lattice_slice_reference(lattice_blur_reference(lat, cpu[3]), cpu[1], cpu[2])
    torch.testing.assert_close(out.cpu(), ref, **_tol(dtype))
