"""Certificates of input splitting (issue 26; format: `verify.certificate`): `CertifyingBab`,
the input-splitting search with its bounder recording every split and every closed domain.

Only plain CROWN on ReLU networks can give a leaf's parameters (the lower slopes alpha of the
final backward pass: CROWN's adaptive ones, from the intermediate bounds of the call that
closed the domain), so certificate mode bounds every domain by CROWN (`certificate_config`:
no strong method) and refuses any other method with `CertificateUnsupportedError`, as it does
ReLU splitting. Splits are read off the kept sibling pairs the bounder confirms (left child `i`
and right child `i + n`: the parent is their union, the split where they differ), so the
brancher's trial of several dimensions is unchanged. A closed domain gives one leaf per polytope:
the row of largest margin, as a lambda over the polytope's rows (a combination row of
`UnsafeSpec.with_combinations` is the mean of its rows), claiming its float32 bound less the
pruning tolerance."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bounds.graph.graph import Graph
from bounds.types import Budget
from verify.bab.config import BabConfig
from verify.bab.input.bounder import InputBounder
from verify.bab.input.domains import Domains
from verify.bab.input.methods import bounds
from verify.bab.input.search import RegionBab
from verify.certificate.store import CertificateWriter
from verify.errors import CertificateUnsupportedError
from verify.property import Region

FLUSH = 4096  # records buffered before a batch is appended


def certificate_config(config: BabConfig) -> BabConfig:
    """`config` for certificate mode: CROWN for every domain (no strong method), input
    splitting, one trial dimension per split (the slopes are those of the kept children); `CertificateUnsupportedError` for another method or ReLU splitting."""
    if config.method != "crown":
        raise CertificateUnsupportedError(
            f"method {config.method!r} cannot give its parameters for a certificate; use 'crown'"
        )
    if config.splitting == "relu":
        raise CertificateUnsupportedError("ReLU splitting cannot write certificates yet")
    return replace(config, strong_method=None, splitting="input", trial_dims=1)


def combination_weights(region: Region, max_rows: int = 6) -> list[tuple[int, np.ndarray]]:
    """Per row of `UnsafeSpec.of(region).with_combinations(max_rows)`: its polytope and its
    lambda over that polytope's rows (the same order as `with_combinations`)."""
    out = []
    for poly, p in enumerate(region.unsafe):
        out += [(poly, np.eye(len(p.b))[i]) for i in range(len(p.b))]
    for poly, p in enumerate(region.unsafe):
        n = len(p.b)
        if not 2 <= n <= max_rows:
            continue
        groups = [[i, j] for i in range(n) for j in range(i + 1, n)]
        groups += [list(range(n))] if n >= 3 else []
        for group in groups:
            lam = np.zeros(n)
            lam[group] = 1.0 / len(group)
            out.append((poly, lam))
    return out


class Recorder:
    """The records of one region, buffered and appended to `writer` in batches."""

    def __init__(self, writer: CertificateWriter, region_index: int, region: Region,
                 combine: bool) -> None:  # fmt: skip
        self.writer, self.region = writer, region_index
        weights = combination_weights(region) if combine else combination_weights(region, 0)
        self.owner = np.array([p for p, _ in weights], dtype=np.int64)
        width = max((len(p.b) for p in region.unsafe), default=0)
        self.lambdas = np.zeros((len(weights), width))
        for r, (_, lam) in enumerate(weights):
            self.lambdas[r, : len(lam)] = lam
        self.n_polytopes = len(region.unsafe)
        self.nodes: dict[bytes, int] = {}
        self.splits: list[tuple] = []
        self.leaves: list[tuple] = []

    def node(self, lower: Tensor, upper: Tensor, new: bool = False) -> int:
        key = lower.detach().cpu().numpy().tobytes() + upper.detach().cpu().numpy().tobytes()
        if new:
            self.nodes[key] = len(self.nodes)
        return self.nodes[key]

    def pairs(self, d: Domains) -> None:
        """The splits of the kept sibling pairs (left `i`, right `i + n`)."""
        n = len(d) // 2
        for i in range(n):
            ll, lu, rl, ru = d.lower[i], d.upper[i], d.lower[i + n], d.upper[i + n]
            parent = self.node(ll, ru)
            dim = int(((lu != ru) | (ll != rl)).nonzero().flatten()[0])
            left, right = self.node(ll, lu, True), self.node(rl, ru, True)
            self.splits.append((self.region, parent, dim, float(lu[dim]), left, right))

    def closed(self, d: Domains, rows: Tensor, index: Tensor, tol: Tensor,
               alphas: list[Tensor]) -> None:  # fmt: skip
        """One leaf per polytope of each closed domain `index`: its best row's lambda, claiming
        its bound `rows` less `tol`."""
        rows = (rows[index].double() - tol.double()).cpu().numpy()
        for k, i in enumerate(index.tolist()):
            node = self.node(d.lower[i], d.upper[i])
            for poly in range(self.n_polytopes):
                mine = np.nonzero(self.owner == poly)[0]
                best = mine[np.argmax(rows[k, mine])]
                self.leaves.append((self.region, node, poly, self.lambdas[best], rows[k, best],
                                    d.lower[i].double().cpu().numpy(),
                                    d.upper[i].double().cpu().numpy(),
                                    [a[i].double().cpu().numpy() for a in alphas]))  # fmt: skip
        if len(self.splits) + len(self.leaves) >= FLUSH:
            self.flush()

    def flush(self) -> None:
        members: dict[str, np.ndarray] = {}
        if self.splits:
            ints = np.array([(s[0], s[1], s[2], s[4], s[5]) for s in self.splits], np.int64)
            members |= {"split_ints": ints, "split_point": np.array([s[3] for s in self.splits])}
        if self.leaves:
            members |= {"leaf_ints": np.array([leaf[:3] for leaf in self.leaves], np.int64),
                        "leaf_lambda": np.stack([leaf[3] for leaf in self.leaves]),
                        "leaf_claim": np.array([leaf[4] for leaf in self.leaves]),
                        "leaf_lower": np.stack([leaf[5] for leaf in self.leaves]),
                        "leaf_upper": np.stack([leaf[6] for leaf in self.leaves])}  # fmt: skip
            for j in range(len(self.leaves[0][7])):
                members[f"leaf_alpha{j}"] = np.stack([leaf[7][j] for leaf in self.leaves])
        if members:
            self.writer.append(members)
        self.splits, self.leaves = [], []


