"""Image input / output for the CLI and examples (Pillow): images, annotations, overlays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from crf.errors import CRFInputError, ShapeMismatchError
from crf.unary import labels_from_annotation, unary_from_labels, unary_from_probs

__all__ = ["default_palette", "load_unary", "overlay", "read_image", "save_labels"]


def read_image(path: str | Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB image (palette, grey and RGBA files are converted)."""
    try:
        with Image.open(path) as im:
            return np.array(im.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise CRFInputError(f"cannot read image {path}: {exc}") from None


def default_palette(n: int) -> np.ndarray:
    """(n, 3) uint8 colours: the PASCAL VOC colour map (bit-interleaved label index)."""
    out = np.zeros((n, 3), np.uint8)
    for i in range(n):
        c, r, g, b = i + 1, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out[i] = (r, g, b)
    return out


def load_unary(
    path: str | Path, shape: tuple[int, int], gt_prob: float = 0.7
) -> tuple[np.ndarray, np.ndarray]:
    """Unaries (H, W, M) and label colours (M, 3) from an annotation image or an .npy file of
    (H, W, M) probabilities. Annotation colours map to labels as in pydensecrf's example:
    unique colours in 0xRRGGBB order, black = unknown."""
    path = Path(path)
    if path.suffix == ".npy":
        probs = np.load(path)
        if probs.ndim != 3 or probs.shape[:2] != tuple(shape):
            raise ShapeMismatchError(f"{path}: probabilities {probs.shape} vs image {tuple(shape)}")
        return unary_from_probs(probs), default_palette(probs.shape[-1])
    ann = read_image(path)
    if ann.shape[:2] != tuple(shape):
        raise ShapeMismatchError(f"{path}: annotation {ann.shape[:2]} vs image {tuple(shape)}")
    labels, colours, _ = labels_from_annotation(ann)
    if len(colours) < 2:
        raise CRFInputError(f"{path}: the annotation needs at least two non-black colours")
    return unary_from_labels(labels, len(colours), gt_prob=gt_prob, zero_unsure=True), colours


def overlay(
    image: np.ndarray, labels: np.ndarray, colours: np.ndarray, alpha: float = 0.5
) -> np.ndarray:
    """(H, W, 3) uint8 blend of the image with the colour-coded labelling."""
    mix = (1 - alpha) * image.astype(np.float32) + alpha * colours[labels].astype(np.float32)
    return np.clip(mix.round(), 0, 255).astype(np.uint8)


def save_labels(path: str | Path, labels: np.ndarray, colours: np.ndarray) -> None:
    """Write a colour-coded (H, W) labelling as an RGB PNG."""
    Image.fromarray(colours[labels]).save(path)
