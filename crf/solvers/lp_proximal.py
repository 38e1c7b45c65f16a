"""LP relaxation of the dense CRF by a proximal method, "PROX-LP" (Ajanthan, Desmaison, Bunel,
Salzmann, Torr and Kumar, "Efficient linear programming for dense CRFs", CVPR 2017).

    E_LP(y) = phi.y + sum_{a != b} (K_ab / 2) |y_a - y_b|_1       (= E at integral y)

Outer loop (Sec. 4.1): ``y^{k+1} = argmin_y E_LP(y) + |y - yh^k|^2 / (2 lambda)`` over the
simplex product, with the accelerated anchor ``yh^k = P(y^k + k/(k+3) (y^k - y^{k-1}))``.
Inner loop (Sec. 4.2): block-coordinate descent on the dual, whose primal is
``y = yh + lambda (A alpha + B beta + gamma - phi)``. Only ``A alpha`` (B, N, M) is stored.

- (beta, gamma) block: minimised *exactly*; for fixed ``A alpha`` it is the partial dual of
  ``min_{y in simplex} <phi - A alpha, y> + |y - yh|^2 / (2 lambda)``, so the block optimum is
  ``y = proj_simplex(yh + lambda (A alpha - phi))`` (this replaces the paper's iterative
  non-negative-QP updates for gamma by their fixed point).
- alpha block: conditional gradient. The box-constrained linear minimiser gives
  ``(A s)_a:i = sum_b K_ab ([y_b:i > y_a:i] - [y_b:i < y_a:i])``, computed by the linear-time
  *modified filtering* (Sec. 4.3): values binned into H levels per label, cumulative splats,
  one blur of H x M channels, slicing at each pixel's level. Optimal step
  ``delta = clip(<A alpha - A s, y> / (lambda |A alpha - A s|^2), 0, 1)``.

Rounding by argmax after every outer step, keeping the best labelling (model energy).

With a seconds budget, an outer iteration is not started when it is predicted to end past
the budget (the first one is estimated from a rounding's time, see ``ITERATION_COST``).

Measured (issue 15; 21-label photos, one CPU thread, the model of ``benchmarks/crf_table.py``): one outer iteration on coffee (400 x 600) costs about 0.76 s,
some 17 filterings of the labels: the level filtering 68 % (mostly the blur of the
(H - 1) M = 189 level channels), the three projections 14 %, the rounding 9 %, the binning 5 %,
the alpha block 4 %. Fewer levels did not pay: from the same DC-neg solution, H = 4 made no
progress in 10 iterations where H = 10 gained 3.7 %, so H stays 10. The init stays DC-neg:
QP is worse at the same time (coffee: 30 QP steps 1.084e6 in 11.9 s; mean-field + 20 DC-neg
steps 1.007e6 in 5.1 s). And DC-neg itself used the time better: 20 more DC-neg steps (4.6 s)
reached 9.3 % below the 20-step solution, 10 PROX-LP steps (10 s) 3.7 %.

Pure steps, run through ``torch.compile`` with ``compile=True`` (:mod:`crf.compile`): the
accelerated anchor (:func:`anchor_step`, momentum as a 0-d tensor), the (beta, gamma) block from
the anchor (:func:`primal_step`) and one dual pass (:func:`dual_pass`); the clock is checked
between them. Compiled code always uses the dense level filtering.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from crf.compile import step_function
from crf.errors import ConfigError
from crf.model import CRFModel
from crf.rounding import BestLabelling
from crf.solvers.common import Budget, SolverResult, check_flags, check_positive, register
from kernels.crf_updates import project_simplex

__all__ = [
    "LPConfig",
    "anchor_step",
    "conditional_gradient",
    "dual_pass",
    "lp_proximal",
    "primal_step",
]


#: A-priori cost of the first outer iteration, in filterings of the labels (a rounding): the
#: measured cost is about ``ITERATION_COST + levels`` (two level filterings of H levels, three
#: projections, a rounding); with a seconds budget the solver does not start an iteration that
#: would end past it (see :class:`crf.solvers.common.Budget`).
ITERATION_COST = 2


@dataclass(frozen=True)
class LPConfig:
    """``iterations`` outer proximal steps of ``inner`` dual passes each; proximal weight
    ``lam`` (relative to ``1 / mean(K 1)``, so it is scale-free); ``levels`` H of the modified
    filtering; stop when ``|y^{k+1} - y^k| <= tol |y^k|``; ``mass_threshold``: restrict the LP
    to labels whose initial marginal exceeds it somewhere (0 keeps all labels); ``compile``:
    run the steps through ``torch.compile``."""

    cpu_compile_default: ClassVar[bool] = False

    iterations: int = 10
    inner: int = 1
    lam: float = 0.5
    levels: int = 10
    accelerate: bool = True
    tol: float = 1e-3
    seconds: float | None = None
    check_every: int = 2
    mass_threshold: float = 0.0
    compile: bool = False

    def __post_init__(self) -> None:
        check_positive(self, ("iterations", "inner", "lam", "levels", "check_every"))
        check_flags(self, ("compile",))
        check_positive(self, ("tol", "mass_threshold"), allow_zero=True)
        if self.levels < 2 or self.mass_threshold >= 1:
            raise ConfigError("LPConfig: need levels >= 2 and mass_threshold < 1")
        if self.seconds is not None:
            check_positive(self, ("seconds",))


def _levels(y: torch.Tensor, n_levels: int) -> torch.Tensor:
    """Quantise (B, N, M) values into H levels (int32) per image and label after an
    order-preserving rescaling to [0, 1] (the range of each label channel is stretched)."""
    if torch.compiler.is_compiling() or y.device.type != "cpu":
        low, high = y.amin(1, keepdim=True), y.amax(1, keepdim=True)
    else:  # reductions over pixels are ~50x faster on the label-major copy (CPU)
        t = y.transpose(1, 2).contiguous()
        low, high = t.amin(2).unsqueeze(1), t.amax(2).unsqueeze(1)
    scale = n_levels / (high - low).clamp_min(1e-12)
    return (y - low).mul_(scale).clamp_(0, n_levels - 1).to(torch.int32)  # int32: 30x faster


def conditional_gradient(model: CRFModel, y: torch.Tensor, n_levels: int) -> torch.Tensor:
    """``A s`` = sum_b K_ab ([y_b > y_a] - [y_b < y_a]) per label, by level filtering."""
    return model.row_sums - model.level_sums(_levels(y, n_levels), n_levels)


def dual_pass(
    model: CRFModel,
    y: torch.Tensor,
    a_alpha: torch.Tensor,
    anchor: torch.Tensor,
    lam: torch.Tensor,
    n_levels: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One alpha conditional-gradient step followed by the exact (beta, gamma) block.

    ``y``, ``a_alpha`` (= A alpha), ``anchor``: (B, N, M); ``lam`` (B, 1, 1). Returns the new
    primal y and A alpha. Needs ``model.row_sums`` evaluated beforehand (see CRFModel).
    """
    a_s = conditional_gradient(model, y, n_levels)
    diff = a_alpha - a_s
    num = (diff * y).double().sum((1, 2), keepdim=True)
    den = lam * diff.double().pow(2).sum((1, 2), keepdim=True)
    delta = (num / den.clamp_min(1e-300)).clamp(0.0, 1.0).to(y.dtype)
    a_alpha = a_alpha - delta * diff
    y = primal_step(model, anchor, a_alpha, lam)
    return y, a_alpha


