"""A certified activation monitor for a small DLRM (Naumov et al., "Deep Learning
Recommendation Model for Personalization and Recommendation Systems", 2019), trained here on
a synthetic click-through task with a known generating rule, and a fault campaign comparing
certified clipping with clipping at fixed +-6 and +-100 (the error models and the fixed
ranges of Ma et al., "Evaluating and Enhancing Robustness of Deep Recommendation Systems
Against Hardware Errors", 2023).

The model: 13 dense features -> bottom MLP -> a 16-d vector `z`; 8 sparse features, each a
row of its own 1,000 x 16 table; the pairwise dot products of the 9 vectors (36 of them,
`T T^T` below the diagonal) concatenated with `z` -> top MLP -> the click logit.

Input. `verify.monitor` bounds networks of one float input, so the model takes one tensor
`x = [dense (13) | ids (8)]`: the ids are the rows, stored as exact integers in float32 and
cast with `.long()` (truncation) before the lookup. The monitor's domain is then one box: the
dense features' box and, for each id, `[0, rows - 1]` (all valid rows; a narrower range
restricts the rows; a range that leaves the table is refused by name, see
`bounds.ops.embedding`).

The generating rule: `logit = 1.5 w . d' + sum_k b_k[id_k] + (P d') . V_0[id_0] + V_1[id_1] .
V_2[id_2] + V_3[id_3] . V_4[id_4] - 1` with `d' = 2 d - 1`, random Gaussian `w`, `P [4, 13]`,
latent row factors `V_k [rows, 4]` and row biases `b_k`; ids drawn with a power law (row `r`
has probability about proportional to `1 / (r + 10)`); a click is a Bernoulli draw of
`sigmoid(logit)`.

Run: python examples/dlrm_monitor.py [--trials N] [--quick] (1 thread, under a minute).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify.monitor import Box, Monitor, monitor
from verify.monitor.faults import (
    activation_sites,
    inject,
    sample_faults,
    weight_sites,
)

DENSE, TABLES, ROWS, DIM = 13, 8, 1000, 16


class DLRM(nn.Module):
    """Bottom MLP on the dense features, one embedding table per sparse feature, the pairwise
    dot products of the 9 vectors, top MLP -> one click logit (Naumov et al. 2019, Fig. 1)."""

    def __init__(self, dense: int = DENSE, tables: int = TABLES, rows: int = ROWS,
                 dim: int = DIM, hidden: int = 64) -> None:  # fmt: skip
        super().__init__()
        self.dense = dense
        self.input_shape = (dense + tables,)
        self.bottom = nn.Sequential(nn.Linear(dense, hidden), nn.ReLU(), nn.Linear(hidden, dim),
                                    nn.ReLU())  # fmt: skip
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        for table in self.tables:
            nn.init.uniform_(table.weight, -(rows**-0.5), rows**-0.5)  # DLRM's initialisation
        n = tables + 1
        below_i, below_j = torch.tril_indices(n, n, -1)
        self.register_buffer("pairs", below_i * n + below_j)  # T T^T below the diagonal, flat
        self.top = nn.Sequential(nn.Linear(dim + len(below_i), hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        z = self.bottom(x[:, : self.dense])
        ids = x[:, self.dense :].long()
        vectors = torch.stack([z, *(table(ids[:, k]) for k, table in enumerate(self.tables))], 1)
        dots = torch.matmul(vectors, vectors.transpose(1, 2)).flatten(1)[:, self.pairs]
        return self.top(torch.cat([z, dots], 1))


def domain(rows: int = ROWS) -> Box:
    """The dense features' box [0, 1]^13 and every valid row for each id."""
    lower = torch.cat([torch.zeros(DENSE), torch.zeros(TABLES)])
    upper = torch.cat([torch.ones(DENSE), torch.full((TABLES,), float(rows - 1))])
    return Box(lower, upper)


