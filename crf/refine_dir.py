"""``python -m crf refine-dir IMAGES PROBS --out DIR``: refine a folder of segmentations.

Each image ``IMAGES/<name>.<png|jpg|...>`` is paired with ``PROBS/<name>.npy``, an (H, W, M)
array of class probabilities (a segmentation network's softmax). The refined labelling is
written to ``DIR/<name>.png`` (colour-coded, the PASCAL VOC palette) and, with ``--overlay``,
an overlay to ``DIR/<name>_overlay.png``. Images of the same size and label count are refined
``--batch-size`` at a time through one batched :class:`crf.DenseCRF` call (on ``--device``).

Arguments and folders are checked before any work (a bad one: exit status 2, nothing written).
A file that cannot be used (missing or corrupt probability map, unreadable image, size
mismatch, ...) is reported on stderr with its path and skipped; the others are refined. Exit
status: 0 when every image was refined, 1 when some were skipped. A progress bar (stderr)
shows the images done.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from crf.api import DenseCRF
from crf.errors import ConfigError, CRFInputError, InputFileError, OutputPathError
from crf.io import default_palette, load_unary, overlay, read_image, save_images
from crf.model import KernelParams
from crf.validate import as_device, as_iterations

__all__ = ["IMAGE_SUFFIXES", "add_method_args", "add_parser", "refine_dir"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".ppm")


def add_method_args(r: argparse.ArgumentParser) -> None:
    """The ``--method`` and ``--iterations`` options of both sub-commands."""
    r.add_argument("--method", default="meanfield", choices=["meanfield", "qp", "dc-neg", "lp"],
                   help="MAP method (meanfield); see the dense-CRF guide for which one when")
    r.add_argument("--iterations", type=int, default=None,
                   help="iterations of the method (default: its config's)")


def add_parser(
    sub: argparse._SubParsersAction, kernel_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register the ``refine-dir`` sub-command (``kernel_args(parser)`` adds the kernel options)."""
    r = sub.add_parser("refine-dir", help="refine a folder of images with .npy probabilities")
    r.add_argument("images", help="folder of images")
    r.add_argument("probs", help="folder of <image name>.npy (H, W, M) probabilities")
    r.add_argument("--out", required=True, help="output folder (created if absent)")
    add_method_args(r)
    r.add_argument("--batch-size", type=int, default=1, help="images per batched call")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    r.add_argument("--overlay", action="store_true", help="also write <name>_overlay.png")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    kernel_args(r)


@dataclass
class _Item:
    name: str
    image: np.ndarray
    unary: np.ndarray


class _Progress:
    """A one-line progress bar on a terminal, one line per image otherwise."""

    def __init__(self, total: int, stream, enabled: bool = True) -> None:
        self.total, self.done, self.stream, self.enabled = total, 0, stream, enabled
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.start = time.perf_counter()

    def step(self, name: str, note: str = "ok") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        fill = width * self.done // max(self.total, 1)
        bar = "#" * fill + "." * (width - fill)
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        line = f"[{bar}] {self.done}/{self.total} {rate:.2f} img/s  {name}: {note}"
        self.stream.write(("\r" + line[:120].ljust(120)) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _folder(path: str, flag: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"{flag} folder {p} does not exist")
    if not p.is_dir():
        raise InputFileError(f"{flag} {p} is not a folder")
    return p


def _out_folder(path: str, inputs: tuple[Path, Path]) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"--out {out} is a file, not a folder")
    if not out.exists() and not out.parent.is_dir():
        raise OutputPathError(f"--out {out}: the parent folder {out.parent} does not exist")
    if any(out.resolve() == p.resolve() for p in inputs):
        raise OutputPathError(f"--out {out} is an input folder: outputs would overwrite inputs")
    return out


