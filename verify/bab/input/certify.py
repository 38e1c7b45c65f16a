"""Certificates of input splitting (issue 26; format: `verify.certificate`): `CertifyingBab`,
the input-splitting search with its bounder recording every split and every closed domain.

Certificate mode runs the search's own configuration (`certificate_config`): CROWN for every
domain and alpha-CROWN (output slopes only, `optimize_intermediate=False`) from
`strong_depth` on; a method or option whose bounds no leaf's parameters can give (intermediate
slopes optimised, another method) raise `CertificateUnsupportedError` (no fallback: the caller
chose them); ReLU splitting writes its own certificates (`verify.bab.relu.certify`). Splits
are read off the kept sibling pairs the bounder confirms (left child `i` and right child
`i + n`: the parent is their union, the split where they differ), so the brancher's trial of
several dimensions is unchanged.

A closed domain's leaves come from the search's own float64 recheck of its closing bound, done
here by the checker's procedure (`certified_bounds`, Zhang et al. 2018 for CROWN, Xu et al. 2021
for alpha-CROWN): on the box the checker derives (the search's box within the region's exact
float64 box), every neuron's interval by CROWN at the adaptive slopes (rounding tracked), then
the objective's backward pass at the leaf's slopes (CROWN's adaptive ones, or alpha-CROWN's
optimised ones at which the search's bound was found). A domain is closed only when those rows,
less the pruning tolerance, exclude every polytope (`InputBounder.confirm`), so every leaf
written is one the checker re-derives: its claim is that float64 bound less the tolerance, and
the tolerance (1e-5 (1 + |b|)) covers the two implementations' different rounding (1e-12 on
ACAS Xu). Two differences are removed rather than covered: a neuron the engine finds stable
gets the slope that makes both relaxations agree should the checker find it barely unstable
(its adaptive slope: the engine ignores it), and a combination row bounded from the output's
interval is claimed no higher than the checker's interval bound (the lambda-combination of the
single rows' interval bounds). One leaf per polytope: the row of largest claim, as a lambda over
the polytope's rows (a combination row of `UnsafeSpec.with_combinations` is the mean of its
rows, `combination_weights`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor, nn

from bounds.graph.graph import Graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.backward import concretize
from bounds.methods.crown import crown, crown_intervals
from bounds.types import Interval
from verify.attack import combination_groups
from verify.bab.common import RegionOutcome
from verify.bab.config import BabConfig
from verify.bab.input.bounder import InputBounder
from verify.bab.input.domains import Domains
from verify.bab.input.search import RegionBab
from verify.certificate.store import CertificateWriter
from verify.errors import CertificateUnsupportedError
from verify.property import Region

FLUSH = 16384  # records buffered before a batch is appended
FLUSH_BYTES = 32 * 2**20  # or bytes buffered (wide inputs: a leaf's boxes are 16 bytes per input)
SLOPED = (None, "crown", "alpha-crown")  # strong methods whose bounds a leaf's slopes give


def certificate_config(config: BabConfig) -> BabConfig:
    """`config` for certificate mode: the same methods, input splitting, the float64 recheck
    on (it gives the leaves) with a margin of `prune_tol` (`recheck_tol`: the claims stay
    below what the checker re-derives, with its own rounding), the root bounded as any
    domain (`root_float64` off: it would close a root without a leaf), `method` alone (no
    `fast_method`);
    `CertificateUnsupportedError` for a method whose bound no leaf's
    parameters give (not CROWN, or alpha-CROWN optimising intermediate slopes) or ReLU
    splitting (whose certificate mode is `verify.bab.relu.certify.relu_certificate_config`)."""
    if config.method != "crown":
        raise CertificateUnsupportedError(
            f"method {config.method!r} cannot give its parameters for a certificate; use 'crown'"
        )
    optimised = config.strong_options.get("optimize_intermediate", True)
    if config.strong_method not in SLOPED or (config.strong_method == "alpha-crown" and optimised):
        raise CertificateUnsupportedError(
            f"strong method {config.strong_method!r} with {config.strong_options} cannot give its "
            "parameters for a certificate (alpha-CROWN needs optimize_intermediate=False)"
        )
    if config.splitting == "relu":
        raise CertificateUnsupportedError("ReLU splitting: use relu_certificate_config")
    return replace(config, splitting="input", float64_recheck=True, root_float64=False,
                   recheck_tol=config.prune_tol, fast_method=None)  # fmt: skip


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


def certified_bounds(graph: Graph, box: Interval, C: Tensor,
                     slopes: dict[str, Tensor]) -> tuple[Tensor, list[Tensor], Interval]:  # fmt: skip
    """The checker's procedure on the float64 `graph` and `box` (module docstring): lower
    bounds of `C y` `[K, m]` (`C [K, m, n_out]`), per ReLU layer (network order) the lower
    slopes of the final pass `[K, m or 1, n_j]`, and the output's interval. alpha-CROWN at
    `slopes` (`{activation: [K, 2m, *shape]}`, its best output slopes) when given, else
    CROWN (Zhang et al. 2018: adaptive slopes, 1 where u > -l)."""
    acts = [node.name for node in graph.activations()]
    if slopes:
        intervals = crown_intervals(graph, box, every_neuron=True)
        config = AlphaCrownConfig(iterations=0, optimize_intermediate=False, compile=False)
        low, _, _, stats = alpha_crown(graph, box, C, config, intervals=intervals,
                                       init_slopes=slopes)  # fmt: skip
        used = [stats["best_slopes"][a][:, : C.shape[1]].flatten(2) for a in acts]
    else:
        low, _, intervals = crown(graph, box, C, None, True)
        used = [None] * len(acts)
    out = []
    for act, alpha in zip(acts, used):
        iv = intervals[graph[act].inputs[0]]
        lower, upper = iv.lower.flatten(1).unsqueeze(1), iv.upper.flatten(1).unsqueeze(1)
        adaptive = (upper > -lower).to(torch.float64)
        stable = (lower >= 0) | (upper <= 0)
        out.append(adaptive if alpha is None else torch.where(stable, adaptive, alpha.double()))
    return low, out, intervals[graph.output.name]


class Recorder:
    """The records of one region, buffered and appended to `writer` in batches."""

    def __init__(self, writer: CertificateWriter, region_index: int, region: Region,
                 combine: bool) -> None:  # fmt: skip
        self.writer, self.region = writer, region_index
        weights = combination_weights(region) if combine else combination_weights(region, 0)
        self.owner = np.array([p for p, _ in weights], dtype=np.int64)
        width = max((len(p.b) for p in region.unsafe), default=0)
        self.lambdas = np.zeros((len(weights), width))
        offsets = np.cumsum([0] + [len(p.b) for p in region.unsafe])
        self.combine = np.zeros((len(weights), offsets[-1]))  # rows as lambdas of single rows
        for r, (poly, lam) in enumerate(weights):
            self.lambdas[r, : len(lam)] = lam
            self.combine[r, offsets[poly] : offsets[poly] + len(lam)] = lam
        self.n_polytopes = len(region.unsafe)
        self.nodes: dict[bytes, list[int]] = {}
        self.count = 0
        self.splits: list[tuple[np.ndarray, np.ndarray]] = []
        self.leaves: list[list[np.ndarray]] = []
        self.pending = self.pending_bytes = 0

    @staticmethod
    def keys(lower: Tensor, upper: Tensor) -> list[bytes]:
        """Each box's key: its bounds' bytes (boxes `[N, n_in]` of the search's dtype)."""
        both = torch.cat([lower, upper], 1).detach().cpu().numpy()
        return [row.tobytes() for row in both]

    def new(self, keys: list[bytes]) -> np.ndarray:
        """New nodes of these boxes: their ids."""
        ids = np.arange(self.count, self.count + len(keys), dtype=np.int64)
        for key, node in zip(keys, ids.tolist()):
            self.nodes.setdefault(key, []).append(node)
        self.count += len(keys)
        return ids

    def take(self, keys: list[bytes]) -> np.ndarray:
        """The open nodes of these boxes, taken: each open domain is used once, as a parent or
        as a leaf (domains of equal boxes, from a split along a zero-width dimension, are
        interchangeable)."""
        out = np.empty(len(keys), dtype=np.int64)
        for k, key in enumerate(keys):
            ids = self.nodes[key]
            out[k] = ids.pop()
            if not ids:
                del self.nodes[key]
        return out

    def pairs(self, d: Domains) -> None:
        """The splits of the kept sibling pairs (left `i`, right `i + n`)."""
        n = len(d) // 2
        if not n:
            return
        ll, lu, rl, ru = d.lower[:n], d.upper[:n], d.lower[n:], d.upper[n:]
        parents = self.take(self.keys(ll, ru))
        differ = (lu != ru) | (ll != rl)  # none: a zero-width split, any dimension (the first)
        dim = differ.to(torch.uint8).argmax(1, keepdim=True)
        point = lu.gather(1, dim).double().cpu().numpy()
        left, right = self.new(self.keys(ll, lu)), self.new(self.keys(rl, ru))
        ints = np.stack([np.full(n, self.region), parents, dim[:, 0].cpu().numpy(), left, right], 1)
        self.splits.append((ints, point[:, 0]))
        self.pending += n

    def rows_checked(self, rows: Tensor, intervals: Tensor) -> Tensor:
        """`rows [K, m]` (lower bounds of `C y - b`, each the better of a backward pass and
        the output interval's `intervals [K, m]`) where the checker reproduces them: a row no
        better than its interval bound is claimed at most the lambda-combination of the single
        rows' interval bounds (the checker's interval bound of that row)."""
        combine = torch.as_tensor(self.combine, dtype=rows.dtype, device=rows.device)
        combined = intervals[:, : combine.shape[1]] @ combine.T
        return torch.where(rows > intervals, rows, torch.minimum(rows, combined))

    def best_rows(self, claims: Tensor) -> Tensor:
        """`[K, P]`: per box, each polytope's row of largest claim."""
        owner = torch.as_tensor(self.owner, device=claims.device)
        mine = owner[None, :] == torch.arange(self.n_polytopes, device=claims.device)[:, None]
        return claims[:, None, :].masked_fill(~mine, -torch.inf).argmax(2)

    def closed(self, keys: list[bytes], lower: Tensor, upper: Tensor, claims: Tensor,
               best: Tensor, alphas: list[Tensor]) -> None:  # fmt: skip
        """One leaf per polytope of each closed box (`keys`: the search's boxes; `lower`,
        `upper`: the boxes bounded): its row `best [K, P]` of `claims [K, m]` (lower bounds of
        `C y - b` less the tolerance) as a lambda over the polytope's rows, with that row's
        slopes `alphas [K, P, n_j]`. Leaves of one node are consecutive (the checker's cache)."""
        k, p = best.shape
        if not k:
            return
        nodes = self.take(keys)
        best_np = best.cpu().numpy()
        ints = np.stack([np.full((k, p), self.region), np.repeat(nodes[:, None], p, 1),
                         np.broadcast_to(np.arange(p), (k, p))], 2).reshape(-1, 3)  # fmt: skip
        claim = np.take_along_axis(claims.cpu().numpy(), best_np, 1).reshape(-1)
        boxes = [np.repeat(t.double().cpu().numpy(), p, 0) for t in (lower, upper)]
        slopes = [a.cpu().numpy().reshape(k * p, -1) for a in alphas]
        self.leaves.append([ints, self.lambdas[best_np.reshape(-1)], claim, *boxes, *slopes])
        self.pending += k * p
        self.pending_bytes += sum(a.nbytes for a in self.leaves[-1])
        if self.pending >= FLUSH or self.pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        members: dict[str, np.ndarray] = {}
        if self.splits:
            ints, points = (np.concatenate(column) for column in zip(*self.splits))
            members |= {"split_ints": ints.astype(np.int64), "split_point": points}
        if self.leaves:
            parts = [np.concatenate(column) for column in zip(*self.leaves)]
            members |= {
                "leaf_ints": parts[0].astype(np.int64),
                "leaf_lambda": parts[1],
                "leaf_claim": parts[2],
                "leaf_lower": parts[3],
                "leaf_upper": parts[4],
            }
            members |= {f"leaf_alpha{j}": a for j, a in enumerate(parts[5:])}  # fmt: skip
        if members:
            self.writer.append(members)
        self.splits, self.leaves, self.pending, self.pending_bytes = [], [], 0, 0


class RecordingBounder(InputBounder):
    """The bounder of input splitting, recording (module docstring): its float64 recheck is
    the checker's procedure (`certify_rows`); `recorder` and `exact` (the region's box in
    float64, `[1, n_in]` each) set after construction."""

    recorder: Recorder
    exact: tuple[Tensor, Tensor]
    at_root = True
    certified: tuple | None = None

    def certify_rows(self, lower: Tensor, upper: Tensor,
                     slopes: dict[str, Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:  # fmt: skip
        """On the float64 boxes `[K, n_in]`: lower bounds of `C y - b` `[K, m]` that the
        checker reproduces (`certified_bounds`, `Recorder.rows_checked`), each polytope's row
        of largest claim `[K, P]` (`Recorder.best_rows`, the claims less the tolerance) and,
        per ReLU layer, that row's slopes `[K, P, n_j]`."""
        spec, shape = self.check.spec, self.shape
        box = Interval(lower.reshape(-1, *shape), upper.reshape(-1, *shape))
        C = spec.C.expand(len(lower), *spec.C.shape)
        low, alphas, output = certified_bounds(self.check.graph, box, C, slopes)
        out = Interval(output.lower.flatten(1), output.upper.flatten(1))
        rows = self.recorder.rows_checked(low - spec.b, concretize(C, out) - spec.b)
        best = self.recorder.best_rows(rows - self.check.tol)
        chosen = []
        for a in alphas:
            full = a.expand(-1, C.shape[1], -1)
            chosen.append(full.gather(1, best[:, :, None].expand(-1, -1, a.shape[2])))
        return rows, best, chosen

    def _bounds64(self, lower, upper, depth, slope_rows, slopes) -> Tensor:
        """`InputBounder._bounds64` by `certify_rows`, on the boxes within the region's exact
        box (those the checker derives), alpha-CROWN's domains at their slopes; kept in
        `certified` for `confirm`."""
        low64 = torch.maximum(lower.double(), self.exact[0].to(lower.device))
        up64 = torch.minimum(upper.double(), self.exact[1].to(lower.device))
        rows = low64.new_empty(len(low64), self.check.spec.C.shape[0])
        best = torch.empty(len(low64), self.check.spec.n_polytopes, dtype=torch.long,
                           device=rows.device)  # fmt: skip
        alphas: list[Tensor] = []
        for part, use_strong, given in self._recheck_parts(depth, slope_rows, slopes):
            given = given if use_strong else {}
            rows[part], best[part], chosen = self.certify_rows(low64[part], up64[part], given)
            if not alphas:
                alphas = [a.new_empty(len(low64), *a.shape[1:]) for a in chosen]
            for whole, a in zip(alphas, chosen):
                whole[part] = a
        self.certified = (low64, up64, rows, best, alphas)
        return rows

    def confirm(self, d: Domains, slope_rows: Tensor, slopes: dict[str, Tensor]) -> Domains:
        """`InputBounder.confirm` (its recheck: `_bounds64`), then each closed domain's leaves:
        the certified rows less the tolerance, which exclude every polytope (else the domain
        stays open)."""
        if self.at_root:
            self.recorder.new(self.recorder.keys(d.lower[:1], d.upper[:1]))
            self.at_root = False
        else:
            self.recorder.pairs(d)
        self.certified = None
        out = super().confirm(d, slope_rows, slopes)
        if self.certified is None:
            return out
        closed = (d.margin > 0).nonzero().flatten()
        kept = closed[out.margin[closed] > 0]
        low64, up64, rows, best, alphas = self.certified
        at = (out.margin[closed] > 0).to(rows.device)
        self.recorder.closed(self.recorder.keys(d.lower[kept], d.upper[kept]), low64[at],
                             up64[at], rows[at] - self.check.tol, best[at],
                             [a[at] for a in alphas])  # fmt: skip
        self.certified = None
        return out


class CertifyingBab(RegionBab):
    """`RegionBab` whose bounder records into `recorder` (`run` flushes at the end)."""

    def __init__(self, net: nn.Module, region: Region, config: BabConfig, seed: int,
                 graph: Graph | None, recorder: Recorder) -> None:  # fmt: skip
        super().__init__(net, region, certificate_config(config), seed, graph)
        old = self.bounder
        bounder = RecordingBounder(old.graph, old.spec, old.config, old.check, old.sizer,
                                   old.stats, old.clock, old.root_box)  # fmt: skip
        device = old.check.spec.C.device
        lower, upper = (torch.tensor(np.array(t), dtype=torch.float64, device=device)[None]
                        for t in (region.lower, region.upper))  # fmt: skip
        bounder.recorder, bounder.exact = recorder, (lower, upper)
        self.bounder, self.recorder = bounder, recorder

    def run(self, deadline: float) -> RegionOutcome:
        outcome = super().run(deadline)
        self.recorder.flush()
        return outcome
