"""Input checking and conversion for the public API: clear :class:`CRFInputError` messages
instead of crashes inside the filtering. Arrays are always copied (read-only inputs are fine).
"""

from __future__ import annotations

import math
import numbers
from os import PathLike

import numpy as np
import torch

from crf.errors import ConfigError, InvalidValueError, ShapeMismatchError

__all__ = [
    "as_budget",
    "as_device",
    "as_dtype",
    "as_image",
    "as_iterations",
    "as_labels",
    "as_marginals",
    "as_unary",
]

FLOAT_DTYPES = (torch.float32, torch.float64)


def _numpy(x: object, name: str) -> np.ndarray:
    if isinstance(x, str | bytes | PathLike):
        raise InvalidValueError(
            f"{name}: got the path {x!r}, expected an array; read files first "
            "(crf.io.read_image / crf.io.load_unary)"
        )
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    try:
        return np.array(x, copy=True)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"{name}: cannot convert to an array ({exc})") from None


def as_image(image: object) -> tuple[np.ndarray, bool]:
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


def as_unary(
    unary: object, bhw: tuple[int, int, int], batched: bool, name: str = "unary"
) -> np.ndarray:
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
    with np.errstate(over="ignore"):
        u32 = np.ascontiguousarray(u, dtype=np.float32)
    if not np.isfinite(u32).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(u32))[0])
        kind = "non-finite value (NaN/inf)" if not np.isfinite(u[where]) else "value beyond float32"
        index = where if batched else where[1:]
        axes = "(batch, y, x, label)" if batched else "(y, x, label)"
        raise InvalidValueError(f"{name}: {kind} {float(u[where]):.6g} at {axes} {index}")
    return u32


def as_marginals(
    init: object, bhw: tuple[int, int, int], n_labels: int, batched: bool
) -> np.ndarray:
    """(B, H, W, M) float32 copy of initial marginals (not normalised); entries must be finite
    and >= 0 with a positive sum at every pixel (the first offending index is named)."""
    q = as_unary(init, bhw, batched, name="init")
    if q.shape[-1] != n_labels:
        raise ShapeMismatchError(f"init has {q.shape[-1]} labels, unary {n_labels}")
    axes = "(batch, y, x, label)" if batched else "(y, x, label)"
    if (q < 0).any():
        where = tuple(int(i) for i in np.argwhere(q < 0)[0])
        index = where if batched else where[1:]
        raise InvalidValueError(f"init: negative marginal {float(q[where]):.6g} at {axes} {index}")
    sums = q.sum(-1, dtype=np.float64)
    if (sums <= 0).any():
        where = tuple(int(i) for i in np.argwhere(sums <= 0)[0])
        index = where if batched else where[1:]
        axes = "(batch, y, x)" if batched else "(y, x)"
        raise InvalidValueError(f"init: marginals sum to 0 at pixel {axes} {index}")
    return q


def as_iterations(iterations: object) -> int | None:
    """None or a whole number >= 1 (an integral float such as 5.0 is accepted)."""
    if iterations is None:
        return None
    if isinstance(iterations, bool) or not isinstance(iterations, numbers.Real):
        raise ConfigError(f"iterations must be a whole number >= 1, got {iterations!r}")
    value = float(iterations)
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise ConfigError(f"iterations must be a whole number >= 1, got {iterations!r}")
    return int(value)


def as_budget(budget: object) -> float | None:
    """None or a finite number of seconds > 0."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ConfigError(f"budget must be a number of seconds > 0, got {budget!r}")
    value = float(budget)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"budget must be a finite number of seconds > 0, got {budget!r}")
    return value


def as_device(device: object) -> torch.device:
    """A usable torch device ("cpu", "cuda", "cuda:1", ...; None = CPU)."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(f"device {device!r} is not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: only 'cpu' and 'cuda' devices are supported")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device {device!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device {device!r}: only {count} CUDA device(s) are present")
    return dev


def as_dtype(dtype: object) -> torch.dtype:
    """torch.float32 or torch.float64 (the filtering and solver precision)."""
    if dtype not in FLOAT_DTYPES:
        raise ConfigError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def as_labels(
    labels: object, bhw: tuple[int, int, int], n_labels: int, batched: bool
) -> np.ndarray:
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
