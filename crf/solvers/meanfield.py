"""Mean-field inference (Krahenbuhl and Koltun, NIPS 2011, Algorithm 1).

``Q <- softmax(-phi + K Q)`` per pixel, where ``K Q`` is the model's (possibly normalised)
kernel filtering of the current marginals: the Potts "same label is rewarded" form, equal to
``-phi - K (1 - Q)`` up to a per-pixel constant. The classic implementation (densecrf /
pydensecrf) filters *including* the pixel itself (``include_self=True``, the default, which
reproduces its outputs); ``include_self=False`` gives the exact mean-field update of the energy
over pairs ``a != b``. The first ``Q`` is ``softmax(-phi)`` unless an init is given.

One iteration is the pure :func:`step` (one filtering of the M label channels, then the fused
normalisation :func:`kernels.crf_updates.meanfield_normalise`); ``compile=True`` runs it
through ``torch.compile`` (:mod:`crf.compile`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from crf.compile import step_function
from crf.model import CRFModel
from crf.rounding import BestLabelling, argmax_labels
from crf.solvers.common import Budget, SolverResult, check_flags, check_positive, register
from kernels.crf_updates import meanfield_normalise, softmax_labels

__all__ = ["MeanFieldConfig", "mean_field", "softmax_labels", "step"]


@dataclass(frozen=True)
class MeanFieldConfig:
    """``iterations`` (5 is the classic), relative tolerance ``tol`` on ``max |Q' - Q|``
    (0 = run all iterations), optional ``seconds`` budget, ``track_best``: also round every
    iterate and keep the best labelling (one extra filtering per iteration); ``compile``:
    run the step through ``torch.compile`` (``DenseCRF.map`` resolves its ``compile="auto"``
    with ``cpu_compile_default``, measured by ``benchmarks/compile_bench.py``)."""

    cpu_compile_default: ClassVar[bool] = False

    iterations: int = 5
    include_self: bool = True
    tol: float = 0.0
    seconds: float | None = None
    check_every: int = 5
    track_best: bool = False
    compile: bool = False

    def __post_init__(self) -> None:
        check_positive(self, ("iterations", "check_every"))
        check_flags(self, ("compile",))
        check_positive(self, ("tol",), allow_zero=True)
        if self.seconds is not None:
            check_positive(self, ("seconds",))


def step(model: CRFModel, q: torch.Tensor, include_self: bool) -> torch.Tensor:
    """One parallel mean-field update of (B, N, M) marginals ``q``: ``softmax(K q - phi)``."""
    if model.uses_fused(q):  # eager CPU: K q - phi straight out of one sparse product
        x = model.filter(q, subtract=model.unary)
        if not include_self:
            x -= model.self_weight * q
        return softmax_labels(x)
    msg = model.filter(q)
    if not include_self:
        msg = msg - model.self_weight * q
    return meanfield_normalise(msg, model.unary)


def _blocked(model: CRFModel, q: torch.Tensor):
    """:func:`step` as the blocked, buffer-reusing updater of the fused CPU path (the same
    update; about a third faster on large images and batches), or None."""
    updater = model.fused_meanfield(q)
    if updater is None:
        return None
    return lambda model, q, include_self: updater(
        q, model.unary, None if include_self else model.self_weight
    )


@register("meanfield", MeanFieldConfig)
def mean_field(model: CRFModel, init: torch.Tensor | None, config: MeanFieldConfig) -> SolverResult:
    """Run mean-field from ``init`` (B, N, M) marginals or ``softmax(-phi)``."""
    budget = Budget(config.iterations, config.seconds, config.check_every)
    q = softmax_labels(-model.unary) if init is None else init
    best = BestLabelling(model) if config.track_best else None
    update = step_function(step, config.compile, budget.deadline())
    if not config.compile:
        update = _blocked(model, q) or update
    it, change = 0, float("nan")
    while not budget.exhausted(it):
        new = update(model, q, config.include_self)
        if config.tol > 0 and (it + 1) % config.check_every == 0:
            change = float((new - q).abs().max())
            if change <= config.tol:
                q, it = new, it + 1
                break
        q, it = new, it + 1
        if best is not None:
            best.update(q)
    seconds = budget.elapsed()
    labels = argmax_labels(q)
    if best is None:  # the classic output: the final argmax (its energy is computed by the caller)
        energy = torch.full(labels.shape[:1], float("nan"), dtype=torch.float64)
        return SolverResult(q, labels, energy, it, seconds, {"last_change": change})
    best.update_labels(labels)
    return SolverResult(q, best.labels, best.energy, it, seconds, {"last_change": change})
