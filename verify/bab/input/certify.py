"""Certificates of input splitting (issue 26; format: `verify.certificate`): `CertifyingBab`,
the input-splitting search with its bounder recording every split and every closed domain.

Only plain CROWN on ReLU networks can give a leaf's parameters here (the lower slopes alpha of
the final backward pass: CROWN's adaptive ones), so certificate mode bounds every domain by CROWN
(`certificate_config`: no strong method) and refuses any other method with
`CertificateUnsupportedError` (no fallback: the caller chose it); ReLU splitting writes its own
certificates (`verify.bab.relu.certify`). Splits are read off the kept
sibling pairs the bounder confirms (left child `i` and right child `i + n`: the parent is their
union, the split where they differ), so the brancher's trial of several dimensions is unchanged.

A closed domain's leaves come from its box bounded alone (`RecordingBounder.certify_rows`: CROWN
with every neuron bounded, float64, rounding tracked, the checker's procedure), since a batch's
bound can be a little tighter than any box's alone: the claim is the smaller of that bound and
the search's, less the pruning tolerance, and a domain whose claims do not exclude every
polytope is reopened and split further (never an uncheckable leaf). One leaf per polytope: the
row of largest claim, as a lambda over the polytope's rows (a combination row of
`UnsafeSpec.with_combinations` is the mean of its rows, `combination_weights`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor, nn

from bounds.graph.graph import Graph
from bounds.methods.crown import crown
from bounds.types import Interval, rounded_down
from verify.attack import combination_groups, min_max
from verify.bab.common import RegionOutcome
from verify.bab.config import BabConfig
from verify.bab.input.bounder import InputBounder
from verify.bab.input.domains import Domains
from verify.bab.input.search import RegionBab
from verify.certificate.store import CertificateWriter
from verify.errors import CertificateUnsupportedError
from verify.property import Region

FLUSH = 4096  # records buffered before a batch is appended


def certificate_config(config: BabConfig) -> BabConfig:
    """`config` for certificate mode with input splitting: CROWN for every domain (no strong
    method); `CertificateUnsupportedError` for another method."""
    if config.method != "crown":
        raise CertificateUnsupportedError(
            f"method {config.method!r} cannot give its parameters for a certificate; use 'crown'"
        )
    return replace(config, strong_method=None, splitting="input")


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
        for group in combination_groups(list(range(n))):
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
        self.nodes: dict[bytes, list[int]] = {}
        self.count = 0
        self.splits: list[tuple] = []
        self.leaves: list[tuple] = []

    def node(self, lower: Tensor, upper: Tensor, new: bool = False) -> int:
        """A new node of this box (`new`), else the open node of this box, taken: each open
        domain is used once, as a parent or as a leaf (domains of equal boxes, from a split
        along a zero-width dimension, are interchangeable)."""
        key = lower.detach().cpu().numpy().tobytes() + upper.detach().cpu().numpy().tobytes()
        if new:
            self.count += 1
            self.nodes.setdefault(key, []).append(self.count - 1)
            return self.count - 1
        ids = self.nodes[key]
        found = ids.pop()
        if not ids:
            del self.nodes[key]
        return found

    def pairs(self, d: Domains) -> None:
        """The splits of the kept sibling pairs (left `i`, right `i + n`)."""
        n = len(d) // 2
        for i in range(n):
            ll, lu, rl, ru = d.lower[i], d.upper[i], d.lower[i + n], d.upper[i + n]
            parent = self.node(ll, ru)
            differ = ((lu != ru) | (ll != rl)).nonzero().flatten()
            dim = int(differ[0]) if len(differ) else 0  # a zero-width split: any dimension
            left, right = self.node(ll, lu, True), self.node(rl, ru, True)
            self.splits.append((self.region, parent, dim, float(lu[dim]), left, right))

    def closed(self, lower: Tensor, upper: Tensor, claims: Tensor, alphas: list[Tensor]) -> None:
        """One leaf per polytope of each closed box: its row of largest `claims` (a lower
        bound of `C y - b` less the tolerance) as a lambda over the polytope's rows."""
        claims_np = claims.cpu().numpy()
        lows, ups = lower.double().cpu().numpy(), upper.double().cpu().numpy()
        slopes = [a.cpu().numpy() for a in alphas]
        for k in range(len(lows)):
            node = self.node(lower[k], upper[k])
            for poly in range(self.n_polytopes):
                mine = np.nonzero(self.owner == poly)[0]
                best = mine[np.argmax(claims_np[k, mine])]
                self.leaves.append((self.region, node, poly, self.lambdas[best], claims_np[k, best],
                                    lows[k], ups[k], [a[k] for a in slopes]))  # fmt: skip
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
    at_root = True

    def certify_rows(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Per box alone, CROWN with every neuron of every pre-activation bounded, rounding
        tracked (`crown(..., every_neuron=True)`, float64): lower bounds of `C y - b` `[K, m]`
        and CROWN's adaptive lower slopes per ReLU layer `[K, n_j]` (the checker's procedure:
        a batch's bound can be a little tighter than any box's alone)."""
        graph, spec = self.check.graph, self.check.spec
        out, alphas = [], []
        for start in range(0, len(lower), self.sizer.size):
            part = slice(start, start + self.sizer.size)
            box = Interval(*(t[part].to(spec.C.dtype).reshape(-1, *self.shape)
                             for t in (lower, upper)))  # fmt: skip
            C = spec.C.expand(box.lower.shape[0], *spec.C.shape)
            low, _, intervals = crown(graph, box, C, None, True)
            out.append(low.double() - spec.b.double())
            alphas.append([(intervals[n].upper >= -intervals[n].lower).flatten(1).double()
                           for n in graph.pre_activation_names()])  # fmt: skip
        return torch.cat(out), [torch.cat(parts) for parts in zip(*alphas)]

    def confirm(self, d: Domains, slope_rows: Tensor, slopes: dict[str, Tensor]) -> Domains:
        """`InputBounder.confirm`, then each closed domain's leaves: its box alone bounded by
        `certify_rows`, claiming the smaller of that and the search's bound (less the pruning
        tolerance); a domain whose claim does not exclude every polytope is reopened (never an
        uncheckable leaf)."""
        out = super().confirm(d, slope_rows, slopes)
        if self.at_root:
            self.recorder.node(d.lower[0], d.upper[0], new=True)
            self.at_root = False
        else:
            self.recorder.pairs(d)
        closed = (out.margin > 0).nonzero().flatten()
        if not len(closed):
            return out
        rows, alphas = self.certify_rows(out.lower[closed], out.upper[closed])
        rows = torch.minimum(rows, out.rows[closed].double().to(rows.device))
        spec, tol = self.check.spec, self.tol.double().to(rows.device)
        margin = min_max(rows - tol, spec.owner.to(rows.device), spec.n_polytopes)
        kept = (margin > 0).to(closed.device)
        self.recorder.closed(out.lower[closed[kept]], out.upper[closed[kept]], rows[kept] - tol,
                             [a[kept] for a in alphas])  # fmt: skip
        reopen = closed[~kept]
        self.stats["certificate_reopened"] = self.stats.get("certificate_reopened", 0) + len(reopen)
        if not len(reopen):
            return out
        new_rows, new_margin = out.rows.clone(), out.margin.clone()
        new_rows[reopen] = rounded_down(rows[~kept], new_rows.dtype).to(new_rows.device)
        new_margin[reopen] = margin[~kept].clamp(max=0).to(new_margin.dtype).to(closed.device)
        return Domains(out.lower, out.upper, new_rows, new_margin, out.depth)


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

    def run(self, deadline: float) -> RegionOutcome:
        outcome = super().run(deadline)
        self.recorder.flush()
        return outcome
