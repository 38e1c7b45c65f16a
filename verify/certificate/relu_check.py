"""The checker of ReLU-split certificates (format v2, `"splitting": "relu"`): `ReluChecker`.

Theorems relied on, besides (C2)-(C3) of `check` and (T1)-(T3) of `arith`:
- (R1) a tree per (region, polytope): node 0 is the region's box with no split; a split of node
  P on neuron i of ReLU layer j (not split on P's path) gives the children P ∩ {v_i <= 0}
  (inactive) and P ∩ {v_i >= 0} (active), whose union is P; so the leaves (nodes never split)
  cover the region, each with its split set: sign s_i = +1 (v_i >= 0) or -1 (v_i <= 0).
- (R2) on a node, every v_j lies in the region's intervals (`crown64.intervals` on its box)
  clamped by the node's splits (active: l = max(l, 0), inactive: u = min(u, 0)); a node whose
  clamped interval is empty somewhere contains no input (nothing to exclude).
- (R3) (Wang et al. 2021, "Beta-CROWN", Thm. 3.1: the bound as a Lagrangian of the split
  constraints) for min f(x) over the node, s.t. s_i v_i >= 0, and any beta >= 0,
  L = f - sum_i beta_i s_i v_i <= f on the node; a lower bound of L over the box and the
  clamped relaxation (CROWN's backward pass at the leaf's slopes, with `g = -beta s` added to
  the coefficient of v_j right after ReLU j's relaxation: `crown64.backward`'s `betas`) is a
  lower bound of f on the node. beta must be >= 0, and 0 at unsplit neurons.
"""

from __future__ import annotations

import numpy as np

from verify.certificate.check import SPLITTINGS, CertificateInvalidError, Checker
from verify.certificate.crown64 import Layer, intervals
from verify.certificate.vnnlib_plain import Region


class ReluTree:
    """One (region, polytope) tree (R1): `nodes[id] = (parent, layer, neuron, sign)`."""

    def __init__(self) -> None:
        self.nodes: dict[int, tuple[int, int, int, int]] = {0: (-1, -1, -1, 0)}
        self.split: set[int] = set()

    def add_split(self, parent: int, layer: int, neuron: int, children: tuple[int, int],
                  sizes: list[int]) -> None:  # fmt: skip
        """Split `parent` on (layer, neuron) into `children` (inactive, active); Invalid for an
        unknown or split parent, a neuron that is none or split on the path, old child ids."""
        where, known = f"split of node {parent}", any(c in self.nodes for c in children)
        if parent not in self.nodes or parent in self.split:
            raise CertificateInvalidError(f"{where}: the node is unknown or already split")
        neuron_ok = 0 <= layer < len(sizes) and 0 <= neuron < sizes[layer]
        if not neuron_ok or (layer, neuron) in self.path(parent):
            raise CertificateInvalidError(f"{where}: ({layer}, {neuron}) is no neuron, or split")
        if children[0] == children[1] or known:
            raise CertificateInvalidError(f"{where}: child ids {children} are not new")
        for child, sign in zip(children, (-1, 1)):
            self.nodes[child] = (parent, layer, neuron, sign)
        self.split.add(parent)

    def path(self, node: int) -> dict[tuple[int, int], int]:
        """The node's splits `{(layer, neuron): sign}`."""
        out = {}
        while node != 0:
            node, layer, neuron, out[(layer, neuron)] = self.nodes[node]
        return out