class RecordingBounder(InputBounder):
    """The CROWN bounder, recording (module docstring); `recorder` set after construction."""

    recorder: Recorder
    captured: list[list[Tensor]]
    rows64: Tensor | None = None
    at_root = True

    def measure(self, d: Domains) -> tuple[Domains, Tensor, dict[str, Tensor]]:
        self.captured = []
        return super().measure(d)

    def _call_bounds(self, lower, upper, strong: bool, slopes: list | None = None) -> Tensor:
        method, _ = self.methods[strong]
        result = bounds(self.graph, lower=lower.reshape(-1, *self.shape),
                        upper=upper.reshape(-1, *self.shape), C=self.spec.C, method=method,
                        exact=False, budget=Budget(seconds=max(1e-3, self.clock.left())),
                        config=self.configs[strong])  # fmt: skip
        self.stats["batches"] += 1
        alphas = []
        for name in self.graph.pre_activation_names():
            box = result.intermediate[name]
            alphas.append((box.upper >= -box.lower).flatten(1).to(torch.float64))
        self.captured.append(alphas)
        return result.lower - self.spec.b

    def _bounds64(self, lower, upper, depth, slope_rows, slopes) -> Tensor:
        self.rows64 = super()._bounds64(lower, upper, depth, slope_rows, slopes)
        return self.rows64

    def confirm(self, d: Domains, slope_rows: Tensor, slopes: dict[str, Tensor]) -> Domains:
        """The closed domains' leaves claim their float64 recheck's bound (the bound the
        search trusts; the float32 one when the recheck is off)."""
        self.rows64 = None
        before = (d.margin > 0).nonzero().flatten()
        out = super().confirm(d, slope_rows, slopes)
        rows = out.rows.double()
        if self.rows64 is not None:
            rows[before] = self.rows64.to(rows.device)
        if self.at_root:
            self.recorder.node(d.lower[0], d.upper[0], new=True)
            self.at_root = False
        else:
            self.recorder.pairs(d)
        alphas = [torch.cat(parts) for parts in zip(*self.captured)]
        if alphas and alphas[0].shape[0] != len(d):  # k > 1 trial: the kept pairs
            raise CertificateUnsupportedError("certificates need trial_dims = 1")
        index = (out.margin > 0).nonzero().flatten()
        self.recorder.closed(out, rows, index, self.tol, alphas)
        return out


class CertifyingBab(RegionBab):
    """`RegionBab` whose bounder records into `recorder` (`run` flushes at the end)."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int,
                 graph: Graph | None, recorder: Recorder) -> None:  # fmt: skip
        super().__init__(net, region, certificate_config(config), seed, graph)
        old = self.bounder
        bounder = RecordingBounder(old.graph, old.spec, old.config, old.check, old.sizer,
                                   old.stats, old.clock, old.root_box)  # fmt: skip
        bounder.recorder = recorder
        self.bounder, self.recorder = bounder, recorder

    def run(self, deadline: float) -> Any:
        outcome = super().run(deadline)
        self.recorder.flush()
        return outcome
