"""Command line of the dense CRF.

- ``python -m crf refine IMAGE ANNOTATION_OR_PROBS --method lp --out OUT.png``: writes the
  colour-coded labelling to OUT and an overlay picture (image blended with the labelling) next
  to it (``--overlay``, default ``OUT_overlay.png``); prints energy and time. Every argument,
  input file header and output folder is checked before any work; bad input exits with status
  2 and a message naming the argument or file, and writes nothing.
- ``python -m crf refine-dir IMAGES PROBS --out DIR``: a folder of images with ``.npy``
  probability maps (see :mod:`crf.refine_dir`); a file that cannot be used is reported and
  skipped (exit status 1 when any was), the others are refined.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from crf.errors import ConfigError, CRFInputError, OutputPathError
from crf.io import (
    check_input_file,
    check_output_path,
    load_unary,
    overlay,
    read_image,
    save_images,
)
from crf.model import KernelParams
from crf.refine_dir import add_method_args, crf_from_args, refine_dir
from crf.refine_dir import add_parser as add_refine_dir
from crf.validate import as_budget, as_iterations


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crf", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("refine", help="refine a rough annotation or class probabilities")
    r.add_argument("image", help="RGB image (PNG, JPEG, ...)")
    r.add_argument("unary", help="annotation PNG (black = unknown) or .npy (H, W, M) probabilities")
    add_method_args(r)
    r.add_argument("--out", required=True, help="the colour-coded labelling to write (lossless)")
    r.add_argument("--overlay", default=None, help="the overlay picture (OUT_overlay.png)")
    r.add_argument("--budget", type=float, default=None,
                   help="time limit in seconds, a chained init's time included")
    r.add_argument("--gt-prob", type=float, default=0.7,
                   help="an annotation's confidence in its labels, in (0, 1) (0.7)")  # fmt: skip
    _kernel_args(r)
    add_refine_dir(sub, _kernel_args)
    return p


def _kernel_args(r: argparse.ArgumentParser) -> None:
    """The model options shared by the sub-commands."""
    r.add_argument("--normalize", default="symmetric", choices=["symmetric", "none"],
                   help="kernel normalisation: symmetric (D^-1/2 K D^-1/2, classic) or none")
    r.add_argument("--w-smooth", type=float, default=3.0, help="smoothness kernel's weight (3)")
    r.add_argument("--sigma-smooth", type=float, default=3.0,
                   help="smoothness kernel's width in pixels (3)")
    r.add_argument("--w-appearance", type=float, default=10.0,
                   help="appearance kernel's weight (10)")
    r.add_argument("--sigma-xy", type=float, default=80.0,
                   help="appearance kernel's width in pixels (80)")
    r.add_argument("--sigma-rgb", type=float, default=13.0,
                   help="appearance kernel's width in colour, 0-255 per channel (13)")
    r.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")


def _check_args(args: argparse.Namespace) -> tuple[Path, Path]:
    """Check the numbers, the input files' existence and the output paths (before any work);
    returns the labelling and overlay paths."""
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    for flag, check, value in (
        ("--iterations", as_iterations, args.iterations),
        ("--budget", as_budget, args.budget),
    ):
        try:
            check(value)
        except ConfigError as exc:
            raise ConfigError(f"{flag}: {exc}") from None
    if not (math.isfinite(args.gt_prob) and 0 < args.gt_prob < 1):
        raise ConfigError(f"--gt-prob must lie in (0, 1), got {args.gt_prob}")
    KernelParams(args.w_smooth, args.sigma_smooth, args.w_appearance, args.sigma_xy, args.sigma_rgb)
    inputs = [check_input_file(args.image, "image"), check_input_file(args.unary, "unary")]
    out = check_output_path(args.out, "--out", lossless=True)
    ov_arg = args.overlay or out.with_name(out.stem + "_overlay.png")
    ov = check_output_path(ov_arg, "--overlay")
    if out.resolve() == ov.resolve():
        raise OutputPathError(f"--out and --overlay are the same file {out}")
    for path, flag in ((out, "--out"), (ov, "--overlay")):
        if any(path.resolve() == i.resolve() for i in inputs):
            raise OutputPathError(f"{flag} {path} would overwrite an input file")
    return out, ov


def refine(args: argparse.Namespace) -> None:
    """Run the ``refine`` command."""
    out, ov = _check_args(args)
    torch.set_num_threads(args.threads)  # more threads on a shared CPU can be far slower
    image = read_image(args.image)
    unary, colours = load_unary(args.unary, image.shape[:2], gt_prob=args.gt_prob)
    crf = crf_from_args(args, image, unary)
    res = crf.map(args.method, iterations=args.iterations, budget=args.budget)
    save_images({out: colours[res.labels], ov: overlay(image, res.labels, colours)})
    print(f"{args.method}: energy {res.energy:.6g}, {res.stats['seconds']:.3f} s -> {out}, {ov}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 on bad input, with the message on stderr)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "refine-dir":
            return refine_dir(args)
        refine(args)
    except CRFInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
