"""Input checking and conversion for the public API: clear :class:`CRFInputError` messages
instead of crashes inside the filtering. Arrays are always copied (read-only inputs are fine).
"""

from __future__ import annotations

import numpy as np
import torch

from crf.errors import InvalidValueError, ShapeMismatchError

__all__ = ["as_image", "as_labels", "as_unary"]


def _numpy(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    try:
        return np.array(x, copy=True)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"{name}: cannot convert to an array ({exc})") from None


def as_image(image) -> tuple[np.ndarray, bool]:
    """(B, H, W, 3) uint8 copy of an image and whether the input was batched.

    Accepts (H, W, 3), (B, H, W, 3); grey (H, W) / (H, W, 1) is repeated to RGB and an alpha
    channel is dropped. Integer / bool images must lie in [0, 255]; float images are refused
    (their scale, [0, 1] or [0, 255], is ambiguous): convert them to uint8 first.
    """
    img = _numpy(image, "image")
    if img.dtype.kind == "f":
        raise InvalidValueError(
            f"image: expected uint8 RGB, got {img.dtype}; convert first, e.g. "
            "(img * 255).round().astype(np.uint8) for values in [0, 1]"
        )
    if img.dtype.kind not in "uib":
        raise InvalidValueError(f"image: expected uint8 RGB, got dtype {img.dtype}")
    if img.size and (img.min() < 0 or img.max() > 255):
        raise InvalidValueError(
            f"image: values must lie in [0, 255], got [{img.min()}, {img.max()}]"
        )
    img = img.astype(np.uint8)
    if img.ndim == 2:
        img = img[..., None]
    batched = img.ndim == 4
    if img.ndim not in (3, 4) or img.shape[-1] not in (1, 3, 4):
        raise ShapeMismatchError(
            f"image: expected (H, W, 3) or (B, H, W, 3) RGB (grey and RGBA are converted), "
            f"got shape {image.shape if hasattr(image, 'shape') else img.shape}"
        )
    if img.shape[-1] == 1:
        img = np.repeat(img, 3, -1)
    img = img[..., :3]
    if not batched:
        img = img[None]
    if min(img.shape[:3]) < 1:
        raise ShapeMismatchError(f"image: empty shape {img.shape}")
    return np.ascontiguousarray(img), batched


def as_unary(unary, bhw: tuple[int, int, int], batched: bool, name: str = "unary") -> np.ndarray:
    """(B, H, W, M) float32 copy of unaries (or marginals); checks shape, labels and finiteness."""
    u = _numpy(unary, name)
    if u.dtype.kind not in "fiu":
        raise InvalidValueError(f"{name}: expected a float array, got dtype {u.dtype}")
    want = 4 if batched else 3
    if u.ndim != want:
        raise ShapeMismatchError(
            f"{name}: expected {'(B, H, W, M)' if batched else '(H, W, M)'} (labels last), "
            f"got shape {u.shape}"
        )
    if not batched:
        u = u[None]
    if u.shape[-1] == 0:
        raise ShapeMismatchError(f"{name}: zero labels (shape {u.shape[1:]})")
    if u.shape[:3] != tuple(bhw):
        raise ShapeMismatchError(
            f"{name}: (batch, height, width) {u.shape[:3]} disagrees with the image's {tuple(bhw)}"
        )
    if not np.isfinite(u).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(u))[0])
        raise InvalidValueError(
            f"{name}: non-finite value (NaN/inf) at (batch, y, x, label) {where}"
        )
    return np.ascontiguousarray(u, dtype=np.float32)


def as_labels(labels, bhw: tuple[int, int, int], n_labels: int, batched: bool) -> np.ndarray:
    """(B, N) int64 copy of an integer labelling (H, W) / (B, H, W) with values in [0, M)."""
    lab = _numpy(labels, "labels")
    if lab.dtype.kind not in "iub":
        raise InvalidValueError(f"labels: expected integers, got dtype {lab.dtype}")
    if not batched:
        lab = lab[None]
    if lab.shape != tuple(bhw):
        raise ShapeMismatchError(f"labels: shape {lab.shape} != (batch, height, width) {bhw}")
    if lab.size and (lab.min() < 0 or lab.max() >= n_labels):
        raise InvalidValueError(
            f"labels: values must lie in [0, {n_labels}), got [{lab.min()}, {lab.max()}]"
        )
    return lab.reshape(lab.shape[0], -1).astype(np.int64)