class ReluChecker(Checker):
    """`Checker` of ReLU-split certificates: trees per (region, polytope) (R1), leaves re-derived
    on the region's intervals clamped by their splits (R2) with the split multipliers (R3)."""

    def __init__(self, layers: list[Layer], regions: list[Region]) -> None:
        super().__init__(layers, regions)
        self.sizes = [layers[k - 1][0].shape[0] for k in self.relus]
        self.offsets = np.cumsum([0, *self.sizes])
        self.forest = {(r, p): ReluTree() for r, reg in enumerate(regions)
                       for p in range(len(reg.unsafe))}  # fmt: skip
        self.roots: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def read_splits(self, batch: dict[str, np.ndarray]) -> None:
        """The batch's ReLU splits (R1)."""
        ints = batch.get("relu_split_ints", np.zeros((0, 7), np.int64))
        for region, poly, parent, *split in ints.tolist():
            if (region, poly) not in self.forest:
                raise CertificateInvalidError(f"split of ({region}, {poly}): no such tree")
            layer, neuron, inactive, active = (int(v) for v in split)
            self.forest[(region, poly)].add_split(int(parent), layer, neuron,
                                                  (inactive, active), self.sizes)  # fmt: skip

    def leaves(self, batch: dict[str, np.ndarray]) -> None:
        """The leaves of one batch, in chunks; Invalid naming the first that fails."""
        for start in range(0, len(batch["leaf_ints"]), self.chunk):
            part = slice(start, start + self.chunk)
            ints, lam = batch["leaf_ints"][part], batch["leaf_lambda"][part]
            claim = np.asarray(batch["leaf_claim"][part], np.float64)
            alphas = [batch[f"leaf_alpha{j}"][part] for j in range(len(self.relus))]
            signs = self.signs_of(ints)
            rows = np.array([len(self.regions[r].unsafe[p].b) for r, _, p in ints.tolist()])
            self.check_lambda(ints, lam, rows)
            self.slopes(ints, alphas)
            g = {k: self.split_term(ints, k, j, signs, batch[f"leaf_beta{j}"][part])
                 for j, k in enumerate(self.relus)}  # fmt: skip
            self.fail(ints, ~(claim > 0), "the claimed bound is not > 0")
            got = self.relu_derive(ints, lam, signs, dict(zip(self.relus, alphas)), g)
            bad = ~(claim <= got)
            k = int(np.argmax(bad))
            self.fail(ints, bad, f"claimed bound {claim[k]} exceeds the re-derived bound {got[k]}")
            self.closed.update(map(tuple, ints.tolist()))

    def signs_of(self, ints: np.ndarray) -> np.ndarray:
        """`[L, total]` the leaves' split signs; Invalid for an unknown or split node."""
        out = np.zeros((len(ints), int(self.offsets[-1])))
        for k, (region, node, poly) in enumerate(ints.tolist()):
            tree = self.forest.get((region, poly))
            name = f"leaf (region {region}, node {node}, polytope {poly})"
            if tree is None or node not in tree.nodes or node in tree.split:
                raise CertificateInvalidError(f"{name}: no such node, or one that was split")
            for (layer, neuron), sign in tree.path(node).items():
                out[k, self.offsets[layer] + neuron] = sign
        return out

    def split_term(self, ints: np.ndarray, k: int, j: int, signs: np.ndarray,
                   beta: np.ndarray) -> np.ndarray:  # fmt: skip
        """`g = -beta s` of ReLU layer k (the j-th) (R3); Invalid unless beta `[L, n_k]` is
        finite, >= 0, and 0 where the node has no split."""
        s, beta = signs[:, self.offsets[j] : self.offsets[j + 1]], np.asarray(beta, np.float64)
        if beta.shape != s.shape:
            self.fail(ints, np.ones(len(ints), bool), f"betas of ReLU layer {k}: wrong shape")
        bad = ~np.isfinite(beta).all(1) | (beta < 0).any(1)
        self.fail(ints, bad, f"a multiplier beta of ReLU layer {k} is negative (or not finite)")
        self.fail(ints, ((beta != 0) & (s == 0)).any(1),
                  f"a multiplier beta of ReLU layer {k} is at a neuron not split")  # fmt: skip
        return -beta * s

    def relu_derive(self, ints: np.ndarray, lam: np.ndarray, signs: np.ndarray,
                    slopes: dict[int, np.ndarray], g: dict[int, np.ndarray]) -> np.ndarray:  # fmt: skip
        """Sound lower bounds `[L]` of `lam^T (C y - b)` on the leaves' nodes (R2, R3; +inf on
        an empty node), as `Checker.derive` on the region's intervals clamped by the splits."""
        regions = ints[:, 0].tolist()
        for r in set(regions) - set(self.roots):
            box = (self.regions[r].lower[None], self.regions[r].upper[None])
            self.roots[r] = intervals(self.layers, box)
        bounds, empty = [], np.zeros(len(ints), bool)
        for k in range(1, len(self.layers) + 1):
            lower, upper = (np.concatenate([self.roots[r][k - 1][i] for r in regions]) for i in (0, 1))  # fmt: skip
            if k in self.relus:
                s = signs[:, self.offsets[self.relus.index(k)] :][:, : len(lower[0])]
                lower = np.where(s > 0, np.maximum(lower, 0), lower)
                upper = np.where(s < 0, np.minimum(upper, 0), upper)
            empty |= (lower > upper).any(1)
            bounds.append((lower, upper))
        box = tuple(np.stack([getattr(self.regions[r], e) for r in regions]) for e in ("lower", "upper"))  # fmt: skip
        with np.errstate(invalid="ignore", over="ignore"):
            got = self.bound(ints, lam, bounds, box, slopes, g)
        return np.where(empty, np.inf, np.where(np.isnan(got), -np.inf, got))

    def coverage(self) -> None:
        """(C3) with (R1): every leaf node of every tree has its leaf."""
        for (region, poly), tree in self.forest.items():
            for node in tree.nodes.keys() - tree.split:
                if (region, node, poly) not in self.closed:
                    where = f"region {region}, polytope {poly}, node {node}"
                    raise CertificateInvalidError(f"coverage: {where} has no leaf excluding it")


SPLITTINGS["relu"] = ReluChecker
