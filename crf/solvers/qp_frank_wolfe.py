"""Convex QP relaxation solved by Frank-Wolfe (Desmaison, Bunel, Kohli, Torr and Kumar,
"Efficient continuous relaxations for dense CRF", ECCV 2016, Sec. 4).

With ``Psi = -(K - diag K)`` (Potts, "same label rewarded") and ``d = K 1 + eps`` the problem

    min_y f(y) = (phi - d)^T y + y^T (Psi + D) y,   y_a in the simplex

is convex (``Psi + D`` is a graph Laplacian plus ``diag K``), equals ``E(y) - C`` at integral
``y`` (``C = sum_{a != b} K_ab``) and lower-bounds it elsewhere, so ``f(y) - gap + C`` is a
lower bound on the minimum energy (exact kernels). One iteration: conditional gradient
``s = onehot(argmin_i g_a:i)``, direction ``r = s - y``, **one filtering** ``P r = (Psi + D) r``,
closed-form optimal step ``alpha = clip(-g.r / (2 r.P r), 0, 1)``, then ``y += alpha r`` and the
gradient updated incrementally ``g += 2 alpha P r``. The direction and the convex combination
are the fused updates of :mod:`kernels.crf_updates`; the iteration is the pure :func:`fw_step`
(``compile=True`` runs it through ``torch.compile``, :mod:`crf.compile`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from crf.compile import step_function
from crf.model import CRFModel
from crf.rounding import BestLabelling
from crf.solvers.common import Budget, SolverResult, check_flags, check_positive, register
from kernels.crf_updates import frank_wolfe_direction, frank_wolfe_update

__all__ = ["QPConfig", "fw_step", "qp_frank_wolfe"]


@dataclass(frozen=True)
class QPConfig:
    """``iterations``; stop when the Frank-Wolfe gap <= ``tol * |f + C|`` (relative); ``eps``
    added to ``d`` (relative to its mean); round every ``round_every`` iterations;
    ``compile``: run the step through ``torch.compile``."""

    cpu_compile_default: ClassVar[bool] = False

    iterations: int = 100
    tol: float = 1e-4
    eps: float = 1e-4
    seconds: float | None = None
    check_every: int = 5
    round_every: int = 5
    compile: bool = False

    def __post_init__(self) -> None:
        check_positive(self, ("iterations", "check_every", "round_every"))
        check_positive(self, ("tol", "eps"), allow_zero=True)
        check_flags(self, ("compile",))
        if self.seconds is not None:
            check_positive(self, ("seconds",))


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image inner product (B, 1, 1) in float64."""
    return (a * b).double().sum((1, 2), keepdim=True)


def apply_p(model: CRFModel, r: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``(Psi + D) r = d r - (K r - diag(K) r)``: one filtering."""
    return d * r - (model.filter(r) - model.self_weight * r)


def fw_step(
    model: CRFModel, y: torch.Tensor, g: torch.Tensor, f: torch.Tensor, d: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Frank-Wolfe iteration on (B, N, M) ``y`` and gradient ``g``, (B, 1, 1) objective
    ``f`` and ``d`` (B, N, 1); returns (y, g, f, gap) with the closed-form optimal step."""
    r = frank_wolfe_direction(g, y)
    pr = apply_p(model, r, d)
    slope = _dot(g, r)  # <= 0
    curv = _dot(r, pr)
    alpha = torch.where(curv > 0, (-slope / (2 * curv.clamp_min(1e-300))), torch.ones_like(curv))
    alpha = alpha.clamp(0.0, 1.0)
    y, g = frank_wolfe_update(y, g, r, pr, alpha)
    f = f + alpha * slope + alpha**2 * curv
    return y, g, f, -slope


@register("qp", QPConfig)
def qp_frank_wolfe(model: CRFModel, init: torch.Tensor | None, config: QPConfig) -> SolverResult:
    """Minimise the convex QP from ``init`` (B, N, M) or ``softmax(-phi)``."""
    budget = Budget(config.iterations, config.seconds, config.check_every)
    y = torch.softmax(-model.unary, -1) if init is None else init.clone()
    d = model.row_sums
    d = d + config.eps * d.mean((1, 2), keepdim=True)
    const = (model.row_sums - model.self_weight).double().sum((1, 2), keepdim=True)
    py = apply_p(model, y, d)
    lin = model.unary - d
    f = _dot(lin, y) + _dot(y, py)
    g = lin + 2 * py
    best = BestLabelling(model)
    best.update(y)
    lower = torch.full_like(f, -float("inf"))
    it, gap = 0, torch.full_like(f, float("inf"))
    history = [f.flatten() + const.flatten()]
    step = step_function(fw_step, config.compile, budget.deadline())
    while not budget.exhausted(it):
        f_old = f
        y, g, f, gap = step(model, y, g, f, d)
        lower = torch.maximum(lower, f_old - gap + const)  # Frank-Wolfe duality gap at y_old
        history.append(f.flatten() + const.flatten())
        it += 1
        if it % config.round_every == 0:
            best.update(y)
        if it % config.check_every == 0 and bool((gap <= config.tol * (f + const).abs()).all()):
            break
    best.update(y)
    stats = {
        "qp_value": (f + const).flatten(),
        "lower_bound": lower.flatten(),
        "gap": gap.flatten(),
        "objective": torch.stack(history, 1),
    }
    return SolverResult(y, best.labels, best.energy, it, budget.elapsed(), stats)
