"""Public API: :class:`DenseCRF` and its ``map`` method (strings only at this boundary).

Energies (``MapResult.energy``, ``DenseCRF.energy``) always follow one convention: the integer
energy of the labelling, ordered pairs ``a != b``, **un-normalised** kernels
``w_s k_smooth + w_b k_appearance`` (see :mod:`crf.energy`), whatever ``normalize`` is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from crf.compile import CompileMode, check_mode, should_compile
from crf.energy import labelling_energy
from crf.errors import ConfigError
from crf.model import CRFModel, KernelParams, build_model
from crf.solvers import SOLVERS, SolverResult
from crf.validate import (
    as_budget,
    as_device,
    as_dtype,
    as_image,
    as_iterations,
    as_labels,
    as_marginals,
    as_unary,
)

__all__ = ["DEFAULT_INIT", "DenseCRF", "MapResult"]

DEFAULT_INIT = {"meanfield": "unary", "qp": "unary", "dc-neg": "meanfield", "lp": "dc-neg"}
INIT_SHARE = 0.8  # share of a seconds budget given to a chained init (the rest to the method)


@dataclass(frozen=True)
class MapResult:
    """``labels`` (H, W) or (B, H, W) int64; ``energy`` (float or (B,) array, the reported
    convention); ``stats``: seconds, iterations, model energy and method-specific entries."""

    labels: np.ndarray
    energy: float | np.ndarray
    stats: dict = field(default_factory=dict)


class DenseCRF:
    """Fully connected CRF over an RGB image with Potts Gaussian kernels.

    ``image``: (H, W, 3) uint8 or (B, H, W, 3); ``unary``: (H, W, M) or (B, H, W, M) float
    ``-log p``. Kernel normalisation ``"symmetric"`` (``D^-1/2 K D^-1/2``, the classic default)
    or None. ``filtering="exact"`` uses dense O(N^2) kernels (tiny images / tests). Bad input
    raises a :class:`crf.errors.CRFInputError` subclass naming the argument (and index).
    """

    def __init__(
        self,
        image,
        unary,
        *,
        w_smooth: float = 3.0,
        sigma_smooth: float = 3.0,
        w_appearance: float = 10.0,
        sigma_xy: float = 80.0,
        sigma_rgb: float = 13.0,
        normalize: str | None = "symmetric",
        filtering: str = "lattice",
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.params = KernelParams(w_smooth, sigma_smooth, w_appearance, sigma_xy, sigma_rgb)
        dev, dtype = as_device(device), as_dtype(dtype)
        img, self.batched = as_image(image)
        un = as_unary(unary, img.shape[:3], self.batched)
        self.normalize = normalize
        self.image = torch.from_numpy(img).to(dev)
        unary_t = torch.from_numpy(un).to(device=dev, dtype=dtype)
        self.model: CRFModel = build_model(
            self.image, unary_t, self.params, normalize=normalize, filtering=filtering
        )

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, H, W)."""
        return self.image.shape[0], self.model.height, self.model.width

    def energy(self, labels) -> float | np.ndarray:
        """Reported energy of an integer labelling (H, W) or (B, H, W)."""
        lab = torch.from_numpy(as_labels(labels, self.shape, self.model.n_labels, self.batched))
        e = labelling_energy(self.model, lab.to(self.model.unary.device), raw=True)
        return self._out(e.cpu().numpy())

    def _out_array(self, a: np.ndarray) -> np.ndarray:
        return a if self.batched else a[0]

    def _out(self, a: np.ndarray):
        return a if self.batched else (float(a[0]) if a.ndim == 1 else a[0])

    def map(
        self,
        method: str = "meanfield",
        *,
        iterations: int | None = None,
        budget: float | None = None,
        init=None,
        compile: CompileMode = "auto",
        **options,
    ) -> MapResult:
        """MAP labelling by ``method`` in {"meanfield", "qp", "dc-neg", "lp"}.

        ``iterations`` / ``budget`` (seconds, including the init's time) bound the run;
        ``init``: None (the method's default, the papers' pipelines: softmax(-phi) for
        meanfield / qp, mean-field -> dc-neg, mean-field -> dc-neg -> lp), "unary", a method
        name (run it first, with its own default init and 80 % of the budget), or marginals
        (H, W, M) / (B, H, W, M). ``compile``: run the solver steps through ``torch.compile``
        (True / False; "auto": on CUDA, and on CPU where measured faster, see
        :mod:`crf.compile`); it applies to a chained init too, and a first compile counts
        against the budget. ``options`` are fields of the method's config dataclass.
        """
        if not isinstance(method, str) or method not in SOLVERS:
            raise ConfigError(f"unknown method {method!r}; choose from {sorted(SOLVERS)}")
        check_mode(compile)
        iterations, budget = as_iterations(iterations), as_budget(budget)
        solve, config_cls = SOLVERS[method]
        config = self._config(config_cls, iterations, options)  # checked before any init runs
        start = time.perf_counter()
        q0, init_stats = self._init(method, init, budget, compile)
        if budget is not None:
            left = max(budget - (time.perf_counter() - start), 1e-3)
            config = replace(config, seconds=left)
        device = self.model.unary.device
        config = replace(
            config, compile=should_compile(compile, device, config.cpu_compile_default)
        )
        res = _keep_init_best(self.model, solve(self.model, q0, config), init_stats)
        seconds = time.perf_counter() - start  # solver (and init) time, not the reporting below
        reported = labelling_energy(self.model, res.labels, raw=True).cpu().numpy()
        b, h, w = self.shape
        stats = dict(res.stats)
        stats.update(
            seconds=seconds,
            iterations=res.iterations,
            model_energy=self._out(res.energy.cpu().numpy()),
            marginals=self._out_array(res.q.reshape(b, h, w, -1).cpu().numpy()),
            init=init_stats,
        )
        labels = res.labels.reshape(b, h, w).cpu().numpy()
        return MapResult(labels if self.batched else labels[0], self._out(reported), stats)

    def _config(self, config_cls, iterations: int | None, options: dict):
        """The method's config from ``options`` and ``iterations`` (its checks raise
        :class:`ConfigError`); the seconds budget is set once the init has run."""
        try:
            config = config_cls(**options)
        except TypeError as exc:
            raise ConfigError(f"{config_cls.__name__}: {exc}") from None
        if iterations is not None:
            config = replace(config, iterations=iterations)
        return config

    def _init(self, method: str, init, budget, compile) -> tuple[torch.Tensor | None, dict]:
        """Initial marginals (B, N, M) or None for softmax(-phi)."""
        if init is None:
            init = DEFAULT_INIT[method]
        if isinstance(init, str):
            if init == "unary":
                return None, {"method": "unary"}
            if init == method or init not in SOLVERS:
                raise ConfigError(f"init {init!r} for method {method!r} is not valid")
            share = None if budget is None else INIT_SHARE * budget
            res = self.map(init, budget=share, compile=compile)
            q = torch.from_numpy(res.stats["marginals"]).to(self.model.unary)
            q = q.reshape(self.model.unary.shape)
            labels = torch.from_numpy(res.labels).to(self.model.unary.device)
            info = {"method": init, "energy": res.energy, "seconds": res.stats["seconds"]}
            return q, {**info, "labels": labels.reshape(self.model.unary.shape[:2])}
        q = as_marginals(init, tuple(self.shape), self.model.n_labels, self.batched)
        q = torch.from_numpy(q).to(self.model.unary).reshape(self.model.unary.shape)
        return q / q.sum(-1, keepdim=True), {"method": "given"}


def _keep_init_best(model: CRFModel, res: SolverResult, init_stats: dict) -> SolverResult:
    """Fill in the model energy if the solver left it out (classic mean-field) and keep, per
    image, the chained init's best labelling when it beats the solver's (best seen overall)."""
    energy = res.energy
    if torch.isnan(energy).any():
        energy = labelling_energy(model, res.labels, raw=False)
    labels = res.labels
    prev = init_stats.pop("labels", None)
    if prev is not None:
        prev_energy = labelling_energy(model, prev, raw=False)
        better = prev_energy < energy
        labels = torch.where(better[:, None], prev, labels)
        energy = torch.where(better, prev_energy, energy)
    return replace(res, labels=labels, energy=energy)
