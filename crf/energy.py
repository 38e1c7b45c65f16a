"""Energies of the dense CRF: of labellings (the one reported convention) and of relaxations.

**Reported convention.** ``E(x) = sum_a phi_a(x_a) + sum_{a != b} K_ab [x_a != x_b]``: the
integer (argmax) labelling, ordered pairs (each unordered pair counts twice) and *un-normalised*
kernels ``K = w_s k_s + w_b k_b`` whatever the model's normalisation option. It is computed with
one filtering as ``sum_a phi_a(x_a) + sum_a [(K 1)_a - (K X)_{a, x_a}]`` (X the one-hot
labelling); the pixel's own term cancels exactly. With lattice filtering the pairwise part
carries the lattice's approximation error; ``filtering="exact"`` gives the exact value.

Relaxed energies (y: (B, N, M), each pixel on the simplex), for the model's kernel K:
- ``relaxed_energy``: the multilinear extension ``phi.y + sum_{a != b} K_ab (1 - y_a . y_b)``
  (Desmaison et al., ECCV 2016, Eq. 4 up to the constant), equal to E at integral y.
- ``lp_energy_exact``: ``phi.y + sum_{a != b} (K_ab / 2) |y_a - y_b|_1`` (Ajanthan et al.,
  CVPR 2017, Eq. 3); dense, exact kernels only.
"""

from __future__ import annotations

import itertools

import torch

from crf.errors import ShapeMismatchError
from crf.model import CRFModel
from crf.pairwise import ExactKernel

__all__ = [
    "brute_force_minimum",
    "labelling_energy",
    "lp_energy_exact",
    "relaxed_energy",
]


def labelling_energy(model: CRFModel, labels: torch.Tensor, *, raw: bool = True) -> torch.Tensor:
    """(B,) float64 energies of (B, N) integer labellings; ``raw``: un-normalised kernels."""
    b, n = model.unary.shape[:2]
    if labels.shape != (b, n):
        raise ShapeMismatchError(f"labelling_energy: labels {tuple(labels.shape)} != {(b, n)}")
    lab = labels.long()[..., None]
    onehot = torch.zeros_like(model.unary).scatter_(2, lab, 1.0)
    filt = model.filter_raw if raw else model.filter
    sums = model.raw_row_sums if raw else model.row_sums
    same = torch.gather(filt(onehot), 2, lab).squeeze(-1).double()  # (K X)_{a, x_a}
    unary = torch.gather(model.unary, 2, lab).squeeze(-1).double()
    return unary.sum(1) + (sums.squeeze(-1).double() - same).sum(1)


def relaxed_energy(model: CRFModel, y: torch.Tensor) -> torch.Tensor:
    """(B,) multilinear relaxation ``phi.y + sum_{a != b} K_ab (1 - y_a . y_b)`` (model K)."""
    ky = model.filter(y) - model.self_weight * y
    const = (model.row_sums - model.self_weight).double().sum((1, 2))
    return (model.unary * y).double().sum((1, 2)) - (y * ky).double().sum((1, 2)) + const


def _dense_kernel(model: CRFModel) -> torch.Tensor:
    """(B, N, N) model kernel matrix without its diagonal (exact kernels only)."""
    mats = []
    for t in model.terms:
        if not isinstance(t.kernel, ExactKernel):
            raise TypeError("dense kernel needs filtering='exact'")
        k = t.kernel.matrix.double()
        if t.norm is not None:
            n = t.norm.double()
            k = n * k * n.transpose(1, 2)
        mats.append(t.weight * k)
    k = sum(mats)
    eye = torch.eye(k.shape[-1], dtype=torch.bool, device=k.device)
    return k.masked_fill(eye, 0.0)


def lp_energy_exact(model: CRFModel, y: torch.Tensor) -> torch.Tensor:
    """(B,) LP relaxation energy with the exact dense model kernel (tiny instances only)."""
    k = _dense_kernel(model)
    yd = y.double()
    diff = (yd[:, :, None, :] - yd[:, None, :, :]).abs().sum(-1)  # (B, N, N)
    return (model.unary.double() * yd).sum((1, 2)) + 0.5 * (k * diff).sum((1, 2))


def brute_force_minimum(model: CRFModel) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact minimum of the *model* energy by enumeration (M^N labellings, batch 1).

    Returns ``(energy, labels)``: float64 scalar and (N,) int64. Exact kernels only.
    """
    b, n, m = model.unary.shape
    if b != 1 or m**n > 2_000_000:
        raise ShapeMismatchError(f"brute_force_minimum: instance too large ({m}^{n}, batch {b})")
    k = _dense_kernel(model)[0]
    unary = model.unary[0].double()
    labs = torch.tensor(list(itertools.product(range(m), repeat=n)), dtype=torch.long)
    best_e, best_l = None, None
    for chunk in labs.split(65536):
        u = unary[torch.arange(n), chunk].sum(1)
        diff = (chunk[:, :, None] != chunk[:, None, :]).double()
        e = u + (diff * k).sum((1, 2))
        i = int(e.argmin())
        if best_e is None or e[i] < best_e:
            best_e, best_l = e[i], chunk[i]
    return best_e, best_l
