"""Permutohedral lattice against brute-force Gaussian filtering on small images.

The lattice is an approximation (Adams et al. 2010). Bounds stated and tested here, measured on
small synthetic images (features = (x, y[, r, g, b]) / sigma):
- 2-D (smoothness) kernel, sigma = 3 px: relative L2 error of the raw output <= 0.15, of the
  normalised output ``(K v) / (K 1)`` <= 0.03;
- 5-D (appearance) kernel: the raw output is damped by a factor 0.34-0.68 per pixel (the
  blur skips vertices absent from the sparse lattice; the reference C++ code behaves the
  same), so we bound the normalised output: relative L2 error <= 0.05 (measured 0.022), and
  the raw output after one global rescaling <= 0.10 (measured 0.055-0.071).
Measured 2-D errors: raw 0.123-0.125, normalised 0.006-0.011.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from crf_testlib import smooth_image

from crf.lattice import build_lattice, gaussian_filter_exact


def _features(h: int, w: int, sxy: float, srgb: float | None) -> torch.Tensor:
    img = torch.from_numpy(smooth_image(h, w)).double()
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = [xx.double() / sxy, yy.double() / sxy]
    if srgb is not None:
        pos += [img[..., c] / srgb for c in range(3)]
    return torch.stack(pos, -1).reshape(-1, len(pos))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("sxy", "srgb", "raw_tol", "norm_tol"),
    [
        (3.0, None, 0.15, 0.03),
        (1.5, None, 0.15, 0.03),
        (10.0, 13.0, None, 0.05),
        (80.0, 13.0, None, 0.05),
    ],
)
def test_lattice_matches_brute_force(sxy, srgb, raw_tol, norm_tol):
    f = _features(24, 32, sxy, srgb)
    v = torch.rand(f.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    lat = build_lattice(f, dtype=torch.float64)
    out, ref = lat.filter(v), gaussian_filter_exact(f, v)
    ones = torch.ones(f.shape[0], 1, dtype=torch.float64)
    out1, ref1 = lat.filter(ones), gaussian_filter_exact(f, ones)
    assert _rel(out / out1, ref / ref1) <= norm_tol
    if raw_tol is not None:
        assert _rel(out, ref) <= raw_tol
    else:
        assert _rel(out * (ref1.sum() / out1.sum()), ref) <= 0.10


def test_lattice_structure():
    """Barycentric weights are a partition of unity; splatting conserves mass; neighbours valid."""
    f = _features(12, 10, 2.0, 20.0)
    lat = build_lattice(f, dtype=torch.float64)
    assert torch.all(lat.weights >= -1e-12)
    torch.testing.assert_close(lat.weights.sum(1), torch.ones(f.shape[0], dtype=torch.float64))
    splat = lat.splat(torch.ones(f.shape[0], 1, dtype=torch.float64))
    assert abs(float(splat.sum()) - f.shape[0]) < 1e-9
    assert float(splat[-1].abs().sum()) == 0.0  # padding row stays empty
    assert int(lat.neighbours.max()) <= lat.n_vertices


def test_lattice_linear_and_batched():
    """Filtering is linear, and a batch equals the images filtered one at a time."""
    f1, f2 = _features(8, 9, 2.0, 15.0), _features(8, 9, 2.0, 15.0) * 1.3 + 0.7
    g = torch.Generator().manual_seed(1)
    v = torch.rand(2, f1.shape[0], 4, dtype=torch.float64, generator=g)
    batch = build_lattice(torch.stack([f1, f2]), dtype=torch.float64)
    out = batch.filter(v.reshape(-1, 4)).reshape(2, -1, 4)
    for i, f in enumerate((f1, f2)):
        single = build_lattice(f, dtype=torch.float64)
        torch.testing.assert_close(out[i], single.filter(v[i]))
    lin = batch.filter((2 * v - 1).reshape(-1, 4))
    torch.testing.assert_close(lin, 2 * out.reshape(-1, 4) - batch.filter(torch.ones_like(lin)))


def test_lattice_level_sums_fast_path_matches_masks():
    """The linear-time level filtering equals filtering explicit cumulative masks."""
    import crf
    from crf.pairwise import level_sums_generic

    img = smooth_image(10, 12)
    unary = torch.rand(10, 12, 4, generator=torch.Generator().manual_seed(2)).numpy()
    model = crf.DenseCRF(img, unary, sigma_xy=5, sigma_rgb=20, dtype=torch.float64).model
    levels = torch.randint(0, 7, (1, 120, 4), generator=torch.Generator().manual_seed(3))
    weight = torch.rand(1, 120, 1, dtype=torch.float64)
    sparse = levels * (torch.rand(levels.shape, generator=torch.Generator().manual_seed(4)) < 0.1)
    for lev in (levels, sparse, torch.zeros_like(levels)):
        for term in model.terms:
            fast = term.kernel.level_sums(lev, weight, 7)
            slow = level_sums_generic(term.kernel.filter, lev, weight, 7)
            torch.testing.assert_close(fast, slow)
    for term in model.terms:
        fast = term.kernel.level_sums(levels, weight, 7)
        slow = level_sums_generic(term.kernel.filter, levels, weight, 7)
        torch.testing.assert_close(fast, slow)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lattice_cuda_matches_cpu():
    f = _features(30, 40, 10.0, 13.0)
    v = torch.rand(f.shape[0], 5, dtype=torch.float64)
    cpu = build_lattice(f, dtype=torch.float64).filter(v)
    gpu = build_lattice(f.cuda(), dtype=torch.float64).filter(v.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu)


# --- the sort-based build (issue 15) against the previous build and the sparse paths ---------

#: Filtering by the new lattice against the previous build's, relative L-inf error: the two
#: lattices are the same (vertex numbering included) on these images, so the outputs agree to
#: rounding: measured 0 (float32, float64); bounds stated with margin.
PREVIOUS_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}


def _batch_features(batch: int, h: int, w: int, sxy: float, srgb: float | None) -> torch.Tensor:
    feats = [_features(h, w, sxy, srgb) * (1.0 + 0.1 * i) + 0.3 * i for i in range(batch)]
    return torch.stack(feats)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("sxy", "srgb", "batch"), [(3.0, None, 1), (80.0, 13.0, 1), (10.0, 20.0, 2), (1.5, None, 3)]
)
def test_new_build_equals_previous_build(sxy, srgb, batch, dtype):
    from lattice_v1 import build_reference

    f = _batch_features(batch, 20, 27, sxy, srgb)
    new, old = build_lattice(f, dtype=dtype), build_reference(f, dtype=dtype)
    assert new.n_vertices == old.n_vertices
    assert torch.equal(new.offsets, old.offsets) and torch.equal(new.neighbours, old.neighbours)
    torch.testing.assert_close(new.weights, old.weights, rtol=0.0, atol=1e-12)
    g = torch.Generator().manual_seed(5)
    v = torch.rand(new.n_points, 4, generator=g, dtype=torch.float64).to(dtype)
    out, ref = new.filter(v), old.filter(v)
    assert float((out - ref).abs().max() / ref.abs().max()) <= PREVIOUS_TOLERANCE[dtype]


def test_blocked_point_stage_is_exact():
    """The per-point stage runs over blocks of points: any block size gives the same lattice."""
    from crf.lattice_build import build_structure

    f = _batch_features(2, 15, 17, 5.0, 20.0)
    ref = build_structure(f, torch.float64)
    for chunk in (1, 7, 100, 10**6):
        s = build_structure(f, torch.float64, chunk=chunk)
        assert s.n_vertices == ref.n_vertices and torch.equal(s.offsets, ref.offsets)
        assert torch.equal(s.weights, ref.weights) and torch.equal(s.neighbours, ref.neighbours)


def test_sparse_paths_agree():
    """scipy (eager CPU), the index-based references and the torch CSR matrices: one filter."""
    from kernels.lattice_filter import lattice_filter

    f = _batch_features(2, 12, 13, 4.0, 25.0)
    lat = build_lattice(f, dtype=torch.float64)
    v = torch.rand(lat.n_points, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    scipy_out = lat.filter(v)
    args = (v, lat.offsets, lat.weights, lat.slice_weights, lat.neighbours)
    ref_out = lattice_filter(*args, use_triton=False)
    csr_out = torch.sparse.mm(lat.slice_matrix, lat.blur(torch.sparse.mm(lat.splat_matrix, v)))
    torch.testing.assert_close(scipy_out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(csr_out, ref_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalize", [None, "symmetric"])
def test_fused_model_filter_equals_kernel_by_kernel(normalize):
    """crf.fused: one splat / slice for all kernels == the sum over kernels (and subtract)."""
    import crf

    imgs = np.stack([smooth_image(10, 11, s) for s in (0, 1)])
    unary = torch.rand(2, 10, 11, 3, generator=torch.Generator().manual_seed(7)).numpy()
    model = crf.DenseCRF(imgs, unary, normalize=normalize, dtype=torch.float64).model
    v = torch.rand(2, 110, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    assert model.uses_fused(v)
    ref = sum(
        t.weight * (t.kernel.filter(v) if t.norm is None else t.norm * t.kernel.filter(t.norm * v))
        for t in model.terms
    )
    torch.testing.assert_close(model.filter(v), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.filter(v, subtract=model.unary), ref - model.unary)
    raw = sum(t.weight * t.kernel.filter(v) for t in model.terms)
    torch.testing.assert_close(model.filter_raw(v), raw, rtol=1e-12, atol=1e-12)
