"""Unary potentials ``phi = -log p`` from probabilities or rough annotations.

Conventions follow the classic pydensecrf example (``utils.unary_from_labels``): label 0 is
"unknown" when ``zero_unsure`` and then gets the uniform unary ``-log(1/M)``; an annotated label
``l`` gets ``-log(gt_prob)`` on label ``l - 1`` and ``-log((1 - gt_prob) / (M - 1))`` elsewhere.
All outputs are float32 arrays with labels last: (H, W, M) or (B, H, W, M).
"""

from __future__ import annotations

import numpy as np

from crf.errors import InvalidValueError, ShapeMismatchError, TooManyLabelsError

__all__ = ["MAX_LABELS", "labels_from_annotation", "unary_from_labels", "unary_from_probs"]

#: Most labels an annotation (distinct non-black colours), ``unary_from_labels`` or a
#: probability file may have: above the largest common segmentation label sets (PASCAL VOC 21,
#: ADE20K 150, COCO-stuff 182). Thousands of colours mean a lossy (JPEG) or anti-aliased
#: annotation, and the (H, W, M) unaries and solver buffers would take gigabytes.
MAX_LABELS = 256


def unary_from_probs(probs: np.ndarray, *, clip: float = 1e-5) -> np.ndarray:
    """``phi = -log(max(p, clip))`` for (..., M) class probabilities (labels last).

    Raises :class:`InvalidValueError` on NaN / negative entries or rows not summing to ~1.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim < 2 or p.shape[-1] < 1:
        raise ShapeMismatchError(
            f"unary_from_probs: expected (..., M) probabilities, got {p.shape}"
        )
    if not np.isfinite(p).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(p))[0])
        raise InvalidValueError(
            f"unary_from_probs: non-finite (NaN/inf) probability {p[bad]} at index {bad} "
            "(pixel..., label)"
        )
    if (p < 0).any():
        bad = tuple(int(i) for i in np.argwhere(p < 0)[0])
        raise InvalidValueError(
            f"unary_from_probs: negative probability {p[bad]:.6g} at index {bad} (pixel..., label)"
        )
    sums = p.sum(-1)
    if np.abs(sums - 1.0).max() > 1e-3:
        worst = tuple(int(i) for i in np.unravel_index(np.abs(sums - 1.0).argmax(), sums.shape))
        raise InvalidValueError(
            f"unary_from_probs: probabilities at pixel {worst} sum to {sums[worst]:.4f}, not 1"
        )
    return (-np.log(np.maximum(p, clip))).astype(np.float32)


def unary_from_labels(
    labels: np.ndarray, n_labels: int, gt_prob: float = 0.7, zero_unsure: bool = True
) -> np.ndarray:
    """Unaries (..., M) from an integer annotation (...,), as pydensecrf's ``unary_from_labels``.

    With ``zero_unsure`` label 0 means unknown and labels 1..M map to classes 0..M-1; otherwise
    labels 0..M-1 are the classes themselves.
    """
    if isinstance(gt_prob, bool) or not isinstance(gt_prob, int | float | np.number):
        raise InvalidValueError(f"unary_from_labels: gt_prob must be a number, got {gt_prob!r}")
    if not 0.0 < gt_prob < 1.0:
        raise InvalidValueError(f"unary_from_labels: gt_prob must be in (0, 1), got {gt_prob}")
    if not isinstance(n_labels, int | np.integer) or isinstance(n_labels, bool):
        raise InvalidValueError(f"unary_from_labels: n_labels must be an integer, got {n_labels!r}")
    if n_labels < 2:
        raise InvalidValueError(f"unary_from_labels: need n_labels >= 2, got {n_labels}")
    if n_labels > MAX_LABELS:
        raise TooManyLabelsError(
            f"unary_from_labels: n_labels = {n_labels} is more than MAX_LABELS = {MAX_LABELS}"
        )
    lab = np.asarray(labels)
    if lab.dtype.kind not in "iub":
        raise InvalidValueError(f"unary_from_labels: labels must be integers, got {lab.dtype}")
    lab = lab.astype(np.int64)
    top = n_labels if zero_unsure else n_labels - 1
    if lab.size and (lab.min() < 0 or lab.max() > top):
        raise InvalidValueError(
            f"unary_from_labels: labels must lie in [0, {top}] (zero_unsure={zero_unsure}), "
            f"found [{lab.min()}, {lab.max()}]"
        )
    n_energy = -np.log((1.0 - gt_prob) / (n_labels - 1))
    p_energy = -np.log(gt_prob)
    unary = np.full((*lab.shape, n_labels), n_energy, dtype=np.float32)
    cls = lab - 1 if zero_unsure else lab
    known = cls >= 0
    np.put_along_axis(unary, np.clip(cls, 0, None)[..., None], p_energy, axis=-1)
    if zero_unsure:
        unary[~known] = -np.log(1.0 / n_labels)
    return unary


def labels_from_annotation(
    annotation: np.ndarray, *, name: str = "annotation", max_labels: int = MAX_LABELS
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Map an (H, W, 3) colour annotation to labels like pydensecrf's ``inference.py``.

    Colours are packed as ``0xRRGGBB`` and numbered in increasing order; black (0) means
    unknown and becomes label 0 (classes are then 1..M). Returns ``(labels, colours, has_unknown)``
    with ``colours`` (M, 3) uint8, the colour of class ``c`` (label ``c + 1`` when has_unknown).
    Raises :class:`TooManyLabelsError` when M > ``max_labels`` (``name``, e.g. the file, is
    named in the message), before anything of size H x W x M is allocated.
    """
    ann = np.asarray(annotation)
    if ann.ndim != 3 or ann.shape[-1] != 3:
        raise ShapeMismatchError(
            f"{name}: expected an (H, W, 3) colour annotation, got {ann.shape}"
        )
    if ann.dtype.kind not in "uib" or (ann.size and (ann.min() < 0 or ann.max() > 255)):
        raise InvalidValueError(
            f"{name}: expected uint8 colours in [0, 255], got dtype {ann.dtype}"
        )
    if ann.size == 0:
        raise ShapeMismatchError(f"{name}: empty annotation of shape {ann.shape}")
    a = ann.astype(np.uint32)
    packed = (a[..., 0] << 16) | (a[..., 1] << 8) | a[..., 2]
    colours, labels = np.unique(packed, return_inverse=True)
    n_classes = len(colours) - int(colours[0] == 0)
    if n_classes > max_labels:
        raise TooManyLabelsError(
            f"{name}: {n_classes} distinct non-black colours (labels) found, more than the cap "
            f"of {max_labels} (crf.unary.MAX_LABELS); a lossy (JPEG) or anti-aliased annotation? "
            "Save annotations losslessly (PNG) with one flat colour per label"
        )
    labels = labels.reshape(packed.shape)
    has_unknown = bool(colours[0] == 0)
    if has_unknown:
        colours = colours[1:]
    else:
        labels = labels + 1
    rgb = np.stack([(colours >> 16) & 255, (colours >> 8) & 255, colours & 255], -1)
    return labels.astype(np.int64), rgb.astype(np.uint8), has_unknown