@dataclass
class Task:
    """The synthetic click-through task's hidden rule (module docstring)."""

    w: Tensor
    P: Tensor
    V: Tensor  # [TABLES, ROWS, 4]
    b: Tensor  # [TABLES, ROWS]

    @staticmethod
    def make(seed: int = 0) -> Task:
        g = torch.Generator().manual_seed(seed)
        return Task(torch.randn(DENSE, generator=g), torch.randn(4, DENSE, generator=g) / 3,
                    torch.randn(TABLES, ROWS, 4, generator=g),
                    0.7 * torch.randn(TABLES, ROWS, generator=g))  # fmt: skip

    def sample(self, n: int, seed: int) -> tuple[Tensor, Tensor]:
        """`n` inputs `[n, 21]` and their clicks `[n]` (0/1 floats)."""
        g = torch.Generator().manual_seed(seed)
        dense = torch.rand(n, DENSE, generator=g)
        weights = (torch.arange(ROWS, dtype=torch.float64) + 1) ** -1.1
        ids = torch.multinomial(weights, n * TABLES, replacement=True, generator=g)
        ids = ids.reshape(n, TABLES)
        d = 2 * dense - 1
        k = torch.arange(TABLES)
        V = self.V[k, ids]  # [n, TABLES, 4]
        logit = (1.5 * d @ self.w / DENSE**0.5 + self.b[k, ids].sum(1) + ((d @ self.P.T) * V[:, 0]).sum(1)
                 + (V[:, 1] * V[:, 2]).sum(1) + (V[:, 3] * V[:, 4]).sum(1) - 1)  # fmt: skip
        clicks = torch.bernoulli(torch.sigmoid(logit), generator=g)
        return torch.cat([dense, ids.float()], 1), clicks


def auc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted half); NaN scores
    rank lowest."""
    s = torch.nan_to_num(scores.double(), nan=-np.inf).numpy()
    y = labels.numpy() > 0.5
    ranks = rankdata(s)  # mean ranks of ties, 1-based
    pos, neg = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def train(net: DLRM, x: Tensor, y: Tensor, epochs: int = 2, batch: int = 256,
          lr: float = 1e-2, seed: int = 0) -> None:  # fmt: skip
    """Adam on the binary cross-entropy of the click logit."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            opt.zero_grad()
            loss_fn(net(x[idx])[:, 0], y[idx]).backward()
            opt.step()
    net.eval()


def trained_model(quick: bool = False, seed: int = 0) -> tuple[DLRM, Task, Tensor, Tensor]:
    """The trained DLRM, its task and a held-out test set `(x, clicks)`."""
    task = Task.make(seed)
    torch.manual_seed(seed)
    net = DLRM()
    x, y = task.sample(30_000 if quick else 100_000, seed + 1)
    train(net, x, y)
    test_x, test_y = task.sample(4_000, seed + 2)
    return net, task, test_x, test_y


# --- the fault campaign ---------------------------------------------------------------------

FIXED = (6.0, 100.0)  # the fixed clipping ranges +-6 and +-100 (Ma et al. 2023)
MODELS = ("value", "exponent")  # the study's random-value and exponent-only error models
TARGETS = ("weight", "activation")
HARMFUL = 0.005  # an AUC loss above this is a harmful fault (an SDC of the ranking)


def protections(net: DLRM, mon: Monitor) -> dict[str, nn.Module]:
    """The network unprotected, with certified clipping, and with fixed +-6 / +-100 clipping,
    all on the monitor's default node set (pre-activations, lookups, interaction, output)."""
    nodes = mon.affine
    out: dict[str, nn.Module] = {"none": net, "certified": mon.wrap(net, "clip")}
    for r in FIXED:
        out[f"fixed +-{r:g}"] = mon.wrap(net, "clip", ranges={n: (-r, r) for n in nodes})
    return out


def false_clip_rates(net: DLRM, mon: Monitor, x: Tensor) -> dict[str, float]:
    """Per protection: the share of clean inputs on which some monitored value lies outside
    its clipping range (so clipping changes that inference)."""
    rates = {}
    with torch.no_grad():
        certified = mon.wrap(net, "detect", checksums=False)
        certified(x)
        rates["certified"] = float(certified.report.flagged.float().mean())
        for r in FIXED:
            fixed = mon.wrap(net, "detect", ranges={n: (-r, r) for n in mon.affine},
                             checksums=False)  # fmt: skip
            fixed(x)
            rates[f"fixed +-{r:g}"] = float(fixed.report.flagged.float().mean())
    return rates


