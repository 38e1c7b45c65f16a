"""The dense-CRF model as tensors: unaries and weighted Gaussian (Potts) kernels.

Energy (Krahenbuhl and Koltun 2011, Eq. 1-3), over ordered pairs ``a != b``:

    E(x) = sum_a phi_a(x_a) + sum_{a != b} K_ab [x_a != x_b],
    K_ab = w_s exp(-|dp|^2 / 2 sigma_gamma^2) + w_b exp(-|dp|^2 / 2 sigma_alpha^2 - |dI|^2 / 2 sigma_beta^2)

Layout: pixels first, labels last: ``unary`` is (B, N, M) with N = H * W (row-major). With
``normalize="symmetric"`` the model's kernels are ``D^-1/2 k D^-1/2`` per kernel, with
``D = diag(k 1)`` (the pixel included), exactly as pydensecrf's NORMALIZE_SYMMETRIC; the solvers
minimise the model's energy, and :mod:`crf.energy` reports energies with the *un-normalised*
kernels (``raw``) unless told otherwise.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import cached_property

import torch

from crf.errors import ConfigError, CRFInputError
from crf.fused import REUSE_BYTES, FusedFilter, FusedMeanField
from crf.pairwise import ExactKernel, LatticeKernel
from kernels import backend

__all__ = [
    "MAX_EXACT_ENTRIES",
    "MIN_SIGMA",
    "CRFModel",
    "KernelParams",
    "KernelTerm",
    "build_model",
]

#: Smallest accepted bandwidth (pixels for sigma_smooth / sigma_xy, 0-255 levels for
#: sigma_rgb). Positions and intensities are integers, so for a != b a kernel factor is at most
#: exp(-1 / (2 sigma^2)), which is exactly 0.0 in float64 once sigma < 0.0259: every smaller
#: sigma gives the same kernel, and 1e-3 leaves a wide margin. Sigmas above it whose lattice
#: would still be too large for its 64-bit keys (big image, several tiny sigmas) raise a
#: :class:`ConfigError` naming them when the model is built.
MIN_SIGMA = 1e-3

#: Most entries (batch x pixels x pixels) of the dense kernel of ``filtering="exact"``
#: (2**24 float64 = 128 MiB per kernel, e.g. one 64 x 64 image): beyond, use the lattice.
MAX_EXACT_ENTRIES = 1 << 24


@dataclass(frozen=True)
class KernelParams:
    """Potts kernel weights and bandwidths (pixels, 0-255 intensities)."""

    w_smooth: float = 3.0
    sigma_smooth: float = 3.0
    w_appearance: float = 10.0
    sigma_xy: float = 80.0
    sigma_rgb: float = 13.0

    def __post_init__(self) -> None:
        for name in ("w_smooth", "w_appearance", "sigma_smooth", "sigma_xy", "sigma_rgb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ConfigError(f"KernelParams.{name} must be a number, got {v!r}")
        for name in ("w_smooth", "w_appearance"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"KernelParams.{name} must be finite and >= 0, got {v}")
        for name in ("sigma_smooth", "sigma_xy", "sigma_rgb"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v >= MIN_SIGMA):
                raise ConfigError(
                    f"KernelParams.{name} must be finite and >= MIN_SIGMA = {MIN_SIGMA}, got {v} "
                    f"(below 0.0259 the kernel no longer changes: exp(-1 / (2 {name}^2)) is 0)"
                )


@dataclass(frozen=True)
class KernelTerm:
    """One weighted kernel ``w * n_a k(a, b) n_b`` (``norm`` = n, (B, N, 1), or None)."""

    weight: float
    kernel: ExactKernel | LatticeKernel
    norm: torch.Tensor | None


class CRFModel:
    """Unaries (B, N, M) and kernel terms; all filterings are (B, N, C) -> (B, N, C).

    ``self_weight`` (B, N, 1) is computed on construction; ``row_sums`` / ``raw_row_sums``
    (one filtering each) on first use: read them before calling a compiled step that uses them
    (Dynamo cannot trace the first evaluation of a ``cached_property`` on Python 3.11).
    """

    def __init__(
        self, unary: torch.Tensor, terms: tuple[KernelTerm, ...], hw: tuple[int, int]
    ) -> None:
        self.unary = unary
        self.terms = terms
        self.height, self.width = hw
        self.self_weight = self._self_weight()

    @property
    def n_labels(self) -> int:
        return self.unary.shape[-1]

    def uses_fused(self, v: torch.Tensor) -> bool:
        """Whether filtering ``v`` takes the fused path (:mod:`crf.fused`): eager, lattice
        kernels, CSR matrices (no Triton)."""
        if not self.terms or torch.compiler.is_compiling() or backend.use_triton(v):
            return False
        return all(isinstance(t.kernel, LatticeKernel) for t in self.terms)

    @cached_property
    def _fused(self) -> FusedFilter:
        terms = self.terms
        return FusedFilter(
            [t.kernel.lattice for t in terms], [t.weight for t in terms], [t.norm for t in terms]
        )

    @cached_property
    def _fused_raw(self) -> FusedFilter:
        if all(t.norm is None for t in self.terms):
            return self._fused
        terms = self.terms
        return FusedFilter(
            [t.kernel.lattice for t in terms], [t.weight for t in terms], [None] * len(terms)
        )

    def fused_meanfield(self, like: torch.Tensor) -> FusedMeanField | None:
        """A blocked mean-field updater on the fused CPU path (:class:`crf.fused.
        FusedMeanField`) for marginals like ``like`` too large for the allocator to reuse
        (:data:`crf.fused.REUSE_BYTES`), or None (then the plain step is as fast)."""
        if not self.uses_fused(like) or like.device.type != "cpu" or like.shape[-1] <= 8:
            return None
        if like.numel() * like.element_size() <= REUSE_BYTES:
            return None
        if not FusedMeanField.available():
            return None
        return FusedMeanField(self._fused, like)

    def filter(
        self, v: torch.Tensor, subtract: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Model kernel ``sum_m w_m n_m k_m (n_m v)``, the pixel itself included (minus
        ``subtract`` (B, N, C) when given), into ``out`` (contiguous, v's shape) if given."""
        if self.uses_fused(v):
            return self._fused(v, subtract, out)
        res = None
        for t in self.terms:
            f = t.kernel.filter(v) if t.norm is None else t.norm * t.kernel.filter(t.norm * v)
            res = f.mul_(t.weight) if res is None else res.add_(f, alpha=t.weight)
        res = torch.zeros_like(v) if res is None else res
        res = res if subtract is None else res - subtract
        return res if out is None else out.copy_(res)

    def filter_raw(self, v: torch.Tensor) -> torch.Tensor:
        """Un-normalised kernel ``sum_m w_m k_m v`` (used for reported energies)."""
        if self.uses_fused(v):
            return self._fused_raw(v)
        out = torch.zeros_like(v)
        for t in self.terms:
            out.add_(t.kernel.filter(v), alpha=t.weight)
        return out

    def _self_weight(self) -> torch.Tensor:
        """(B, N, 1) diagonal ``K_aa`` of the model kernel (exact value: ``sum_m w_m n_m(a)^2``);
        computed once in ``__init__`` (a plain attribute, so compiled steps can read it)."""
        out = torch.zeros_like(self.unary[..., :1])
        for t in self.terms:
            out = out + (t.weight if t.norm is None else t.weight * t.norm**2)
        return out

    @cached_property
    def row_sums(self) -> torch.Tensor:
        """(B, N, 1) ``sum_b K_ab`` of the model kernel (pixel included)."""
        return self.filter(torch.ones_like(self.unary[..., :1]))

    @cached_property
    def raw_row_sums(self) -> torch.Tensor:
        """(B, N, 1) ``sum_b K_ab`` of the un-normalised kernel (pixel included)."""
        return self.filter_raw(torch.ones_like(self.unary[..., :1]))

    def level_sums(self, levels: torch.Tensor, n_levels: int) -> torch.Tensor:
        """Model-kernel two-sided level sums ``sum_b K_ab ([lev_b <= lev_a] + [lev_b < lev_a])``."""
        out = torch.zeros(levels.shape, dtype=self.unary.dtype, device=levels.device)
        ones = torch.ones_like(self.unary[..., :1])
        for t in self.terms:
            n = ones if t.norm is None else t.norm
            out = out + t.weight * n * t.kernel.level_sums(levels, n, n_levels)
        return out


