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
from crf.errors import ConfigError, InvalidValueError
from crf.model import CRFModel, KernelParams, build_model
from crf.solvers import SOLVERS, SolverResult
from crf.unary import unary_from_probs
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
from crf.validate_tensor import image_tensor, probs_tensor_to_unary, unary_tensor

__all__ = ["DEFAULT_INIT", "DenseCRF", "MapResult"]

DEFAULT_INIT = {"meanfield": "unary", "qp": "unary", "dc-neg": "meanfield", "lp": "dc-neg"}
INIT_SHARE = 0.8  # share of a seconds budget given to a chained init (the rest to the method)


@dataclass(frozen=True)
class MapResult:
    """``labels`` (H, W) or (B, H, W) int64 (a numpy array, or a tensor on the model's device
    for tensor inputs); ``energy`` (float or (B,) array, the reported convention; None with
    ``energy=False``); ``stats``: seconds, iterations, marginals, model energy and
    method-specific entries."""

    labels: np.ndarray | torch.Tensor
    energy: float | np.ndarray | None
    stats: dict = field(default_factory=dict)


class DenseCRF:
    """Fully connected CRF over RGB images with Potts Gaussian kernels.

    The pairwise term is ``w_smooth k_smooth + w_appearance k_appearance`` (Gaussian kernels on
    positions, and on positions and colours), filtered on the permutohedral lattice. numpy
    arrays or torch tensors on any device: with tensors the model lives on their device (unless
    ``device`` is given), inputs are checked there, and results (labels, marginals) come back
    as tensors on it. A batch is one lattice per kernel over all its images, filtered in one
    pass. Inputs are checked before any work.

    Args:
        image: ``(H, W, 3)`` uint8, or a batch ``(B, H, W, 3)``.
        unary: ``(H, W, M)`` / ``(B, H, W, M)`` float ``-log p`` (give this or ``probs``).
        probs: the same shape: class probabilities, e.g. a segmentation network's softmax
            (``phi = -log max(p, 1e-5)``).
        w_smooth: the smoothness kernel's weight.
        sigma_smooth: its width in pixels.
        w_appearance: the appearance kernel's weight.
        sigma_xy: its width in pixels.
        sigma_rgb: its width in colour (0-255 per channel).
        normalize: ``"symmetric"`` (``D^-1/2 K D^-1/2``, the classic default) or None.
        filtering: ``"lattice"``, or ``"exact"`` for dense O(N^2) kernels (tiny images, tests).
        device: the model's device (default: the tensors', else the CPU).
        dtype: the model's float dtype.

    Raises:
        ShapeMismatchError: an image or unary of the wrong rank or shape (``crf.errors``).
        InvalidValueError: a non-uint8 image, NaN/Inf or negative probabilities (the index
            named), or both or neither of ``unary`` and ``probs``.
        TooManyLabelsError: more labels than ``crf.MAX_LABELS``.
        ConfigError: kernel parameters that are not finite and >= 0, or an unknown device.
    """

    def __init__(
        self,
        image: object,
        unary: object = None,
        *,
        probs: object = None,
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
        if (unary is None) == (probs is None):
            raise InvalidValueError(
                "DenseCRF: give exactly one of unary= (-log p) and probs= (probabilities)"
            )
        tensors = [x for x in (image, unary, probs) if isinstance(x, torch.Tensor)]
        self.tensor_io = bool(tensors)
        if device is None and tensors:
            device = tensors[0].device
        dev, dtype = as_device(device), as_dtype(dtype)
        self.image, self.batched, unary_t = _inputs(image, unary, probs, dev, dtype)
        self.normalize = normalize
        self.model: CRFModel = build_model(
            self.image, unary_t, self.params, normalize=normalize, filtering=filtering
        )

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, H, W)."""
        return self.image.shape[0], self.model.height, self.model.width

    def energy(self, labels: object) -> float | np.ndarray:
        """Reported energy of an integer labelling (the convention of ``crf.energy``).

        Args:
            labels: ``(H, W)`` or ``(B, H, W)`` integer labels in ``[0, M)`` (array or tensor).

        Returns:
            A float, or ``(B,)`` array for a batch.

        Raises:
            ShapeMismatchError: labels of another shape than the model's images.
            InvalidValueError: labels that are not integers in ``[0, M)``.
        """
        lab = torch.from_numpy(as_labels(labels, self.shape, self.model.n_labels, self.batched))
        e = labelling_energy(self.model, lab.to(self.model.unary.device), raw=True)
        return self._out(e.cpu().numpy())

    def _out_array(self, a: torch.Tensor):
        """A (B, ...) result tensor as returned: a tensor on the device with tensor inputs,
        else a numpy array; without the batch axis for unbatched inputs."""
        a = a if self.batched else a[0]
        return a if self.tensor_io else a.cpu().numpy()

    def _out(self, a: np.ndarray):
        return a if self.batched else (float(a[0]) if a.ndim == 1 else a[0])

    def map(
        self,
        method: str = "meanfield",
        *,
        iterations: int | None = None,
        budget: float | None = None,
        init: object = None,
        compile: CompileMode = "auto",
        energy: bool = True,
        **options: object,
    ) -> MapResult:
        """MAP labelling by ``method``: "meanfield", "qp", "dc-neg" or "lp".

        Args:
            method: the solver ("meanfield": post-processing; "dc-neg": a lower energy; "lp":
                the LP relaxation; "qp": its Frank-Wolfe lower bound).
            iterations: the method's iterations (default: its config's).
            budget: seconds, including the init's time.
            init: None (the method's default, the papers' pipelines: softmax(-phi) for
                meanfield / qp, mean-field -> dc-neg, mean-field -> dc-neg -> lp), "unary", a
                method name (run it first, with its own default init and 80 % of the budget),
                or marginals ``(H, W, M)`` / ``(B, H, W, M)``.
            compile: run the solver steps through ``torch.compile`` (True / False; "auto": on
                CUDA, and on CPU where measured faster, see ``crf.compile``); it applies to a
                chained init too, and a first compile counts against the budget.
            energy: False skips the reported energy (``MapResult.energy`` is then None;
                mean-field then costs exactly its iterations: post-processing use).
            **options: fields of the method's config dataclass.

        Returns:
            ``MapResult(labels, energy, stats)``: ``labels`` ``(H, W)`` or ``(B, H, W)``
            int64 (a tensor on the model's device for tensor inputs), ``energy`` a float or
            ``(B,)`` array, ``stats`` seconds, iterations, marginals ``(..., M)`` and
            method-specific entries.

        Raises:
            ConfigError: an unknown method, option or init, iterations that are not a whole
                number >= 1, a budget that is not a finite number > 0.
            ShapeMismatchError: init marginals of another shape.
            InvalidValueError: negative init marginals, or marginals summing to 0 (the pixel
                named).
        """
        if not isinstance(method, str) or method not in SOLVERS:
            raise ConfigError(f"unknown method {method!r}; choose from {sorted(SOLVERS)}")
        check_mode(compile)
        if not isinstance(energy, bool):
            raise ConfigError(f"energy must be True or False, got {energy!r}")
        iterations, budget = as_iterations(iterations), as_budget(budget)
        config = self._config(SOLVERS[method][1], iterations, options)  # before any init runs
        res, init_stats, seconds = self._run(method, config, budget, init, compile, energy)
        b, h, w = self.shape
        stats = dict(res.stats)
        stats.update(
            seconds=seconds,
            iterations=res.iterations,
            marginals=self._out_array(res.q.reshape(b, h, w, -1)),
            init=init_stats,
        )
        init_labels = init_stats.pop("labels", None)
        reported = None
        if energy:  # after the timing: the reported convention (un-normalised kernels)
            reported = self._out(labelling_energy(self.model, res.labels, raw=True).cpu().numpy())
            stats["model_energy"] = self._out(res.energy.cpu().numpy())
            if init_labels is not None:
                e = labelling_energy(self.model, init_labels, raw=True).cpu().numpy()
                init_stats["energy"] = self._out(e)
        return MapResult(self._out_array(res.labels.reshape(b, h, w)), reported, stats)

    def _run(
        self, method: str, config, budget, init, compile, energy: bool
    ) -> tuple[SolverResult, dict, float]:
        """Run ``method`` after its init: the solver result (model energies, the init's
        labelling kept where better), the init's stats and the seconds taken."""
        start = time.perf_counter()
        q0, init_stats = self._init(method, init, budget, compile)
        if budget is not None:
            left = max(budget - (time.perf_counter() - start), 1e-3)
            config = replace(config, seconds=left)
        device = self.model.unary.device
        config = replace(
            config, compile=should_compile(compile, device, config.cpu_compile_default)
        )
        res = SOLVERS[method][0](self.model, q0, config)
        res = _keep_init_best(self.model, res, init_stats, energy)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return res, init_stats, time.perf_counter() - start

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
        model = self.model
        if isinstance(init, str):
            if init == "unary":
                return None, {"method": "unary"}
            if init == method or init not in SOLVERS:
                raise ConfigError(f"init {init!r} for method {method!r} is not valid")
            share = None if budget is None else INIT_SHARE * budget
            config = self._config(SOLVERS[init][1], None, {})
            res, sub_stats, seconds = self._run(init, config, share, None, compile, True)
            sub_stats.pop("labels", None)
            info = {"method": init, "seconds": seconds, "init": sub_stats}
            return res.q, {**info, "labels": res.labels, "model_energy": res.energy}
        q = as_marginals(init, tuple(self.shape), model.n_labels, self.batched)
        q = torch.from_numpy(q).to(model.unary).reshape(model.unary.shape)
        return q / q.sum(-1, keepdim=True), {"method": "given"}


def _inputs(image, unary, probs, dev: torch.device, dtype: torch.dtype):
    """(B, H, W, 3) uint8 image and (B, H, W, M) unaries on ``dev``, and whether batched:
    tensors are checked on their device (:mod:`crf.validate_tensor`), arrays with numpy."""
    if isinstance(image, torch.Tensor):
        img, batched = image_tensor(image, dev)
    else:
        arr, batched = as_image(image)
        img = torch.from_numpy(arr).to(dev)
    bhw = tuple(img.shape[:3])
    if isinstance(probs, torch.Tensor):
        return img, batched, probs_tensor_to_unary(probs, bhw, batched, dtype, dev)
    if isinstance(unary, torch.Tensor):
        return img, batched, unary_tensor(unary, bhw, batched, dtype, dev)
    if probs is not None:
        p = as_unary(probs, bhw, batched, name="probs")  # shape / finiteness checks
        unary = unary_from_probs(p if batched else p[0])
    un = as_unary(unary, bhw, batched)
    return img, batched, torch.from_numpy(un).to(device=dev, dtype=dtype)


def _keep_init_best(
    model: CRFModel, res: SolverResult, init_stats: dict, energy: bool = True
) -> SolverResult:
    """Fill in the model energy if the solver left it out (classic mean-field) and keep, per
    image, the chained init's best labelling (``init_stats`` "labels" and their
    "model_energy", which is removed) when it beats the solver's (best seen overall).
    Without ``energy`` and without an init labelling, nothing is computed."""
    prev = init_stats.get("labels")
    prev_energy = init_stats.pop("model_energy", None)
    if prev is None and not energy:
        return res
    energy_t = res.energy
    if torch.isnan(energy_t).any():
        energy_t = labelling_energy(model, res.labels, raw=False)
    labels = res.labels
    if prev is not None:
        better = prev_energy < energy_t
        labels = torch.where(better[:, None], prev, labels)
        energy_t = torch.where(better, prev_energy, energy_t)
    return replace(res, labels=labels, energy=energy_t)
