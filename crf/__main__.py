"""Command line: ``python -m crf refine IMAGE ANNOTATION_OR_PROBS --method lp --out OUT.png``.

Writes the colour-coded labelling to OUT and an overlay picture (image blended with the
labelling) next to it (``--overlay``, default ``OUT_overlay.png``); prints energy and time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from PIL import Image

from crf.api import DenseCRF
from crf.errors import CRFInputError
from crf.io import load_unary, overlay, read_image, save_labels


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crf", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("refine", help="refine a rough annotation or class probabilities")
    r.add_argument("image")
    r.add_argument("unary", help="annotation PNG (black = unknown) or .npy (H, W, M) probabilities")
    r.add_argument("--method", default="meanfield", choices=["meanfield", "qp", "dc-neg", "lp"])
    r.add_argument("--out", required=True)
    r.add_argument("--overlay", default=None)
    r.add_argument("--iterations", type=int, default=None)
    r.add_argument("--budget", type=float, default=None, help="seconds")
    r.add_argument("--gt-prob", type=float, default=0.7)
    r.add_argument("--normalize", default="symmetric", choices=["symmetric", "none"])
    r.add_argument("--w-smooth", type=float, default=3.0)
    r.add_argument("--sigma-smooth", type=float, default=3.0)
    r.add_argument("--w-appearance", type=float, default=10.0)
    r.add_argument("--sigma-xy", type=float, default=80.0)
    r.add_argument("--sigma-rgb", type=float, default=13.0)
    r.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    return p


def refine(args: argparse.Namespace) -> None:
    """Run the ``refine`` command."""
    torch.set_num_threads(max(1, args.threads))  # more threads on a shared CPU can be far slower
    image = read_image(args.image)
    unary, colours = load_unary(args.unary, image.shape[:2], gt_prob=args.gt_prob)
    crf = DenseCRF(
        image,
        unary,
        w_smooth=args.w_smooth,
        sigma_smooth=args.sigma_smooth,
        w_appearance=args.w_appearance,
        sigma_xy=args.sigma_xy,
        sigma_rgb=args.sigma_rgb,
        normalize=None if args.normalize == "none" else args.normalize,
    )
    res = crf.map(args.method, iterations=args.iterations, budget=args.budget)
    out = Path(args.out)
    save_labels(out, res.labels, colours)
    ov = Path(args.overlay) if args.overlay else out.with_name(out.stem + "_overlay.png")
    Image.fromarray(overlay(image, res.labels, colours)).save(ov)
    print(f"{args.method}: energy {res.energy:.6g}, {res.stats['seconds']:.3f} s -> {out}, {ov}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 on bad input, with the message on stderr)."""
    args = _parser().parse_args(argv)
    try:
        refine(args)
    except CRFInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
