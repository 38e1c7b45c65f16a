"""Certificates of ReLU splitting (issue 26; format: `verify.certificate`): `CertifyingReluBab`,
the ReLU-splitting search (alpha-beta-CROWN, Wang et al. 2021, "Beta-CROWN") with its bounder
and brancher recording every split and every closed domain.

Certificate mode (`relu_certificate_config`) switches off what cannot give a leaf's parameters,
with a documented fallback, never an uncheckable leaf: the root's intermediate bounds are not
tightened (`intermediate_iterations=0`, `root_intermediate="alpha-crown"`: no alpha-CROWN nor
dual tightening), no hard bounder (`prox_iterations=0`), and the float64 recheck is on (it keeps
each bound's slopes and multipliers, `SplitResult.best_alpha`). The root's intermediate bounds
are then the checker's own (`crown64.intervals` on the region's box from the VNN-LIB file, over
the network's chain of affine layers and ReLUs, `chain_layers`), rounded outwards for the search,
so that every domain's clamped intervals are the checker's (`RecordingReluBounder.set_base`).

Recorded (`ReluRecorder`): per (region, polytope) a tree whose node 0 is the root domain; each
split `(region, polytope, parent, relu_layer, neuron, inactive_child, active_child)` (the
brancher's children: active first, `RecordingReluBrancher.split`); each closed domain a leaf
`(region, node, polytope)`, lambda = the unit vector of its best row, the claim, the slopes
alpha and multipliers beta (zero at unsplit neurons) of that row per ReLU layer. A domain is
known by its polytope and split vector (two nodes of a tree never share both). Before a leaf is
written its bound is evaluated by the checker's procedure itself (`crown64.backward` on the
checker's intervals clamped by the splits, with the split multipliers); the claim is that bound
less the pruning tolerance (which dominates by far any difference of summation order), and a
domain whose claim is not > 0 is reopened and split further. A node whose clamped intervals are
empty (its splits contradict) contains no input: its leaf claims the tolerance."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor, nn

from bounds.graph.graph import Graph
from bounds.ops.activation import ActivationOp
from bounds.ops.base import UnaryAffineOp
from bounds.types import Interval, rounded_down
from verify.bab.common import RegionOutcome
from verify.bab.config import BabConfig
from verify.bab.relu.bounder import ReluBounder
from verify.bab.relu.brancher import ReluBrancher
from verify.bab.relu.domains import ReluDomains, Target
from verify.bab.relu.search import ReluBab
from verify.certificate.crown64 import Layer, backward, intervals
from verify.certificate.store import CertificateWriter
from verify.errors import CertificateUnsupportedError
from verify.property import Region

FLUSH = 4096  # records buffered before a batch is appended
CHUNK = 256  # leaves per float64 backward pass


def relu_certificate_config(config: BabConfig) -> BabConfig:
    """`config` for certificate mode with ReLU splitting (module docstring)."""
    relu = replace(config.relu, intermediate_iterations=0, root_intermediate="alpha-crown",
                   prox_iterations=0)  # fmt: skip
    return replace(config, splitting="relu", float64_recheck=True, relu=relu,
                   recheck_tol=config.prune_tol)  # fmt: skip


def chain_layers(graph: Graph) -> list[Layer]:
    """The graph as the checker's chain (`crown64.Layer`): each run of single-input affine ops
    composed (in float64) into one layer, ended by a ReLU or the output;
    `CertificateUnsupportedError` for another op or a graph that is not a chain."""
    layers: list[Layer] = []
    n_in = int(torch.Size(graph.input.shape).numel())
    eye = torch.eye(n_in, dtype=torch.float64)
    weight, bias, previous = eye, torch.zeros(1, n_in, dtype=torch.float64), graph.input.name
    for node in graph.nodes[1:]:
        if list(node.inputs) != [previous]:
            raise CertificateUnsupportedError(f"certificates: {node.name} breaks the chain")
        previous, op = node.name, node.op
        if isinstance(op, UnaryAffineOp):
            op = op.to(torch.float64, "cpu")
            weight = op.linear(weight.reshape(-1, *op.in_shape)).reshape(len(weight), -1)
            bias = op.forward(bias.reshape(1, *op.in_shape)).reshape(1, -1)
        elif isinstance(op, ActivationOp) and op.relaxation.name == "relu":
            layers.append((weight.T.numpy().copy(), bias[0].numpy().copy(), True))
            n = weight.shape[1]
            weight, bias = torch.eye(n, dtype=torch.float64), torch.zeros(1, n, dtype=torch.float64)
        else:
            raise CertificateUnsupportedError(f"certificates: {node.name} is not affine or ReLU")
    layers.append((weight.T.numpy().copy(), bias[0].numpy().copy(), False))
    return layers


class ReluRecorder:
    """The records of one region's ReLU-split trees (one per polytope), buffered and appended
    to `writer` in batches; `layers` the checker's chain of the network."""

    def __init__(self, writer: CertificateWriter, region_index: int, region: Region,
                 layers: list[Layer]) -> None:  # fmt: skip
        self.writer, self.region, self.layers = writer, region_index, layers
        self.polys = [(np.asarray(p.A, np.float64), np.asarray(p.b, np.float64))
                      for p in region.unsafe]  # fmt: skip
        self.width = max((len(b) for _, b in self.polys), default=0)
        box = (
            np.asarray(region.lower, np.float64)[None],
            np.asarray(region.upper, np.float64)[None],
        )
        self.box, self.bounds = box, intervals(layers, box)
        self.relus = [k for k, (_, _, relu) in enumerate(layers, start=1) if relu]
        self.sizes = [layers[k - 1][0].shape[0] for k in self.relus]
        self.offsets = np.cumsum([0, *self.sizes])
        self.nodes: dict[tuple[int, bytes], int] = {}
        self.count = [1] * len(self.polys)  # node 0: the root of each polytope's tree
        self.splits: list[tuple] = []
        self.leaves: list[tuple] = []

    def root_flat(self) -> Tensor:
        """`[2, total]` float64: the lower and upper root bounds of every ReLU neuron."""
        lower = np.concatenate([self.bounds[k - 1][0][0] for k in self.relus])
        upper = np.concatenate([self.bounds[k - 1][1][0] for k in self.relus])
        return torch.from_numpy(np.stack([lower, upper]))

    def node(self, poly: int, splits: np.ndarray, new: bool = False) -> int:
        """A new node of this split vector (`new`), else the open one, taken (used once, as a
        parent or as a leaf); the root (no split) is node 0."""
        key = (poly, splits.tobytes())
        if new:
            self.nodes[key], self.count[poly] = self.count[poly], self.count[poly] + 1
            return self.nodes[key]
        return self.nodes.pop(key) if splits.any() else 0

    def split(self, parents: np.ndarray, poly: np.ndarray, choice: np.ndarray,
              children: np.ndarray) -> None:  # fmt: skip
        """Parent `i` split on the flat neuron `choice[i]` into `children[i]` (active) and
        `children[i + n]` (inactive)."""
        n = len(parents)
        layer = np.searchsorted(self.offsets, choice, side="right") - 1
        for i in range(n):
            p = int(poly[i])
            parent = self.node(p, parents[i])
            active, inactive = self.node(p, children[i], True), self.node(p, children[i + n], True)
            index = int(choice[i] - self.offsets[layer[i]])
            self.splits.append((self.region, p, parent, int(layer[i]), index, inactive, active))

    def per_layer(self, flat: np.ndarray) -> dict[int, np.ndarray]:
        """`flat [K, total]` as `{crown64 layer k: [K, n_k]}` of the ReLU layers."""
        return {k: flat[:, o : o + n] for k, o, n in zip(self.relus, self.offsets, self.sizes)}

    def clamped(self, splits: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The root intervals `[K, n_j]` of every layer clamped by `splits [K, total]`."""
        signs = self.per_layer(splits)
        out = []
        for k, (lower, upper) in enumerate(self.bounds, start=1):
            lower, upper = np.repeat(lower, len(splits), 0), np.repeat(upper, len(splits), 0)
            if k in signs:
                lower = np.where(signs[k] > 0, np.maximum(lower, 0), lower)
                upper = np.where(signs[k] < 0, np.minimum(upper, 0), upper)
            out.append((lower, upper))
        return out

    def derive(self, splits: np.ndarray, poly: int, row: int, alpha: np.ndarray,
               beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """`([K] the checker's lower bound of row `row` of C y - b, [K] empty)` for the
        domains `splits [K, total]` at the slopes `alpha` and multipliers `beta [K, total]`
        (`crown64.backward` with the split term `-beta s` at each ReLU)."""
        a, b = self.polys[poly]
        bounds = self.clamped(splits)
        empty = np.zeros(len(splits), bool)
        for lower, upper in bounds:
            empty |= (lower > upper).any(1)
        lam = np.zeros((len(splits), 1, len(b)))
        lam[:, 0, row] = 1.0
        g = self.per_layer(-beta * splits)
        layers = [*self.layers, (a, -b, False)]
        box = tuple(np.repeat(x, len(splits), 0) for x in self.box)
        with np.errstate(invalid="ignore", over="ignore"):
            value = backward(layers, bounds, box, lam, len(layers), self.per_layer(alpha), g)
        return value[:, 0], empty

    def close(self, d: ReluDomains, alpha: Tensor, beta: Tensor, t: Target) -> ReluDomains:
        """The closed domains of `d` (margin > 0) written as leaves when the checker's
        procedure confirms them (their best row's bound less the tolerance > 0), else
        reopened with those rows (module docstring)."""
        closed = (d.margin > 0).nonzero().flatten()
        if not len(closed):
            return d
        claims, parts = self.claims(d, closed, alpha, beta, t)
        ok = claims.max(1) > 0
        for k in np.nonzero(ok)[0]:
            row = int(claims[k].argmax())
            lam = np.zeros(self.width)
            lam[row] = 1.0
            poly, splits = int(parts[0][k]), parts[1][k]
            leaf = (self.region, self.node(poly, splits), poly, lam, float(claims[k, row]))
            self.leaves.append((*leaf, parts[2][k, row], parts[3][k, row] * (splits != 0)))
        if len(self.splits) + len(self.leaves) >= FLUSH:
            self.flush()
        reopen = closed[torch.from_numpy(~ok).to(closed.device)]
        t.stats["certificate_reopened"] = t.stats.get("certificate_reopened", 0) + len(reopen)
        if not len(reopen):
            return d
        tol = t.tol[t.rows_of[d.poly[reopen]]]
        below = torch.from_numpy(claims[~ok]).to(d.rows.device)  # below the derived rows
        rows, margin = d.rows.clone(), d.margin.clone()
        rows[reopen] = torch.minimum(rows[reopen], rounded_down(below, d.rows.dtype))
        margin[reopen] = (rows[reopen] - tol).amax(1).clamp(max=0)
        return replace(d, rows=rows, margin=margin)

    def claims(self, d: ReluDomains, closed: Tensor, alpha: Tensor, beta: Tensor,
               t: Target) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:  # fmt: skip
        """`[K, r]` the checker-procedure bounds less the tolerance of each closed domain's
        rows (-inf for padded rows; the tolerance itself for an empty node), and the domains'
        polytopes, splits, slopes and multipliers as numpy."""
        poly = d.poly[closed].cpu().numpy()
        splits = d.splits[closed].cpu().numpy()
        alphas = alpha[closed].detach().clamp(0, 1).cpu().numpy()  # as the checker requires
        betas = beta[closed].detach().clamp(min=0).cpu().numpy()
        tol = t.check.tol[t.rows_of[d.poly[closed]]].cpu().numpy()
        out = np.full(alphas.shape[:2], -np.inf)
        for p in np.unique(poly):
            mine = np.nonzero(poly == p)[0]
            for row in range(len(self.polys[p][1])):
                for start in range(0, len(mine), CHUNK):
                    part = mine[start : start + CHUNK]
                    a, b = alphas[part, row].astype(np.float64), betas[part, row].astype(np.float64)
                    value, empty = self.derive(splits[part], int(p), row, a, b)
                    value = np.where(np.isnan(value), -np.inf, value)
                    out[part, row] = np.where(empty, 2 * tol[part, row], value) - tol[part, row]
            out[mine, len(self.polys[p][1]) :] = out[mine, :1]  # padded rows: row 0's
        return out, (poly, splits, alphas, betas)

    def flush(self) -> None:
        members: dict[str, np.ndarray] = {}
        if self.splits:
            members["relu_split_ints"] = np.array(self.splits, np.int64)
        if self.leaves:
            members |= {"leaf_ints": np.array([x[:3] for x in self.leaves], np.int64),
                        "leaf_lambda": np.stack([x[3] for x in self.leaves]),
                        "leaf_claim": np.array([x[4] for x in self.leaves])}  # fmt: skip
            alpha, beta = (
                np.stack([x[5] for x in self.leaves]),
                np.stack([x[6] for x in self.leaves]),
            )
            for j, (o, n) in enumerate(zip(self.offsets, self.sizes)):
                members[f"leaf_alpha{j}"] = alpha[:, o : o + n]
                members[f"leaf_beta{j}"] = beta[:, o : o + n]
        if members:
            self.writer.append(members)
        self.splits, self.leaves = [], []


class RecordingReluBounder(ReluBounder):
    """alpha-beta-CROWN on the checker's root intervals, recording its closed domains
    (module docstring); `recorder` set after construction."""

    recorder: ReluRecorder

    def set_base(self, flat: Interval) -> None:
        """The checker's root intervals instead of the engine's CROWN ones (module docstring)."""
        mine = self.recorder.root_flat().to(flat.lower.device)
        super().set_base(Interval(mine[:1], mine[1:]))

    def confirmed(self, d: ReluDomains, alpha: Tensor, beta: Tensor) -> ReluDomains:
        """`ReluBounder.confirmed`, then the leaves of the domains it leaves closed, each
        confirmed by the checker's procedure or reopened (`ReluRecorder.close`)."""
        return self.recorder.close(super().confirmed(d, alpha, beta), alpha, beta, self.t)


class RecordingReluBrancher(ReluBrancher):
    """The ReLU brancher, recording each split (`ReluRecorder.split`)."""

    recorder: ReluRecorder

    def split(self, parents: ReluDomains, choice: Tensor, lam: Tensor) -> ReluDomains:
        children = super().split(parents, choice, lam)
        numpy = lambda x: x.cpu().numpy()  # noqa: E731
        self.recorder.split(numpy(parents.splits), numpy(parents.poly), numpy(choice),
                            numpy(children.splits))  # fmt: skip
        return children


class CertifyingReluBab(ReluBab):
    """`ReluBab` in certificate mode (`relu_certificate_config`) recording into `recorder`
    (`run` flushes at the end)."""

    bounder_class = RecordingReluBounder
    brancher_class = RecordingReluBrancher

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int,
                 graph: Graph | None, recorder: ReluRecorder) -> None:  # fmt: skip
        self.recorder = recorder
        super().__init__(net, region, relu_certificate_config(config), seed, graph)
        self.bounder.easy.recorder = self.brancher.recorder = recorder
        if self.target.layout.sizes != tuple(recorder.sizes):
            raise CertificateUnsupportedError("certificates: the ReLU layers are not a chain")

    def run(self, deadline: float) -> RegionOutcome:
        outcome = super().run(deadline)
        self.recorder.flush()
        return outcome
