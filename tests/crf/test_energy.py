"""Energies: the one reported convention, relaxations at integral points, lattice vs exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from crf_testlib import smooth_image, tiny_crf

import crf
from crf.energy import brute_force_minimum, labelling_energy, lp_energy_exact, relaxed_energy


def _dense_energy(c: crf.DenseCRF, labels: np.ndarray) -> float:
    """Definition: sum_a phi_a(x_a) + sum over ordered pairs a != b of K_ab [x_a != x_b]."""
    m = c.model
    x = torch.from_numpy(labels.reshape(-1))
    unary = float(m.unary[0, torch.arange(x.numel()), x].sum())
    k = sum(t.weight * t.kernel.matrix[0] for t in m.terms)  # un-normalised kernels
    diff = (x[:, None] != x[None, :]).double()
    return unary + float((k * diff).sum())  # diagonal has diff = 0


@pytest.mark.parametrize("normalize", [None, "symmetric"])
def test_reported_energy_is_unnormalised_ordered_pairs(normalize):
    c = tiny_crf(0, h=3, w=4, normalize=normalize)
    rng = np.random.default_rng(1)
    for _ in range(5):
        lab = rng.integers(0, 3, (3, 4))
        assert c.energy(lab) == pytest.approx(_dense_energy(c, lab), rel=1e-12)


@pytest.mark.parametrize("normalize", [None, "symmetric"])
def test_relaxations_equal_energy_at_integral_points(normalize):
    c = tiny_crf(2, normalize=normalize)
    lab = torch.from_numpy(np.random.default_rng(0).integers(0, 3, (1, 9)))
    y = torch.nn.functional.one_hot(lab, 3).double()
    e = labelling_energy(c.model, lab, raw=False)
    torch.testing.assert_close(relaxed_energy(c.model, y), e)
    torch.testing.assert_close(lp_energy_exact(c.model, y), e)


def test_brute_force_returns_the_minimum():
    """Enumeration's minimum is below random labellings and matches its own labelling."""
    c = tiny_crf(3, h=2, w=3)
    best, lab = brute_force_minimum(c.model)
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = torch.from_numpy(rng.integers(0, 3, (1, 6)))
        assert float(labelling_energy(c.model, x, raw=False)) >= float(best) - 1e-9
    assert float(labelling_energy(c.model, lab[None], raw=False)) == pytest.approx(float(best))


def test_lattice_energy_close_to_exact():
    """Lattice energies carry the lattice error only in the pairwise part (smooth kernel)."""
    img = smooth_image(16, 20)
    unary = crf.unary_from_probs(np.random.default_rng(0).dirichlet(np.ones(3), size=(16, 20)))
    kw = dict(w_smooth=1.0, sigma_smooth=2.0, w_appearance=0.0, normalize=None)
    lat = crf.DenseCRF(img, unary, **kw, dtype=torch.float64)
    exact = crf.DenseCRF(img, unary, **kw, filtering="exact", dtype=torch.float64)
    lab = np.random.default_rng(1).integers(0, 3, (16, 20))
    assert lat.energy(lab) == pytest.approx(exact.energy(lab), rel=0.15)
