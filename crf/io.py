"""Image input / output for the CLI and examples (Pillow): images, annotations, overlays.

Every file problem is a typed error naming the file: :class:`InputFileError` (missing, a
directory, not an image / not an ``.npy``, truncated, too many pixels), :class:`OutputPathError`
(missing folder, unknown suffix), :class:`ShapeMismatchError` / :class:`InvalidValueError` /
:class:`TooManyLabelsError` for contents. Sizes are checked from the file headers, before
anything large is decoded or allocated.
"""

from __future__ import annotations

import io
import math
import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from crf.errors import (
    CRFInputError,
    InputFileError,
    InvalidValueError,
    OutputPathError,
    ShapeMismatchError,
    TooManyLabelsError,
)
from crf.unary import MAX_LABELS, labels_from_annotation, unary_from_labels, unary_from_probs

__all__ = [
    "LOSSLESS_SUFFIXES",
    "MAX_PIXELS",
    "check_input_file",
    "check_output_path",
    "default_palette",
    "load_unary",
    "overlay",
    "read_image",
    "save_images",
    "save_labels",
]

#: Most pixels an input image may declare (4096 x 4096). Checked from the header before decoding:
#: larger files are decompression bombs or, at several KB of solver memory per pixel, far too
#: large for the CRF anyway (downscale them first).
MAX_PIXELS = 1 << 24

#: Suffixes a labelling may be saved with: lossless formats keep the exact label colours.
LOSSLESS_SUFFIXES = (".png", ".bmp", ".tif", ".tiff", ".ppm")

# Pillow modes holding more than 8 bits per channel: converting them to RGB clips silently.
_WIDE_MODES = ("I", "F")
# What a broken image file can raise inside Pillow's decoders.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, zlib.error)


def check_input_file(path: str | Path, what: str = "input") -> Path:
    """The path of an existing regular file, else :class:`InputFileError` naming it."""
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"{what} file {p} does not exist")
    if p.is_dir():
        raise InputFileError(f"{what} file {p} is a directory, not a file")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{what} file {p} is not readable")
    return p


def read_image(
    path: str | Path, *, max_pixels: int = MAX_PIXELS, what: str = "image"
) -> np.ndarray:
    """(H, W, 3) uint8 RGB image (palette, grey and RGBA files are converted).

    Refuses, before decoding, files declaring more than ``max_pixels`` pixels and 16-bit /
    float images (their conversion to 8-bit RGB would clip values silently).
    """
    return _read_image(path, max_pixels, what)[0]


