"""Refine a rough annotation with the dense CRF, comparing the four MAP methods.

Uses ``../shared/data/densecrf/im1.png`` and ``anno1.png`` when present (the classic pydensecrf
example), otherwise a small synthetic image with a scribbled annotation. Prints each method's
energy (our one convention: integer labelling, ordered pairs, un-normalised kernels) and time,
and writes the labellings and an overlay picture into ``--out`` (default: a temp folder; a
given folder is created if its parent exists, and is checked before any work).

    python examples/crf_refine.py [--out DIR] [--synthetic]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import crf
from crf.errors import CRFInputError, OutputPathError
from crf.io import overlay, read_image, save_labels

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "densecrf"


def synthetic() -> tuple[np.ndarray, np.ndarray]:
    """A 60 x 80 image (two noisy colour regions) and an annotation marking a few pixels."""
    rng = np.random.default_rng(0)
    img = np.zeros((60, 80, 3))
    img[:, :45] = (200, 60, 40)
    img[:, 45:] = (40, 90, 200)
    img = np.clip(img + rng.normal(0, 25, img.shape), 0, 255).astype(np.uint8)
    ann = np.zeros_like(img)
    ann[20:40, 5:20] = (255, 0, 0)
    ann[20:40, 60:75] = (0, 0, 255)
    return img, ann


def output_folder(out: str | None) -> Path:
    """The folder to write into: ``out`` (must be a folder or not exist yet, in an existing
    parent folder; created here) or a new temporary folder. Raises :class:`OutputPathError`."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="crf_refine_"))
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"--out {folder} is a file, not a folder")
    if not folder.parent.is_dir():
        raise OutputPathError(f"--out {folder}: the parent folder {folder.parent} does not exist")
    folder.mkdir(exist_ok=True)
    return folder


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--synthetic", action="store_true")
    args = parser.parse_args(argv)
    out = output_folder(args.out)
    torch.set_num_threads(1)  # on a shared 2-core CPU, 2 threads ran up to 30x slower
    if DATA.is_dir() and not args.synthetic:
        img, ann = read_image(DATA / "im1.png"), read_image(DATA / "anno1.png")
    else:
        img, ann = synthetic()
    labels, colours, unknown = crf.labels_from_annotation(ann)
    unary = crf.unary_from_labels(labels, len(colours), gt_prob=0.7, zero_unsure=unknown)
    model = crf.DenseCRF(
        img,
        unary,
        w_smooth=3,
        sigma_smooth=3,
        w_appearance=10,
        sigma_xy=80,
        sigma_rgb=13,
        normalize="symmetric",
    )
    energies = {}
    for method in ("meanfield", "qp", "dc-neg", "lp"):
        res = model.map(method)
        energies[method] = res.energy
        save_labels(out / f"{method}.png", res.labels, colours)
        print(f"{method:10s} energy {res.energy:12.6g}  {res.stats['seconds']:.2f} s")
    Image.fromarray(overlay(img, res.labels, colours)).save(out / "lp_overlay.png")
    print(f"outputs in {out}")
    return energies


if __name__ == "__main__":
    try:
        main()
    except CRFInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
