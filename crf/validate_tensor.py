"""Input checking for torch tensors (any device, CUDA included) without a round trip to numpy.

The same checks and messages as :mod:`crf.validate` (which handles numpy arrays): shapes,
dtypes, the [0, 255] range of images, finite unaries, and for probabilities (a segmentation
network's softmax) non-negative rows summing to 1. Each check is one reduction on the device;
the offending index is only looked up (one ``nonzero``) when a check fails. Inputs are never
modified: conversions make new tensors.
"""

from __future__ import annotations

import torch

from crf.errors import InvalidValueError, ShapeMismatchError, TooManyLabelsError
from crf.unary import MAX_LABELS

__all__ = ["image_tensor", "probs_tensor_to_unary", "unary_tensor"]

PROB_CLIP = 1e-5  # as crf.unary.unary_from_probs
SUM_TOLERANCE = 1e-3


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    """Index of the first True entry of a boolean tensor (one host sync)."""
    return tuple(int(i) for i in torch.nonzero(mask)[0].tolist())


def image_tensor(image: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, bool]:
    """(B, H, W, 3) uint8 copy on ``device`` of an (H, W, 3) / (B, H, W, 3) image tensor (grey
    (H, W) / (..., 1) is repeated to RGB, alpha dropped) and whether it was batched."""
    if image.is_floating_point() or image.is_complex():
        raise InvalidValueError(
            f"image: expected uint8 RGB, got {image.dtype}; convert first, e.g. "
            "(img * 255).round().to(torch.uint8) for values in [0, 1]"
        )
    img = image.detach().to(device)
    if img.numel() and (int(img.min()) < 0 or int(img.max()) > 255):
        raise InvalidValueError(
            f"image: values must lie in [0, 255], got [{int(img.min())}, {int(img.max())}]"
        )
    img = img.to(torch.uint8)
    if img.dim() == 2:
        img = img[..., None]
    batched = img.dim() == 4
    if img.dim() not in (3, 4) or img.shape[-1] not in (1, 3, 4):
        raise ShapeMismatchError(
            "image: expected (H, W, 3) or (B, H, W, 3) RGB (grey and RGBA are converted), "
            f"got shape {tuple(image.shape)}"
        )
    if img.shape[-1] == 1:
        img = img.expand(*img.shape[:-1], 3)
    img = img[..., :3]
    if not batched:
        img = img[None]
    if min(img.shape[:3]) < 1:
        raise ShapeMismatchError(f"image: empty shape {tuple(img.shape)}")
    return img.contiguous(), batched


def _labelled(x: torch.Tensor, bhw: tuple, batched: bool, name: str) -> torch.Tensor:
    """(B, H, W, M) view of a labels-last tensor after the shape checks."""
    if x.dtype == torch.bool or x.is_complex():
        raise InvalidValueError(f"{name}: expected a float tensor, got dtype {x.dtype}")
    want = 4 if batched else 3
    if x.dim() != want:
        raise ShapeMismatchError(
            f"{name}: expected {'(B, H, W, M)' if batched else '(H, W, M)'} (labels last), "
            f"got shape {tuple(x.shape)}"
        )
    x = x if batched else x[None]
    if x.shape[-1] == 0:
        raise ShapeMismatchError(f"{name}: zero labels (shape {tuple(x.shape[1:])})")
    if x.shape[-1] > MAX_LABELS:
        raise TooManyLabelsError(
            f"{name}: {x.shape[-1]} labels, more than MAX_LABELS = {MAX_LABELS}"
        )
    if tuple(x.shape[:3]) != tuple(bhw):
        raise ShapeMismatchError(
            f"{name}: (batch, height, width) {tuple(x.shape[:3])} disagrees with the image's "
            f"{tuple(bhw)}"
        )
    return x


def _where(index: tuple[int, ...], batched: bool, pixel_only: bool = False) -> str:
    axes = "(batch, y, x)" if pixel_only else "(batch, y, x, label)"
    if not batched:
        axes = "(y, x)" if pixel_only else "(y, x, label)"
        index = index[1:]
    return f"{axes} {index}"


def unary_tensor(
    unary: torch.Tensor,
    bhw: tuple,
    batched: bool,
    dtype: torch.dtype,
    device: torch.device,
    name: str = "unary",
) -> torch.Tensor:
    """(B, H, W, M) ``dtype`` copy on ``device`` of finite unaries ``-log p``."""
    u = _labelled(unary.detach(), bhw, batched, name).to(device=device, dtype=dtype)
    bad = ~torch.isfinite(u)
    if bool(bad.any()):
        where = _first(bad)
        raise InvalidValueError(
            f"{name}: non-finite value (NaN/inf, or beyond {dtype}) {float(u[where]):.6g} at "
            f"{_where(where, batched)}"
        )
    return u.contiguous()


def probs_tensor_to_unary(
    probs: torch.Tensor, bhw: tuple, batched: bool, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Unaries ``-log(max(p, 1e-5))`` (B, H, W, M) on ``device`` from class probabilities
    (a softmax output): finite, >= 0, each pixel's row summing to 1 within 1e-3."""
    p = _labelled(probs.detach(), bhw, batched, "probs").to(device=device)
    p = p if p.is_floating_point() else p.to(dtype)
    bad = ~torch.isfinite(p)
    if bool(bad.any()):
        where = _first(bad)
        raise InvalidValueError(
            f"probs: non-finite (NaN/inf) probability {float(p[where])} at {_where(where, batched)}"
        )
    neg = p < 0
    if bool(neg.any()):
        where = _first(neg)
        raise InvalidValueError(
            f"probs: negative probability {float(p[where]):.6g} at {_where(where, batched)}"
        )
    err = (p.double().sum(-1) - 1.0).abs()
    if float(err.max()) > SUM_TOLERANCE:
        where = _first(err == err.max())
        total = float(p[where].double().sum())
        raise InvalidValueError(
            f"probs: probabilities at pixel {_where(where, batched, True)} sum to {total:.4f}, "
            "not 1 (pass a softmax output, or unary= for scores)"
        )
    return (-torch.log(p.clamp_min(PROB_CLIP))).to(dtype).contiguous()
