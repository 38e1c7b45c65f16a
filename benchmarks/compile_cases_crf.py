"""Dense-CRF cases of ``benchmarks/compile_bench.py``: the solver steps and the bare updates.

Instance: a synthetic photo-like RGB image (gradients, two flat regions, noise), 21 labels,
unaries ``-log softmax(3 onehot(truth) + N(0, 1.5^2))`` with a blocky "truth"; the default
model (symmetric normalisation, lattice filtering, float32). 256 x 256 pixels, 96 x 96 with
``quick``.

Solver steps (Krahenbuhl and Koltun 2011; Desmaison et al. ECCV 2016; Ajanthan et al. CVPR
2017), each with its filtering(s): ``crf.meanfield.step``, ``crf.qp.fw_step``,
``crf.dc_neg.dc_step``, ``crf.lp.dual_pass`` (H = 10 levels), ``crf.lp.primal_step``.
Bare updates (the filtering replaced by a diagonal, so the step is elementwise-dominated):
``crf.update.meanfield``, ``crf.update.frank_wolfe``, ``crf.update.cccp``.
"""

from __future__ import annotations

import numpy as np
import torch

import crf
from benchmarks.compile_case import Case
from crf.model import CRFModel
from crf.solvers.dc_neg import DCNegConfig, dc_step
from crf.solvers.lp_proximal import LPConfig, dual_pass, primal_step
from crf.solvers.meanfield import MeanFieldConfig
from crf.solvers.meanfield import step as meanfield_step
from crf.solvers.qp_frank_wolfe import QPConfig, apply_p, fw_step
from kernels.crf_updates import (
    frank_wolfe_direction,
    frank_wolfe_update,
    meanfield_normalise,
    project_simplex,
)

__all__ = ["cases", "instance", "instance_arrays", "solver_cases", "update_cases"]

LABELS = 21


def instance(h: int, w: int, m: int = LABELS, seed: int = 0, device: str = "cpu") -> CRFModel:
    """The benchmark model (see the module docstring) on an (h, w) image with m labels."""
    img, unary = instance_arrays(h, w, m, seed)
    return crf.DenseCRF(img, unary, device=device).model


def instance_arrays(
    h: int, w: int, m: int = LABELS, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark image (h, w, 3) uint8 and unaries (h, w, m) float32 (module docstring)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * xx / w, 255 * yy / h, 128 + 60 * np.sin(xx / 5)], -1)
    img[: h // 2, : w // 3] = (200, 30, 30)
    img[h // 2 :, 2 * w // 3 :] = (20, 40, 220)
    img = np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)
    truth = ((yy // max(h // 4, 1)) * 5 + xx // max(w // 5, 1)).astype(np.int64) % m
    logits = 3.0 * np.eye(m)[truth] + rng.normal(0, 1.5, (h, w, m))
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    return img, crf.unary_from_probs(prob)


def _meanfield(model: CRFModel) -> Case:
    def step(q):
        return meanfield_step(model, q, True)

    q = torch.softmax(-model.unary, -1)
    defaults = MeanFieldConfig()
    return Case("crf.meanfield.step", step, q, 5, defaults.cpu_compile_default, 5)


def _qp(model: CRFModel) -> Case:
    d = model.row_sums + QPConfig().eps * model.row_sums.mean((1, 2), keepdim=True)
    y = torch.softmax(-model.unary, -1)
    lin = model.unary - d
    py = apply_p(model, y, d)
    f = ((lin + py) * y).double().sum((1, 2), keepdim=True)

    def step(state):
        y, g, f = state
        y, g, f, _ = fw_step(model, y, g, f, d)
        return y, g, f

    return Case("crf.qp.fw_step", step, (y, lin + 2 * py, f), 5, QPConfig.cpu_compile_default, 100)


def _dc_neg(model: CRFModel) -> Case:
    const = (model.row_sums - model.self_weight).double().sum((1, 2))
    y = torch.softmax(-model.unary, -1)
    ky = model.filter(y)

    def step(state):
        return dc_step(model, state[1], const)

    state = (y, ky, const)
    return Case("crf.dc_neg.dc_step", step, state, 5, DCNegConfig.cpu_compile_default, 20)


def _lp(model: CRFModel) -> list[Case]:
    config = LPConfig()
    lam = config.lam / model.row_sums.mean((1, 2), keepdim=True)
    anchor = torch.softmax(-model.unary, -1)
    a_alpha = torch.zeros_like(anchor)

    def dual(state):
        return dual_pass(model, state[0], state[1], anchor, lam, config.levels)

    def primal(z):
        return primal_step(model, z, a_alpha + 0.1, lam)

    default = config.iterations * config.inner
    return [
        Case(
            "crf.lp.dual_pass",
            dual,
            (anchor.clone(), a_alpha),
            3,
            config.cpu_compile_default,
            default,
        ),
        Case("crf.lp.primal_step", primal, anchor, 5, config.cpu_compile_default, default),
    ]


def update_cases(model: CRFModel) -> list[Case]:
    """The solvers' per-pixel updates with the filtering replaced by a diagonal ``K = 2 I``."""
    unary = model.unary
    y0 = torch.softmax(-unary, -1)

    def meanfield(q):
        return meanfield_normalise(2.0 * q, unary)

    def frank_wolfe(state):
        y, g = state
        r = frank_wolfe_direction(g, y)
        pr = 2.0 * r
        slope = (g * r).double().sum((1, 2), keepdim=True)
        curv = (r * pr).double().sum((1, 2), keepdim=True)
        alpha = (-slope / (2 * curv.clamp_min(1e-300))).clamp(0.0, 1.0)
        return frank_wolfe_update(y, g, r, pr, alpha)

    def cccp(y):
        return project_simplex((4.0 * y - unary) / 4.0)

    return [
        Case("crf.update.meanfield", meanfield, y0, 10),
        Case("crf.update.frank_wolfe", frank_wolfe, (y0, unary + 4.0 * y0), 10),
        Case("crf.update.cccp", cccp, y0, 10),
    ]


def solver_cases(model: CRFModel) -> list[Case]:
    """The library's compiled steps: mean-field, Frank-Wolfe, CCCP, the LP's dual / primal."""
    return [_meanfield(model), _qp(model), _dc_neg(model), *_lp(model)]


def cases(quick: bool) -> list[Case]:
    """The CRF cases on a 96 x 96 (quick) or 256 x 256 image with 21 labels."""
    side = 96 if quick else 256
    model = instance(side, side)
    return [*solver_cases(model), *update_cases(model)]
