"""Helpers shared by the dense-CRF tests: tiny seeded instances and synthetic images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import crf

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def tiny_crf(
    seed: int, *, h: int = 3, w: int = 3, m: int = 3, normalize=None, strength: float = 1.0
) -> crf.DenseCRF:
    """A seeded tiny instance with exact (dense) kernels in float64."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    unary = crf.unary_from_probs(rng.dirichlet(np.ones(m), size=(h, w)))
    return crf.DenseCRF(
        img,
        unary,
        w_smooth=0.3 * strength,
        sigma_smooth=1.0,
        w_appearance=0.5 * strength,
        sigma_xy=2.0,
        sigma_rgb=60.0,
        normalize=normalize,
        filtering="exact",
        dtype=torch.float64,
    )


def smooth_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A synthetic photo-like uint8 image: colour gradients, two flat regions and mild noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * xx / w, 255 * yy / h, 128 + 60 * np.sin(xx / 5)], -1)
    img[: h // 2, : w // 3] = (200, 30, 30)
    img[h // 2 :, 2 * w // 3 :] = (20, 40, 220)
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)