def _read_image(path: str | Path, max_pixels: int, what: str) -> tuple[np.ndarray, str | None]:
    """The (H, W, 3) uint8 image and its file format (e.g. "PNG", "JPEG")."""
    p = check_input_file(path, what)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(p)
    except Image.DecompressionBombError as exc:
        raise InputFileError(f"{what} {p}: refused as a decompression bomb ({exc})") from None
    except _DECODE_ERRORS as exc:
        raise InputFileError(f"{what} {p}: cannot read it as an image ({exc})") from None
    with im:
        w, h = im.size
        if w * h > max_pixels:
            raise InputFileError(
                f"{what} {p}: declares {w} x {h} = {w * h} pixels, more than MAX_PIXELS = "
                f"{max_pixels} (a decompression bomb, or too large for the CRF: downscale it)"
            )
        if w * h == 0:
            raise InputFileError(f"{what} {p}: empty image ({w} x {h} pixels)")
        if im.mode.startswith(_WIDE_MODES):
            raise InputFileError(
                f"{what} {p}: mode {im.mode!r} (16-bit or float pixels) would be clipped to "
                "8-bit RGB; convert it to an 8-bit RGB (or palette) image first"
            )
        try:
            return np.array(im.convert("RGB")), im.format
        except _DECODE_ERRORS as exc:
            raise InputFileError(f"{what} {p}: cannot decode the image ({exc})") from None


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
    unique colours in 0xRRGGBB order, black = unknown. At most :data:`MAX_LABELS` labels."""
    p = check_input_file(path, "unary")
    if p.suffix.lower() == ".npy":
        probs = _read_probs(p, tuple(shape))
        try:
            unary = unary_from_probs(probs)
        except CRFInputError as exc:
            raise type(exc)(f"{p}: {exc}") from None
        return unary, default_palette(probs.shape[-1])
    ann, fmt = _read_image(p, MAX_PIXELS, "annotation")
    if ann.shape[:2] != tuple(shape):
        raise ShapeMismatchError(
            f"annotation {p}: (height, width) {ann.shape[:2]} vs the image's {tuple(shape)}"
        )
    name = f"annotation {p}" + (" (a JPEG file: lossy)" if fmt == "JPEG" else "")
    labels, colours, _ = labels_from_annotation(ann, name=name)
    if fmt == "JPEG":
        warnings.warn(
            f"annotation {p} is a JPEG (lossy): each of its {len(colours)} colours becomes a "
            "label, including colours the compression invented; prefer a PNG annotation",
            stacklevel=2,
        )
    if len(colours) < 2:
        raise InvalidValueError(
            f"annotation {p}: needs at least two non-black colours, found {len(colours)}"
        )
    return unary_from_labels(labels, len(colours), gt_prob=gt_prob, zero_unsure=True), colours


def _read_probs(path: Path, shape: tuple[int, int]) -> np.ndarray:
    """(H, W, M) probabilities from an .npy file; the header (format, dtype, shape, label count,
    data size) is checked before the data are read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            readers = {
                (1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0,
            }
            if version not in readers:
                raise ValueError(f"unsupported .npy format version {version}")
            dims, _, dtype = readers[version](f)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise InputFileError(f"{path}: not a valid .npy file ({exc})") from None
        if dtype.hasobject or dtype.kind not in "biuf":
            raise InvalidValueError(
                f"{path}: probabilities must be a float array, the file holds dtype {dtype}"
            )
        if len(dims) != 3:
            raise ShapeMismatchError(
                f"{path}: expected (H, W, M) probabilities (labels last), got shape {dims}"
            )
        if dims[:2] != shape:
            raise ShapeMismatchError(
                f"{path}: probabilities (height, width) {dims[:2]} vs the image's {shape}"
            )
        if dims[2] == 0:
            raise ShapeMismatchError(f"{path}: zero labels (shape {dims})")
        if dims[2] > MAX_LABELS:
            raise TooManyLabelsError(
                f"{path}: {dims[2]} labels (probability channels), more than the cap of "
                f"{MAX_LABELS} (crf.unary.MAX_LABELS)"
            )
        need, have = math.prod(dims) * dtype.itemsize, size - f.tell()
        if have < need:
            raise InputFileError(
                f"{path}: truncated .npy file: shape {dims} of {dtype} needs {need} bytes of "
                f"data, the file has {have}"
            )
        f.seek(0)
        try:
            return np.lib.format.read_array(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputFileError(f"{path}: cannot read the .npy data ({exc})") from None


def check_output_path(path: str | Path, what: str = "output", *, lossless: bool = False) -> Path:
    """An image path that can be written: its folder exists and is writable, it is not a
    folder, and its suffix is a format Pillow writes (a lossless one when ``lossless``).
    Raises :class:`OutputPathError` naming ``what`` and the path; writes nothing."""
    p = Path(path)
    parent = p.parent
    if p.is_dir():
        raise OutputPathError(f"{what} {p} is a directory; give a file name, e.g. {p / 'out.png'}")
    if not parent.exists():
        raise OutputPathError(f"{what} {p}: the folder {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise OutputPathError(f"{what} {p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"{what} {p}: the folder {parent} is not writable")
    suffix = p.suffix.lower()
    fmt = Image.registered_extensions().get(suffix)
    if fmt is None or fmt not in Image.SAVE:
        raise OutputPathError(f"{what} {p}: unknown image suffix {p.suffix!r}; use .png")
    if lossless and suffix not in LOSSLESS_SUFFIXES:
        raise OutputPathError(
            f"{what} {p}: {p.suffix!r} is lossy and would blur the label colours; use one of "
            f"{', '.join(LOSSLESS_SUFFIXES)}"
        )
    return p


def overlay(
    image: np.ndarray, labels: np.ndarray, colours: np.ndarray, alpha: float = 0.5
) -> np.ndarray:
    """(H, W, 3) uint8 blend of the image with the colour-coded labelling."""
    mix = (1 - alpha) * image.astype(np.float32) + alpha * colours[labels].astype(np.float32)
    return np.clip(mix.round(), 0, 255).astype(np.uint8)


def save_labels(path: str | Path, labels: np.ndarray, colours: np.ndarray) -> None:
    """Write a colour-coded (H, W) labelling as an RGB image (PNG for a ``.png`` path)."""
    save_images({Path(path): colours[labels]})


def save_images(images: dict[Path, np.ndarray]) -> None:
    """Write several (H, W, 3) uint8 images all or none: each is encoded in memory and written
    to a temporary file beside its target, and the targets are replaced only once all are
    written (a failure removes the temporary files and raises :class:`OutputPathError`)."""
    encoded = {}
    for path, array in images.items():
        buf = io.BytesIO()
        fmt = Image.registered_extensions().get(Path(path).suffix.lower())
        if fmt is None:
            raise OutputPathError(f"output {path}: unknown image suffix {Path(path).suffix!r}")
        Image.fromarray(array).save(buf, format=fmt)
        encoded[Path(path)] = buf.getvalue()
    temps: dict[Path, Path] = {}
    try:
        for path, data in encoded.items():
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            temps[path] = tmp
            tmp.write_bytes(data)
        for path, tmp in temps.items():
            os.replace(tmp, path)
    except OSError as exc:
        raise OutputPathError(f"cannot write {exc.filename or path}: {exc.strerror}") from None
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