def _features(image: torch.Tensor, params: KernelParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, N, 2) smoothness and (B, N, 5) appearance features ``(x, y[, r, g, b]) / sigma``."""
    b, h, w, _ = image.shape
    yy, xx = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=image.device),
        torch.arange(w, dtype=torch.float64, device=image.device),
        indexing="ij",
    )
    pos = torch.stack([xx, yy], -1).reshape(1, h * w, 2).expand(b, -1, -1)
    rgb = image.reshape(b, h * w, 3).to(torch.float64)
    smooth = pos / params.sigma_smooth
    appear = torch.cat([pos / params.sigma_xy, rgb / params.sigma_rgb], -1)
    return smooth, appear


def _check_weights(params: KernelParams, n_points: int, dtype: torch.dtype) -> None:
    """Each weighted kernel's pairwise energy per image (at most ``w * P^2`` for P pixels, kernel
    entries <= 1) must stay finite in ``dtype``."""
    top = torch.finfo(dtype).max
    for name in ("w_smooth", "w_appearance"):
        v = float(getattr(params, name))
        if v * float(n_points) ** 2 >= top:
            raise ConfigError(
                f"{name} = {v} is too large for {n_points} pixels in {dtype}: the pairwise "
                f"energy (up to {name} * pixels^2) would overflow"
            )


def build_model(
    image: torch.Tensor,
    unary: torch.Tensor,
    params: KernelParams,
    *,
    normalize: str | None,
    filtering: str = "lattice",
) -> CRFModel:
    """Build the model from a (B, H, W, 3) image and (B, H, W, M) unaries (already validated).

    ``filtering``: ``"lattice"`` (permutohedral, approximate, O(N)) or ``"exact"`` (dense O(N^2),
    tiny instances only). Kernels with zero weight are dropped.
    """
    if normalize not in (None, "symmetric"):
        raise ConfigError(f"normalize must be 'symmetric' or None, got {normalize!r}")
    if filtering not in ("lattice", "exact"):
        raise ConfigError(f"filtering must be 'lattice' or 'exact', got {filtering!r}")
    b, h, w, m = unary.shape
    dtype = unary.dtype
    if filtering == "exact" and b * (h * w) ** 2 > MAX_EXACT_ENTRIES:
        raise ConfigError(
            f"filtering='exact' needs a dense {b} x {h * w} x {h * w} kernel, more than "
            f"MAX_EXACT_ENTRIES = {MAX_EXACT_ENTRIES} entries; use filtering='lattice'"
        )
    _check_weights(params, h * w, dtype)
    cls = LatticeKernel if filtering == "lattice" else ExactKernel
    smooth, appear = _features(image, params)
    terms = []
    named = (
        (params.w_smooth, smooth, f"sigma_smooth={params.sigma_smooth}"),
        (params.w_appearance, appear, f"sigma_xy={params.sigma_xy}, sigma_rgb={params.sigma_rgb}"),
    )
    for weight, feats, sigmas in named:
        if weight == 0:
            continue
        try:
            kernel = cls(feats, dtype)
        except CRFInputError as exc:
            raise ConfigError(f"the kernel with {sigmas} on a {h} x {w} image: {exc}") from None
        norm = None
        if normalize == "symmetric":
            ones = torch.ones(b, h * w, 1, dtype=dtype, device=unary.device)
            norm = 1.0 / torch.sqrt(kernel.filter(ones) + 1e-20)
        terms.append(KernelTerm(float(weight), kernel, norm))
    return CRFModel(unary.reshape(b, h * w, m), tuple(terms), (h, w))