def primal_step(
    model: CRFModel, anchor: torch.Tensor, a_alpha: torch.Tensor, lam: torch.Tensor
) -> torch.Tensor:
    """The (beta, gamma) block optimum ``proj_simplex(anchor + lam (A alpha - phi))``."""
    return project_simplex(anchor + lam * (a_alpha - model.unary))


def anchor_step(y: torch.Tensor, y_prev: torch.Tensor, mom: torch.Tensor) -> torch.Tensor:
    """Accelerated anchor ``proj_simplex(y + mom (y - y_prev))`` (``mom``: a 0-d tensor)."""
    return project_simplex(y + mom * (y - y_prev))


def _restrict(
    model: CRFModel, init: torch.Tensor, threshold: float
) -> tuple[CRFModel, torch.Tensor | None]:
    """Sub-model on the labels holding initial mass above ``threshold`` (None = all)."""
    if threshold <= 0:
        return model, None
    keep = (init.amax((0, 1)) > threshold).nonzero().flatten()
    if keep.numel() in (0, model.n_labels):
        return model, None
    return CRFModel(model.unary[..., keep], model.terms, (model.height, model.width)), keep


@register("lp", LPConfig)
def lp_proximal(model: CRFModel, init: torch.Tensor | None, config: LPConfig) -> SolverResult:
    """PROX-LP from ``init`` (B, N, M) marginals or ``softmax(-phi)``."""
    start = time.perf_counter()
    y0 = torch.softmax(-model.unary, -1) if init is None else init
    full, (model, keep) = model, _restrict(model, y0, config.mass_threshold)
    y = y0 if keep is None else project_simplex(y0[..., keep])
    lam = config.lam / model.row_sums.mean((1, 2), keepdim=True)
    best = BestLabelling(model)
    rounding = time.perf_counter()
    best.update(y)  # one filtering of the labels: the unit of the first iteration's estimate
    first = (time.perf_counter() - rounding) * (ITERATION_COST + config.levels) * config.inner
    budget = Budget(config.iterations, config.seconds, config.check_every, first_step_s=first)
    budget.start = start
    a_alpha = torch.zeros_like(y)
    anchor_fn, primal_fn, dual_fn = (
        step_function(fn, config.compile, budget.deadline())
        for fn in (anchor_step, primal_step, dual_pass)
    )
    y_prev, it, change = y, 0, float("nan")
    while not budget.exhausted(it):
        mom = it / (it + 3.0) if config.accelerate else 0.0
        if mom > 0:
            anchor = anchor_fn(y, y_prev, torch.tensor(mom, dtype=y.dtype, device=y.device))
        else:
            anchor = y
        z = primal_fn(model, anchor, a_alpha, lam)
        for _ in range(config.inner):
            z, a_alpha = dual_fn(model, z, a_alpha, anchor, lam, config.levels)
            if budget.out_of_time():  # a pass costs ~H filterings: check the clock after each
                break
        y_prev, y = y, z
        it += 1
        best.update(y)
        if config.tol > 0 and it % config.check_every == 0:
            change = float((y - y_prev).norm() / y_prev.norm())
            if change <= config.tol:
                break
    return _finish(full, keep, y, best, it, budget.elapsed(), change)


def _finish(
    full: CRFModel,
    keep: torch.Tensor | None,
    y: torch.Tensor,
    best: BestLabelling,
    it: int,
    seconds: float,
    change: float,
) -> SolverResult:
    """Map a restricted solution back to all labels and package the result."""
    labels, q = best.labels, y
    if keep is not None:
        labels = keep[labels]
        q = torch.zeros(*y.shape[:2], full.n_labels, dtype=y.dtype, device=y.device)
        q[..., keep] = y
    stats = {"last_change": change, "labels_used": None if keep is None else keep.tolist()}
    return SolverResult(q, labels, best.energy, it, seconds, stats)
