"""Certify a semi-supervised VAE's latent space: what does the decoder draw from a box of codes,
and does its own classifier still read every one of those drawings as the same digit?

The model (Siddharth et al., NeurIPS 2017, "Learning disentangled representations with
semi-supervised deep generative models"): an encoder q(y, z | x) = q(y | x) q(z | x, y) whose
head q(y | x) is a digit classifier, and a decoder p(x | y, z) with y the digit (one-hot) and z
its style. It is trained in-process on scikit-learn's 8x8 digits with labels for a fifth of the
training images, by the objective of Kingma et al. 2014 ("Semi-supervised learning with deep
generative models", M2) that the paper's framework generalises: the ELBO of (x, y) plus
`ALPHA` log q(y | x) on labelled images, the ELBO with y marginalised under q(y | x) on the
others.

Then, on a latent box (y fixed to one digit, z within `radius` prior standard deviations of that
digit's mean code):
- `verify.bounds` bounds every decoded pixel over the whole box;
- `verify.verify` proves that decoder -> classifier, composed as one nn.Module, gives the digit
  for every code in the box, or returns a code (a counterexample) where it does not;
- a box whose y moves from one digit to another crosses a class boundary: the counterexample.

Writes a picture (per radius: the lower-bound image, the image of the mean code, the
upper-bound image) as a PNG with no plotting library.

Run: python examples/vae_latent.py [--quick] [--digit 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import copy
import math
import struct
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import verify
from verify.property import Polytope, Region, VnnlibProperty

N_CLASSES = 10
LATENT = 4  # z: the style
HIDDEN = 64
LABELLED = 0.2  # the fraction of training images whose label the VAE sees
ALPHA = 50.0  # weight of the labelled images' classification term (Kingma et al. 2014)
RADII = (0.5, 1.0, 2.0, 3.0)  # latent boxes' half-widths, in the prior's standard deviations


class SemiSupervisedVAE(nn.Module):
    """q(y | x) (`classifier`), q(z | x, y) (`encoder`, mean and log-variance) and
    p(x | y, z) (`decoder`, Bernoulli logits of the 64 pixels); input `[y one-hot, z]`."""

    def __init__(self, latent: int = LATENT, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.latent = latent
        self.classifier = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, N_CLASSES)
        )
        self.encoder = nn.Sequential(
            nn.Linear(64 + N_CLASSES, hidden), nn.ReLU(), nn.Linear(hidden, 2 * latent)
        )
        self.decoder = nn.Sequential(
            nn.Linear(N_CLASSES + latent, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 64),
        )  # fmt: skip

    def encode(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and log-variance of q(z | x, y) for images `x` and one-hot labels `y`."""
        mean, log_var = self.encoder(torch.cat([x, y], dim=-1)).chunk(2, dim=-1)
        return mean, log_var

    def elbo(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log p(x | y, z) + log p(y) - KL(q(z | x, y) || N(0, I)), one reparameterised z."""
        mean, log_var = self.encode(x, y)
        z = mean + torch.randn_like(mean) * (0.5 * log_var).exp()
        logits = self.decoder(torch.cat([y, z], dim=-1))
        log_px = -nn.functional.binary_cross_entropy_with_logits(logits, x, reduction="none")
        kl = 0.5 * (mean**2 + log_var.exp() - 1.0 - log_var).sum(-1)
        return log_px.sum(-1) - kl - math.log(N_CLASSES)


def semi_supervised_loss(vae: SemiSupervisedVAE, x, y, labelled) -> torch.Tensor:
    """Minus the M2 objective on a batch: labelled rows ELBO(x, y) + ALPHA log q(y | x);
    unlabelled rows sum_y q(y | x) (ELBO(x, y) - log q(y | x))."""
    eye = torch.eye(N_CLASSES)
    log_q = vae.classifier(x).log_softmax(-1)
    xs, ys = x[labelled], y[labelled]
    supervised = vae.elbo(xs, eye[ys]) + ALPHA * log_q[labelled].gather(1, ys[:, None])[:, 0]
    xu, log_qu = x[~labelled], log_q[~labelled]
    n = len(xu)
    every_y = vae.elbo(xu.repeat_interleave(N_CLASSES, 0), eye.repeat(n, 1)).view(n, N_CLASSES)
    unsupervised = (log_qu.exp() * (every_y - log_qu)).sum(-1)
    return -(supervised.sum() + unsupervised.sum()) / len(x)


def train_vae(steps: int = 1200, seed: int = 0):
    """The VAE after `steps` Adam steps on batches of 128; returns it (eval mode, no grads),
    the training images and labels, and the classifier's test accuracy."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed)
    generator = torch.Generator().manual_seed(seed)
    labelled = torch.rand(len(x_tr), generator=generator) < LABELLED
    torch.manual_seed(seed)
    vae = SemiSupervisedVAE()
    opt = torch.optim.Adam(vae.parameters(), lr=2e-3)
    for _ in range(steps):
        batch = torch.randint(0, len(x_tr), (128,), generator=generator)
        opt.zero_grad()
        semi_supervised_loss(vae, x_tr[batch], y_tr[batch], labelled[batch]).backward()
        opt.step()
    vae.eval().requires_grad_(False)
    accuracy = (vae.classifier(x_te).argmax(1) == y_te).float().mean().item()
    return vae, x_tr, y_tr, accuracy


def decoded_image(vae: SemiSupervisedVAE) -> nn.Module:
    """Latent code `[y one-hot, z]` -> pixel intensities in [0, 1] (the Bernoulli means)."""
    return nn.Sequential(vae.decoder, nn.Sigmoid())


def decode_then_classify(vae: SemiSupervisedVAE) -> nn.Module:
    """Latent code -> decoded image -> q(y | image)'s logits: the one network `verify` sees."""
    return nn.Sequential(vae.decoder, nn.Sigmoid(), vae.classifier)


def latent_box(vae, x, y, digit: int, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The box `[lower, upper]` (`[N_CLASSES + LATENT]` each) of codes with y = the digit's
    one-hot and z within `radius` of the digit's mean code (the mean of q(z | x, y) over its
    training images; z's prior is N(0, I), so `radius` counts prior standard deviations)."""
    one_hot = torch.eye(N_CLASSES)[digit]
    mean, _ = vae.encode(x[y == digit], one_hot.expand(int((y == digit).sum()), -1))
    centre = mean.mean(0)
    return torch.cat([one_hot, centre - radius]), torch.cat([one_hot, centre + radius])


def class_property(lower, upper, digit: int) -> VnnlibProperty:
    """The property "the classifier says `digit` for every code in the box": violated iff
    some code has logit_j >= logit_digit for some j != digit (one unsafe polytope per j)."""
    unsafe = []
    for j in range(N_CLASSES):
        if j != digit:
            row = np.zeros((1, N_CLASSES))
            row[0, digit], row[0, j] = 1.0, -1.0  # logit_digit - logit_j <= 0
            unsafe.append(Polytope(row, np.zeros(1)))
    region = Region(lower.double().numpy(), upper.double().numpy(), tuple(unsafe))
    return VnnlibProperty("<decoded digit>", len(lower), N_CLASSES, (region,))


def write_png(path: Path, image: np.ndarray) -> None:
    """An 8-bit greyscale PNG of `image` (2-D, values in [0, 1]), with zlib alone."""
    pixels = np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)  # filter type 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    height, width = pixels.shape
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
    path.write_bytes(png + chunk(b"IEND", b""))


def panel_grid(rows: list[list[np.ndarray]], scale: int = 12, gap: int = 4) -> np.ndarray:
    """8x8 images laid out in rows, each pixel `scale` x `scale`, on a mid-grey background."""
    size = 8 * scale
    n_cols = max(len(r) for r in rows)
    grid = np.full((len(rows) * (size + gap) + gap, n_cols * (size + gap) + gap), 0.5)
    for i, row in enumerate(rows):
        for j, image in enumerate(row):
            big = np.kron(image.reshape(8, 8), np.ones((scale, scale)))
            top, left = gap + i * (size + gap), gap + j * (size + gap)
            grid[top : top + size, left : left + size] = big
    return grid


def crossing_box(vae, x, y, digit: int, other: int, radius: float):
    """`latent_box` with y_digit and y_other free in [0, 1]: it holds the codes of both digits
    (y = e_other at one corner), so it crosses the classifier's boundary between them."""
    lower, upper = latent_box(vae, x, y, digit, radius)
    lower[digit], lower[other], upper[other] = 0.0, 0.0, 1.0
    return lower, upper


def certify_box(vae, lower, upper, digit: int, timeout: float = 20.0):
    """The decoded pixels' bounds over the box (`verify.bounds`, alpha-CROWN) and
    `verify.verify`'s answer to "decoder -> classifier says `digit` on the whole box"."""
    pixels = verify.bounds(decoded_image(vae), lower=lower[None], upper=upper[None])
    result = verify.verify(decode_then_classify(vae), class_property(lower, upper, digit),
                           timeout=timeout)  # fmt: skip
    return pixels, result


def said(vae, code: torch.Tensor) -> int:
    """The digit the classifier reads in the decoding of `code`, evaluated in float64."""
    with torch.no_grad():
        net = copy.deepcopy(decode_then_classify(vae)).double()
        return int(net(code.double()[None]).argmax(1))


def answer(vae, result) -> str:
    """The table's answer: "proven", the digit a counterexample reads, or the status."""
    if result.status == "sat":
        return f"no: one reads {said(vae, result.counterexample[0])}"
    return "proven" if result.status == "unsat" else result.status


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter training (smoke test)")
    parser.add_argument("--digit", type=int, default=3, choices=range(N_CLASSES))
    parser.add_argument("--out", type=Path, default=None, help="the PNG (default: a temp dir)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="vae_latent_")) / "vae_latent_box.png"
    if not out.parent.is_dir():
        parser.error(f"--out: folder {out.parent} does not exist")
    torch.set_num_threads(1)

    start = time.perf_counter()
    vae, x, y, accuracy = train_vae(steps=400 if args.quick else 1200)
    print(f"semi-supervised VAE (z: {LATENT} dims, {LABELLED:.0%} of labels) trained in "
          f"{time.perf_counter() - start:.1f} s; classifier q(y|x) test accuracy {accuracy:.3f}")  # fmt: skip

    digit = args.digit
    print(f"\nlatent boxes: y = {digit}, z = the {digit}s' mean code +- radius (prior std units)"
          f"\n\n{'radius':>6} {'mean pixel bound width':>23}  {'all decoded read ' + str(digit):<20}"
          f" {'seconds':>7}")  # fmt: skip
    rows = []
    for radius in RADII:
        lower, upper = latent_box(vae, x, y, digit, radius)
        pixels, result = certify_box(vae, lower, upper, digit)
        width = (pixels.upper - pixels.lower).mean().item()
        print(f"{radius:>6.1f} {width:>23.3f}  {answer(vae, result):<20} {result.seconds:>7.2f}")
        centre = decoded_image(vae)((lower + upper)[None] / 2)
        rows.append([t.reshape(64).numpy() for t in (pixels.lower, centre, pixels.upper)])

    other = (digit + 5) % N_CLASSES
    lower, upper = crossing_box(vae, x, y, digit, other, RADII[0])
    _, result = certify_box(vae, lower, upper, digit)
    print(f"\nradius {RADII[0]} with y_{digit}, y_{other} in [0, 1] (crosses the {digit}/{other} "
          f"boundary): {answer(vae, result)}")  # fmt: skip
    if result.counterexample is not None:
        code = result.counterexample[0].numpy()
        print(f"  counterexample: y_{digit} = {code[digit]:.3f}, y_{other} = {code[other]:.3f}, "
              f"z = {np.round(code[N_CLASSES:], 3).tolist()}")  # fmt: skip

    write_png(out, panel_grid(rows))
    print(f"\npicture (a row per radius: lower bound, mean code's image, upper bound): {out}")


if __name__ == "__main__":
    main()
