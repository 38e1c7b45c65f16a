"""Solvers on tiny instances against brute-force enumeration and an exact LP (HiGHS).

Asserted theorems (exact dense kernels, float64): every method's labelling energy >= the
brute-force minimum; the QP's Frank-Wolfe lower bound <= the minimum; the LP relaxation's
optimum <= the minimum; Frank-Wolfe with exact line search and CCCP never increase their
objectives; the proximal LP's primal y is feasible, so E_LP(y) >= the LP optimum, and it
converges to that optimum.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from crf_testlib import tiny_crf
from scipy.optimize import linprog

from crf.energy import _dense_kernel, brute_force_minimum, lp_energy_exact
from crf.solvers.dc_neg import DCNegConfig
from crf.solvers.lp_proximal import LPConfig, lp_proximal
from crf.solvers.meanfield import MeanFieldConfig

METHODS = ["meanfield", "qp", "dc-neg", "lp"]


def lp_optimum(model) -> float:
    """Exact LP relaxation value: min phi.y + sum_{a<b} K_ab sum_i t_abi, t >= |y_ai - y_bi|."""
    k = _dense_kernel(model)[0].numpy()
    phi = model.unary[0].double().numpy()
    n, m = phi.shape
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    nv = n * m + len(pairs) * m
    cost = np.concatenate([phi.ravel(), np.repeat([k[a, b] + k[b, a] for a, b in pairs], m) / 2])
    rows, rhs = [], []
    for p, (a, b) in enumerate(pairs):
        for i in range(m):
            for s in (1.0, -1.0):
                row = np.zeros(nv)
                row[a * m + i], row[b * m + i], row[n * m + p * m + i] = s, -s, -1.0
                rows.append(row)
                rhs.append(0.0)
    a_eq = np.zeros((n, nv))
    for a in range(n):
        a_eq[a, a * m : (a + 1) * m] = 1.0
    res = linprog(cost, A_ub=np.array(rows), b_ub=rhs, A_eq=a_eq, b_eq=np.ones(n), method="highs")
    assert res.status == 0
    return float(res.fun)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("normalize", [None, "symmetric"])
def test_methods_against_brute_force(seed, normalize):
    c = tiny_crf(seed, normalize=normalize, strength=3.0)
    best, _ = brute_force_minimum(c.model)
    for method in METHODS:
        res = c.map(method, iterations=60)
        assert res.stats["model_energy"] >= float(best) - 1e-9, method
        if normalize is None:  # model energy == reported energy
            assert res.energy == pytest.approx(res.stats["model_energy"], rel=1e-10)
    qp = c.map("qp", iterations=200)
    assert qp.stats["lower_bound"].item() <= float(best) + 1e-9
    assert lp_optimum(c.model) <= float(best) + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_monotone_objectives(seed):
    c = tiny_crf(seed, h=3, w=4, strength=4.0)
    qp = c.map("qp", iterations=50, tol=0.0)
    obj = qp.stats["objective"][0]
    assert torch.all(obj[1:] <= obj[:-1] + 1e-9 * obj.abs().max())
    dc = c.map("dc-neg", init="unary", iterations=30, tol=0.0)
    rel = dc.stats["relaxed_energy"][0]
    assert torch.all(rel[1:] <= rel[:-1] + 1e-9 * rel.abs().max())


@pytest.mark.parametrize("seed", range(3))
def test_proximal_lp_converges_to_lp_optimum(seed):
    c = tiny_crf(seed, strength=3.0)
    opt = lp_optimum(c.model)
    config = LPConfig(iterations=300, inner=3, levels=1000, tol=0.0)
    res = lp_proximal(c.model, None, config)
    y = res.q
    torch.testing.assert_close(y.sum(-1), torch.ones_like(y[..., 0]))
    assert float(y.min()) >= 0.0
    value = float(lp_energy_exact(c.model, y))
    assert value >= opt - 1e-7
    assert value <= opt + 2e-2 * abs(opt)


def test_best_labelling_is_kept():
    """Keeping the best rounding: the returned energy is never above the init's rounding."""
    c = tiny_crf(5, h=3, w=4, strength=5.0)
    mf = c.map("meanfield")
    for method in ("dc-neg", "lp"):
        res = c.map(method, init="meanfield", iterations=3)
        assert res.stats["model_energy"] <= mf.stats["model_energy"] + 1e-9


def test_mean_field_include_self_option():
    c = tiny_crf(1, strength=2.0)
    a = c.map("meanfield", include_self=True).stats["marginals"]
    b = c.map("meanfield", include_self=False).stats["marginals"]
    assert not np.allclose(a, b)
    assert np.allclose(a.sum(-1), 1.0) and np.allclose(b.sum(-1), 1.0)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (MeanFieldConfig, {"iterations": 0}),
        (DCNegConfig, {"tol": -1.0}),
        (LPConfig, {"levels": 1}),
        (LPConfig, {"lam": float("nan")}),
    ],
)
def test_configs_validate(cls, kwargs):
    with pytest.raises(ValueError):
        cls(**kwargs)


def test_lp_strictly_below_best_labelling_on_frustrated_triangle():
    """Three equally coupled pixels, allowed labels {0,1}, {1,2}, {0,2}: every labelling has two
    disagreeing pairs (energy 4K) while y = (1/2, 1/2) on the allowed labels costs 3K."""
    import crf

    img = np.full((1, 3, 3), 100, np.uint8)
    unary = np.full((1, 3, 3), 5.0, np.float32)
    for a, allowed in enumerate([(0, 1), (1, 2), (0, 2)]):
        unary[0, a, list(allowed)] = 0.0
    c = crf.DenseCRF(
        img,
        unary,
        w_smooth=0.0,
        w_appearance=1.0,
        sigma_xy=1000.0,
        sigma_rgb=10.0,
        normalize=None,
        filtering="exact",
        dtype=torch.float64,
    )
    best, _ = brute_force_minimum(c.model)
    opt = lp_optimum(c.model)
    assert opt < float(best) - 0.9
    res = lp_proximal(c.model, None, LPConfig(iterations=50, levels=1000, tol=0.0))
    assert float(lp_energy_exact(c.model, res.q)) == pytest.approx(opt, rel=1e-3)
    assert res.stats is not None and c.map("lp", init="unary").energy >= float(best) - 1e-9
