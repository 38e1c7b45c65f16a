"""Shared helpers for the benchmarks: data paths, instance lists, margins."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import torch

import verify
from verify.specs import margin_spec, region_box, region_spec

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
CIFAR_MEAN = (0.485, 0.456, 0.406)
CIFAR_STD = 0.225


def resolve(folder: Path, name: str) -> Path:
    """`folder/name`, or its `.gz` sibling as VNN-COMP 2022 ships them."""
    path = folder / name
    return path if path.exists() else path.with_name(path.name + ".gz")


def vnncomp_instances(benchmark: str) -> list[tuple[Path, Path]]:
    """(network, property) paths of `instances.csv` of a shared VNN-COMP 2022 benchmark."""
    folder = DATA / "vnncomp2022" / benchmark
    with open(folder / "instances.csv", newline="") as f:
        return [(resolve(folder, r[0]), resolve(folder, r[1])) for r in csv.reader(f) if r]


def vnncomp_timed_instances(benchmark: str) -> list[tuple[Path, Path, float]]:
    """(network, property, timeout seconds) of `instances.csv` of a shared VNN-COMP 2022
    benchmark, in the file's order."""
    folder = DATA / "vnncomp2022" / benchmark
    with open(folder / "instances.csv", newline="") as f:
        return [(resolve(folder, r[0]), resolve(folder, r[1]), float(r[2]))
                for r in csv.reader(f) if r]  # fmt: skip


def vnnlib_problems(net, prop_path: Path):
    """Per region: (lower, upper, C, b, owner, n_polytopes)."""
    problems = []
    for region in verify.load_vnnlib(prop_path).regions:
        lower, upper = region_box(region, net.input_shape)
        C, b, owner = region_spec(region)
        problems.append((lower, upper, C, b, owner, len(region.unsafe)))
    return problems


def region_margin(lower: torch.Tensor, b: torch.Tensor, owner: list[int], n_poly: int) -> float:
    """min over unsafe polytopes of max over their rows of (lower bound of C y) - b: positive iff
    the bounds exclude every polytope (the property is proven)."""
    slack = (lower.reshape(-1) - b).tolist()
    best = [-np.inf] * n_poly
    for s, k in zip(slack, owner):
        best[k] = max(best[k], s)
    return float(min(best))


def cifar_images(n: int):
    """The first `n` CIFAR-10 test images in [0, 1] (3x32x32) and their labels."""
    rows = np.loadtxt(
        DATA / "oval" / "cifar10_test_first100.csv", delimiter=",", max_rows=n, ndmin=2
    )
    images = (
        torch.tensor(rows[:, 1:], dtype=torch.float32).reshape(n, 32, 32, 3).permute(0, 3, 1, 2)
    )
    return images / 255.0, torch.tensor(rows[:, 0], dtype=torch.long)


def cifar_problem(image: torch.Tensor, label: int, eps: float):
    """The normalised eps-ball box around `image` and the margin spec (label vs others)."""
    mean = torch.tensor(CIFAR_MEAN).view(3, 1, 1)
    lower = ((image - eps).clamp(0, 1) - mean) / CIFAR_STD
    upper = ((image + eps).clamp(0, 1) - mean) / CIFAR_STD
    C = margin_spec(torch.tensor([label]), 10)
    return lower[None], upper[None], C, torch.zeros(9), list(range(9)), 9


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def write_json(name: str, payload) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2))
    return path
