"""Quickstart: train a small MLP on scikit-learn's bundled digits (real data, a few seconds), then
bound its classification margins over an L-inf ball around test images with every method.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import time

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import verify
from bounds import available_methods
from verify.specs import margin_spec

EPS = 0.05  # on pixels scaled to [0, 1]
N_IMAGES = 5


def train_digits_mlp(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A 64-32-32-10 ReLU MLP trained for a few seconds; returns it and the test set."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed)
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)
    )
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=1e-4)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x_tr), y_tr).backward()
        opt.step()
    net.eval().requires_grad_(False)
    accuracy = (net(x_te).argmax(1) == y_te).float().mean().item()
    print(f"digits MLP 64-32-32-10: test accuracy {accuracy:.3f}")
    return net, x_te, y_te


def main() -> None:
    torch.set_num_threads(1)
    net, x_te, y_te = train_digits_mlp()
    x, labels = x_te[:N_IMAGES], y_te[:N_IMAGES]
    C = margin_spec(labels, 10)
    print(f"\nmargins y_label - y_j over the L-inf ball eps={EPS} (clipped to [0, 1]) "
          f"around {N_IMAGES} test images; robust = every lower bound > 0\n")  # fmt: skip
    print(f"{'method':<12} {'mean lower margin':>18} {'robust':>7} {'seconds':>8}")
    for method in available_methods():
        if method == "milp":
            continue  # exact but exponential: meant for tiny nets in tests
        start = time.perf_counter()
        result = verify.bounds(net, EPS, x=x, C=C, domain=(0.0, 1.0), method=method)
        seconds = time.perf_counter() - start
        robust = int((result.lower > 0).all(dim=1).sum())
        mean = result.lower.mean().item()
        print(f"{method:<12} {mean:>18.4f} {robust:>4}/{N_IMAGES} {seconds:>8.3f}")


if __name__ == "__main__":
    main()