def run_campaign(net: DLRM, mon: Monitor, x: Tensor, y: Tensor, trials: int,
                 seed: int = 0) -> dict:  # fmt: skip
    """`trials` faults per error model and target (weights: one element of any parameter,
    tables included; activations: one element of a submodule's output, on every input), each
    run on the held-out set `(x, y)` by every protection. Returns the clean AUCs, and per
    (model, target) and protection: the mean AUC, the share of harmful faults (unprotected AUC
    loss over `HARMFUL`) and, over those, the mean share of the AUC loss recovered and the
    share recovered to within `HARMFUL` of the clean AUC."""
    guards = protections(net, mon)
    with torch.no_grad():
        clean = {k: auc(g(x)[:, 0], y) for k, g in guards.items()}
        sites = {"weight": weight_sites(net), "activation": activation_sites(net, x[:2])}
        cells = {}
        for model in MODELS:
            for target in TARGETS:
                faults = sample_faults(sites[target], trials, target=target, model=model,
                                       seed=seed)  # fmt: skip
                scores = {k: [] for k in guards}
                for trial in faults:
                    with inject(net, trial):
                        for k, g in guards.items():
                            scores[k].append(auc(g(x)[:, 0], y))
                cells[f"{model}/{target}"] = _summary(scores, clean["none"])
    return {"clean_auc": clean, "trials": trials, "cells": cells}


def _summary(scores: dict[str, list[float]], clean: float) -> dict[str, dict]:
    none = np.array(scores["none"])
    harmful = clean - none > HARMFUL
    out = {}
    for k, values in scores.items():
        v = np.array(values)
        lost = clean - none[harmful]
        recovered = (v[harmful] - none[harmful]) / lost if harmful.any() else np.array([])
        out[k] = {
            "mean_auc": float(v.mean()),
            "harmful_share": float(harmful.mean()),
            "recovered_share": float(recovered.mean()) if recovered.size else float("nan"),
            "recovered_within": float((clean - v[harmful] <= HARMFUL).mean())
            if harmful.any()
            else float("nan"),
        }
    return out


def table(result: dict, fp: dict[str, float]) -> str:
    """The campaign as a markdown table."""
    names = list(result["clean_auc"])
    lines = [
        "| protection | clean AUC | false clips (clean) | "
        + " | ".join(f"{c}: AUC / recovered / within" for c in result["cells"])
        + " |",
        "|" + "---|" * (3 + len(result["cells"])),
    ]
    for k in names:
        row = [k, f"{result['clean_auc'][k]:.4f}", f"{fp.get(k, 0.0):.2%}" if k != "none" else "-"]
        for cell in result["cells"].values():
            c = cell[k]
            row.append(f"{c['mean_auc']:.4f} / {c['recovered_share']:.2f} / "
                       f"{c['recovered_within']:.2f}")  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    harm = ", ".join(f"{c}: {v['none']['harmful_share']:.0%}" for c, v in result["cells"].items())
    lines.append(f"\nHarmful faults (unprotected AUC loss > {HARMFUL}): {harm}; {result['trials']} "
                 "trials per cell; 'recovered': mean share of the AUC loss clipping wins back "
                 f"on the harmful faults; 'within': share of them brought within {HARMFUL} of "
                 "the clean AUC.")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="faults per model and target")
    parser.add_argument("--quick", action="store_true", help="less training data (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    net, _, x, y = trained_model(args.quick)
    print(
        f"trained in {time.perf_counter() - start:.1f} s; test AUC {auc(net(x)[:, 0].detach(), y):.4f}"
    )
    start = time.perf_counter()
    mon = monitor(net, domain())
    print(f"certified monitor of {len(mon.nodes)} nodes in {time.perf_counter() - start:.1f} s")
    for name in ("tables_0", "matmul", "cat", "top_2"):
        low, high = mon.ranges[name]
        print(f"  {name:9s} range [{float(low.min()):9.3f}, {float(high.max()):9.3f}]")
    fp = false_clip_rates(net, mon, x)
    start = time.perf_counter()
    result = run_campaign(net, mon, x, y, args.trials)
    print(f"fault campaign ({args.trials} trials per cell) in {time.perf_counter() - start:.1f} s")
    print(table(result, fp))
    return {"campaign": result, "false_clips": fp}


if __name__ == "__main__":
    main()