def check_args(args: argparse.Namespace) -> tuple[Path, Path, Path, list[Path]]:
    """Numbers, folders and the image list, before any work: (images, probs, out, files)."""
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    try:
        as_iterations(args.iterations)
        as_device(args.device)
    except ConfigError as exc:
        raise ConfigError(f"--iterations / --device: {exc}") from None
    KernelParams(args.w_smooth, args.sigma_smooth, args.w_appearance, args.sigma_xy, args.sigma_rgb)
    images = _folder(args.images, "IMAGES")
    probs = _folder(args.probs, "PROBS")
    out = _out_folder(args.out, (images, probs))
    files = sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        suffixes = ", ".join(IMAGE_SUFFIXES)
        raise InputFileError(f"IMAGES folder {images} holds no images ({suffixes})")
    stems: dict[str, Path] = {}
    for f in files:
        if f.stem in stems:
            raise InputFileError(
                f"images {stems[f.stem]} and {f} share the name {f.stem!r}: their outputs "
                f"would both be {out / (f.stem + '.png')}"
            )
        stems[f.stem] = f
    return images, probs, out, files


def _load(path: Path, probs: Path) -> _Item:
    """One image and its unaries; raises CRFInputError naming the file."""
    npy = probs / f"{path.stem}.npy"
    if not npy.is_file():
        raise InputFileError(f"no probability map {npy} for image {path}")
    image = read_image(path)
    unary, _ = load_unary(npy, image.shape[:2])
    return _Item(path.stem, image, unary)


def crf_from_args(
    args: argparse.Namespace, image: object, unary: object, **kwargs: Any
) -> DenseCRF:
    """The `DenseCRF` of the kernel options (`w_smooth`, `sigma_*`, `w_appearance`,
    `normalize`) shared by `refine` and `refine-dir`; `kwargs` go to `DenseCRF` too."""
    return DenseCRF(
        image,
        unary,
        w_smooth=args.w_smooth,
        sigma_smooth=args.sigma_smooth,
        w_appearance=args.w_appearance,
        sigma_xy=args.sigma_xy,
        sigma_rgb=args.sigma_rgb,
        normalize=None if args.normalize == "none" else args.normalize,
        **kwargs,
    )


def _refine(batch: list[_Item], args, out: Path) -> float:
    """Refine same-sized images in one call and write their outputs; returns seconds."""
    start = time.perf_counter()
    images, unaries = np.stack([it.image for it in batch]), np.stack([it.unary for it in batch])
    crf = crf_from_args(args, images, unaries, device=args.device)
    res = crf.map(args.method, iterations=args.iterations, energy=False)
    colours = default_palette(batch[0].unary.shape[-1])
    for it, labels in zip(batch, res.labels):
        files = {out / f"{it.name}.png": colours[labels]}
        if args.overlay:
            files[out / f"{it.name}_overlay.png"] = overlay(it.image, labels, colours)
        save_images(files)
    return time.perf_counter() - start


def refine_dir(args: argparse.Namespace, stderr: TextIO | None = None) -> int:
    """Run ``refine-dir``; returns the exit status (0 all refined, 1 some skipped)."""
    stderr = sys.stderr if stderr is None else stderr
    _, probs, out, files = check_args(args)
    torch.set_num_threads(args.threads)
    out.mkdir(exist_ok=True)
    progress = _Progress(len(files), stderr, not args.no_progress)
    failed: list[tuple[Path, str]] = []
    pending: list[_Item] = []

    def flush() -> None:
        if not pending:
            return
        try:
            seconds = _refine(pending, args, out)
        except CRFInputError as exc:
            for it in pending:
                failed.append((Path(args.images) / it.name, str(exc)))
                progress.step(it.name, "failed")
        else:
            for it in pending:
                progress.step(it.name, f"ok ({seconds / len(pending):.2f} s)")
        pending.clear()

    for path in files:
        try:
            item = _load(path, probs)
        except CRFInputError as exc:
            failed.append((path, str(exc)))
            progress.step(path.stem, "skipped")
            continue
        key = (item.image.shape, item.unary.shape)
        if pending and (pending[0].image.shape, pending[0].unary.shape) != key:
            flush()
        pending.append(item)
        if len(pending) == args.batch_size:
            flush()
    flush()
    progress.close()
    for path, message in failed:
        print(f"skipped {path}: {message}", file=stderr)
    done = len(files) - len(failed)
    print(f"refined {done} of {len(files)} images into {out} ({len(failed)} skipped)", file=stderr)
    return 1 if failed else 0
