"""DC relaxation "DC-neg" solved by CCCP (Desmaison et al., ECCV 2016, Sec. 5).

The multilinear relaxation ``E(y) = phi.y - y^T (K - diag K) y + C`` is split into the convex
``phi.y + sum_a c_a |y_a|^2`` with ``c_a = K_aa`` (``sum_m w_m`` for un-normalised kernels) and
the concave ``-y^T K y`` (K is a positive semidefinite Gaussian kernel, hence "neg"). A CCCP step
linearises the concave part at ``y_old`` -- **one filtering** ``g = phi - 2 K y_old`` -- and
solves ``min_{q in simplex} g.q + c_a |q|^2`` per pixel: the Euclidean projection of
``-g / (2 c_a)`` onto the simplex. The relaxed energy never increases (exact kernels).

One iteration is the pure :func:`dc_step` (CCCP update, then the filtering and relaxed energy of
the new iterate, which the next update reuses); ``compile=True`` runs it through
``torch.compile`` (:mod:`crf.compile`). The projection is
:func:`kernels.crf_updates.project_simplex`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from crf.compile import step_function
from crf.model import CRFModel
from crf.rounding import BestLabelling
from crf.solvers.common import Budget, SolverResult, check_flags, check_positive, register
from kernels.crf_updates import project_simplex

__all__ = ["DCNegConfig", "cccp_step", "dc_neg", "dc_step"]


@dataclass(frozen=True)
class DCNegConfig:
    """``iterations``; stop on a relative decrease of the relaxed energy below ``tol``
    (checked every ``check_every`` steps); round every ``round_every`` steps; ``compile``: run
    the step through ``torch.compile``."""

    cpu_compile_default: ClassVar[bool] = False

    iterations: int = 20
    tol: float = 1e-5
    seconds: float | None = None
    check_every: int = 2
    round_every: int = 1
    compile: bool = False

    def __post_init__(self) -> None:
        check_positive(self, ("iterations", "check_every", "round_every"))
        check_positive(self, ("tol",), allow_zero=True)
        check_flags(self, ("compile",))
        if self.seconds is not None:
            check_positive(self, ("seconds",))


def cccp_step(model: CRFModel, ky: torch.Tensor) -> torch.Tensor:
    """Closed-form CCCP update from ``K y`` (B, N, M), the filtering of the current y:
    ``proj(-g / (2 c))`` with ``g = phi - 2 K y``, i.e. ``proj((K y - phi / 2) / c)``."""
    v = torch.sub(ky, model.unary, alpha=0.5).div_(model.self_weight)
    return project_simplex(v, overwrite=True)


def _relaxed(
    model: CRFModel, y: torch.Tensor, ky: torch.Tensor, const: torch.Tensor
) -> torch.Tensor:
    """(B,) relaxed energy ``sum y (phi - K y + c y) + const`` from a precomputed ``K y`` (no
    extra filtering; one temporary, summed in float64)."""
    t = torch.sub(model.unary, ky).addcmul_(model.self_weight, y).mul_(y)
    return t.sum(2).double().sum(1) + const  # float32 over labels, float64 over pixels


def dc_step(
    model: CRFModel, ky: torch.Tensor, const: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One CCCP iteration from ``K y_old``: the new y (B, N, M), its filtering ``K y``
    (B, N, M) and its relaxed energy (B,) float64 (``const`` (B,): the energy's constant)."""
    y = cccp_step(model, ky)
    ky = model.filter(y)
    return y, ky, _relaxed(model, y, ky, const)


@register("dc-neg", DCNegConfig)
def dc_neg(model: CRFModel, init: torch.Tensor | None, config: DCNegConfig) -> SolverResult:
    """CCCP on DC-neg from ``init`` (B, N, M) or ``softmax(-phi)``."""
    budget = Budget(config.iterations, config.seconds, config.check_every)
    y = torch.softmax(-model.unary, -1) if init is None else init
    const = (model.row_sums - model.self_weight).double().sum((1, 2))
    best = BestLabelling(model)
    best.update(y)
    step = step_function(dc_step, config.compile, budget.deadline())
    ky = model.filter(y)
    energy = _relaxed(model, y, ky, const)  # energy of the current y, from the same filtering
    budget.step_s = budget.elapsed()  # the set-up (a rounding, a filtering): about one step
    history = []
    it, prev = 0, None
    while True:
        history.append(energy)
        if it > 0 and budget.exhausted(it):  # at least one CCCP step
            break
        check = prev is not None and it % config.check_every == 0
        if check and bool(((prev - energy) <= config.tol * energy.abs()).all()):
            break
        prev = energy
        y, ky, energy = step(model, ky, const)
        it += 1
        if it % config.round_every == 0:
            best.update(y)
    if it % config.round_every != 0:  # the last iterate, unless just rounded
        best.update(y)
    stats = {"relaxed_energy": torch.stack(history, 1)}
    return SolverResult(y, best.labels, best.energy, it, budget.elapsed(), stats)
