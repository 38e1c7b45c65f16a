"""Dense CRF as the post-processing of a segmentation network (the DeepLab pipeline, in small).

A synthetic task: 64 x 64 images of a few flat-coloured shapes (discs, boxes, bars: 4 classes
with background) under pixel noise. A tiny fully convolutional network that, like the
DeepLab-style networks the dense CRF was made for, predicts at a quarter of the resolution
(two stride-2 convolutions, a 1 x 1 classifier, bilinear upsampling of the logits) is trained
here for a few seconds; its softmax is right inside the shapes and blurred along their edges.
The CRF (the classic pydensecrf parameters) refines the whole test batch in one batched call
(``crf.DenseCRF(images, probs=softmax)``, 5 mean-field iterations, tensors in and out), which
snaps the labels to the colour edges; pixel accuracy and mean IoU are reported before and
after.

    python examples/crf_segmentation.py [--steps 150] [--device cpu|cuda] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

import crf

SIZE, CLASSES = 64, 4
COLOURS = np.array([(90, 90, 90), (200, 60, 50), (60, 170, 70), (60, 80, 210)], np.float64)
NOISE = 20.0  # per-channel pixel noise (0-255 scale)


def make_batch(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (n, S, S, 3) uint8 and their labels (n, S, S) int64."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    labels = np.zeros((n, SIZE, SIZE), np.int64)
    for i in range(n):
        for _ in range(rng.integers(2, 5)):
            cls = int(rng.integers(1, CLASSES))
            cy, cx = rng.uniform(8, SIZE - 8, 2)
            r = rng.uniform(5, 14)
            if cls == 1:  # disc
                mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2
            elif cls == 2:  # box
                mask = (abs(yy - cy) <= r * 0.8) & (abs(xx - cx) <= r)
            else:  # bar
                mask = (abs(yy - cy) <= 3) & (abs(xx - cx) <= 1.8 * r)
            labels[i][mask] = cls
    img = COLOURS[labels] + rng.normal(0.0, NOISE, (n, SIZE, SIZE, 3))
    return np.clip(img, 0, 255).astype(np.uint8), labels


class Network(nn.Module):
    """Logits at 1/4 resolution (two stride-2 3 x 3 convolutions, a 1 x 1 classifier),
    upsampled bilinearly to the input size: (n, 3, S, S) -> (n, CLASSES, S, S)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, CLASSES, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.body(x)
        return nn.functional.interpolate(logits, size=x.shape[-2:], mode="bilinear")


def _tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(images).to(device).permute(0, 3, 1, 2).float() / 255.0


def train(steps: int, rng: np.random.Generator, device: torch.device) -> nn.Module:
    """Train the network with Adam on fresh synthetic batches."""
    net = Network().to(device)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(steps):
        images, labels = make_batch(16, rng)
        loss = nn.functional.cross_entropy(
            net(_tensor(images, device)), torch.from_numpy(labels).to(device)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def scores(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """Pixel accuracy and mean IoU over the classes present in ``truth`` or ``pred``."""
    acc = float((pred == truth).mean())
    ious = []
    for c in range(CLASSES):
        union = np.logical_or(pred == c, truth == c).sum()
        if union:
            ious.append(np.logical_and(pred == c, truth == c).sum() / union)
    return acc, float(np.mean(ious))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps")
    parser.add_argument("--test", type=int, default=8, help="test images (one CRF batch)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a shared CPU: see the project's benchmarking notes
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)
    start = time.perf_counter()
    net = train(args.steps, rng, device)
    train_s = time.perf_counter() - start
    images, truth = make_batch(args.test, rng)
    with torch.no_grad():
        probs = torch.softmax(net(_tensor(images, device)), 1).permute(0, 2, 3, 1)
    before = scores(probs.argmax(-1).cpu().numpy(), truth)
    start = time.perf_counter()
    model = crf.DenseCRF(  # the classic parameters: w 3 / 10, sigmas 3 px, 80 px and 13
        torch.from_numpy(images).to(device),  # tensors in, tensors out (on the device)
        probs=probs.contiguous(),
    )
    refined = model.map("meanfield", iterations=5, energy=False).labels.cpu().numpy()
    crf_s = time.perf_counter() - start
    after = scores(refined, truth)
    print(f"network trained in {train_s:.1f} s; CRF on {args.test} images: {crf_s:.2f} s")
    print(f"{'':12s} {'pixel acc':>10s} {'mean IoU':>10s}")
    for name, (acc, miou) in (("network", before), ("+ dense CRF", after)):
        print(f"{name:12s} {acc:10.4f} {miou:10.4f}")
    return {"before": before, "after": after, "crf_seconds": crf_s}


if __name__ == "__main__":
    main()
