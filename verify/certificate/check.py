"""The independent checker of certificates (format v2, package docstring): `check_certificate`.

It reads the network with its own ONNX reader (`onnx_plain`) and the property with its own
VNN-LIB reader (`vnnlib_plain`), and re-proves every leaf with its own
float64, outward-rounded IBP and CROWN (`crown64`). Theorems relied on:
- (C1) the tree covers each region: node 0 is the region's box; a split of node B along `dim`
  at `point` (within B's range) gives B ∩ {x_dim <= point} and B ∩ {x_dim >= point}, whose
  union is B; so the boxes of the leaves (nodes never split) cover the region.
- (C2) a polytope `{y : C y <= b}` has no point `y = f(x)`, x in a box, when for some
  `lambda >= 0` the lower bound of `lambda^T (C y - b)` over the box is > 0 (a point of the
  polytope would make it <= 0). The lower bound is re-derived (`crown64.backward`) with the
  leaf's slopes; the claim must be > 0 and <= the re-derived bound.
- (C3) so when every leaf node excludes every polytope of its region, no input of any region
  reaches an unsafe output: the property holds ("unsat").
- With `"splitting": "relu"` the trees and leaves are `relu_check`'s (R1)-(R3) instead of (C1).
- (C4) a "sat" answer's point lies in a region's box and its output's sound interval
  (`crown64.point_interval`) lies inside one polytope (every row's upper bound <= 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from verify.certificate.arith import affine_interval, mv_lo
from verify.certificate.crown64 import Layer, backward, intervals, point_interval
from verify.certificate.onnx_plain import UnsupportedModelError, read_bytes, read_network
from verify.certificate.store import FORMAT, VERSION, read_batches, read_manifest, sha256_file
from verify.certificate.vnnlib_plain import Region, UnsupportedPropertyError, read_property


@dataclass(frozen=True)
class CheckResult:
    """`valid`, or not with the `reason` (naming the leaf or the check that failed)."""

    valid: bool
    reason: str = ""

    def __str__(self) -> str:
        return "valid" if self.valid else f"invalid: {self.reason}"


class CertificateInvalidError(Exception):
    """A check failed (its message is the reason)."""


class Tree:
    """The nodes of one region: `boxes[node] = (lower, upper)`, `split`: the nodes split."""

    def __init__(self, lower: np.ndarray, upper: np.ndarray) -> None:
        self.boxes = {0: (np.asarray(lower, np.float64), np.asarray(upper, np.float64))}
        self.split: set[int] = set()

    def add_split(self, parent: int, dim: int, point: float, left: int, right: int) -> None:
        """Split `parent` (C1); Invalid for an unknown or already split parent, a dimension
        or point outside its box, or children that exist already."""
        where = f"split of node {parent}"
        if parent not in self.boxes or parent in self.split:
            raise CertificateInvalidError(f"{where}: the node is unknown or already split")
        lower, upper = self.boxes[parent]
        if not 0 <= dim < len(lower) or not np.isfinite(point):
            raise CertificateInvalidError(f"{where}: dimension {dim} or point {point} is not valid")
        point = min(max(point, lower[dim]), upper[dim])  # clamped: still a partition (C1)
        if left in self.boxes or right in self.boxes or left == right:
            raise CertificateInvalidError(f"{where}: child ids {left}, {right} are not new")
        left_upper, right_lower = upper.copy(), lower.copy()
        left_upper[dim] = right_lower[dim] = point
        self.boxes[left], self.boxes[right] = (lower, left_upper), (right_lower, upper)
        self.split.add(parent)

    def leaves(self) -> list[int]:
        return [n for n in self.boxes if n not in self.split]


class Checker:
    """The state of one check: the network's layers, the property's regions, the trees."""

    CHUNK = 1 << 23  # numbers of one chunk's widest row block: leaves x 2 x width^2

    def __init__(self, layers: list[Layer], regions: list[Region]) -> None:
        self.layers, self.regions = layers, regions
        self.relus = [k for k, (_, _, relu) in enumerate(layers, start=1) if relu]
        self.trees = [Tree(r.lower, r.upper) for r in regions]
        self.closed: set[tuple[int, int, int]] = set()
        width = max(w.shape[0] for w, _, _ in layers)
        self.chunk = max(1, self.CHUNK // (2 * width * width))

    def splits(self, ints: np.ndarray, points: np.ndarray) -> None:
        for (region, parent, dim, left, right), point in zip(ints.tolist(), points.tolist()):
            if not 0 <= region < len(self.trees):
                raise CertificateInvalidError(f"split of region {region}: no such region")
            self.trees[region].add_split(parent, dim, point, left, right)

    def leaves(self, batch: dict[str, np.ndarray]) -> None:
        """The leaves of one batch: each checked (C2), in chunks of `chunk` leaves."""
        relus = sorted((k for k in batch if k.startswith("leaf_alpha")), key=lambda k: int(k[10:]))
        for start in range(0, len(batch["leaf_ints"]), self.chunk):
            part = slice(start, start + self.chunk)
            self.leaf_chunk(batch["leaf_ints"][part], batch["leaf_lambda"][part],
                            batch["leaf_claim"][part], batch["leaf_lower"][part],
                            batch["leaf_upper"][part], [batch[k][part] for k in relus])  # fmt: skip

    def leaf_chunk(self, ints: np.ndarray, lam: np.ndarray, claim: np.ndarray,
                   lower: np.ndarray, upper: np.ndarray, alphas: list[np.ndarray]) -> None:  # fmt: skip
        """Leaves `(region, node, polytope)` `ints [L, 3]`: checks (C2); Invalid naming the
        first leaf that fails."""
        boxes = self.boxes_of(ints)
        rows = np.array([len(self.regions[r].unsafe[p].b) for r, _, p in ints.tolist()])
        self.check_lambda(ints, lam, rows)
        claim = np.asarray(claim, np.float64)
        self.fail(
            ints,
            (boxes[0] < lower).any(1) | (boxes[1] > upper).any(1),
            "its box is not the tree's (a split moved or flipped)",
        )
        self.slopes(ints, alphas)
        self.fail(ints, ~(claim > 0), "the claimed bound is not > 0")
        got = self.derive(ints, lam, boxes, dict(zip(self.relus, alphas)))
        bad = ~(claim <= got)
        if bad.any():
            k = int(np.argmax(bad))
            self.fail(ints, bad, f"claimed bound {claim[k]} exceeds the re-derived bound {got[k]}")
        self.closed.update(map(tuple, ints.tolist()))

    def check_lambda(self, ints: np.ndarray, lam: np.ndarray, rows: np.ndarray) -> None:
        """Invalid unless each `lam [L, width]` is finite, >= 0, not 0, over its `rows`."""
        width = np.arange(lam.shape[1])[None, :]
        self.fail(ints, ~np.isfinite(lam).all(1) | (lam < 0).any(1) | ~(lam != 0).any(1)
                  | ((width >= rows[:, None]) & (lam != 0)).any(1),
                  "lambda must be finite, >= 0, not all 0, over the polytope's rows")  # fmt: skip

    def read_splits(self, batch: dict[str, np.ndarray]) -> None:
        """The batch's box splits (C1)."""
        if "split_ints" in batch:
            self.splits(batch["split_ints"], batch["split_point"])

    def boxes_of(self, ints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tree's boxes `[L, n_in]` of the leaves' nodes; Invalid for an unknown node, a
        node that was split, or an unknown polytope."""
        lows, highs = [], []
        for region, node, poly in ints.tolist():
            name = f"leaf (region {region}, node {node}, polytope {poly})"
            if not 0 <= region < len(self.trees) or node not in self.trees[region].boxes:
                raise CertificateInvalidError(f"{name}: no such node")
            if node in self.trees[region].split:
                raise CertificateInvalidError(f"{name}: the node was split, it is no leaf")
            if not 0 <= poly < len(self.regions[region].unsafe):
                raise CertificateInvalidError(f"{name}: no such polytope")
            low, high = self.trees[region].boxes[node]
            lows.append(low)
            highs.append(high)
        return np.stack(lows), np.stack(highs)

    @staticmethod
    def fail(ints: np.ndarray, bad: np.ndarray, reason: str) -> None:
        """Invalid naming the first leaf where `bad [L]` holds, if any."""
        if bad.any():
            region, node, poly = ints[int(np.argmax(bad))].tolist()
            name = f"leaf (region {region}, node {node}, polytope {poly})"
            raise CertificateInvalidError(f"{name}: {reason}")

    def slopes(self, ints: np.ndarray, alphas: list[np.ndarray]) -> None:
        """Invalid for slopes of the wrong count or shape, or outside [0, 1]."""
        if len(alphas) != len(self.relus):
            self.fail(ints, np.ones(len(ints), bool),
                      f"{len(alphas)} slope layers for {len(self.relus)} ReLUs")  # fmt: skip
        for k, alpha in zip(self.relus, alphas):
            if alpha.shape != (len(ints), self.layers[k - 1][0].shape[0]):
                self.fail(ints, np.ones(len(ints), bool),
                          f"slopes of ReLU layer {k} have shape {alpha.shape[1:]}")  # fmt: skip
            self.fail(ints, ~((alpha >= 0) & (alpha <= 1)).all(1),
                      f"a slope alpha of ReLU layer {k} is outside [0, 1]")  # fmt: skip

    def derive(self, ints: np.ndarray, lam: np.ndarray, boxes: tuple[np.ndarray, np.ndarray],
               slopes: dict[int, np.ndarray]) -> np.ndarray:  # fmt: skip
        """Sound lower bounds `[L]` of `lam^T (C y - b)` on the leaves' boxes (C2): the better
        of CROWN's backward pass at `slopes` and the rows' intervals from the output's interval
        (`lam >= 0`); the intervals once per distinct node."""
        _, first, back = np.unique(ints[:, :2], axis=0, return_index=True, return_inverse=True)
        back = back.reshape(-1)
        node_bounds = intervals(self.layers, (boxes[0][first], boxes[1][first]))
        bounds = [(lo[back], hi[back]) for lo, hi in node_bounds]
        return self.bound(ints, lam, bounds, boxes, slopes)

    def bound(self, ints: np.ndarray, lam: np.ndarray, bounds: list, boxes: tuple,
              slopes: dict[int, np.ndarray], betas: dict | None = None) -> np.ndarray:  # fmt: skip
        """`derive` on the intervals `bounds` (`betas`: `crown64.backward`'s)."""
        a, b = self.polytopes(ints, lam.shape[1])
        layers = [*self.layers, (a, -b, False)]
        crown = backward(layers, bounds, boxes, lam[:, None, :], len(layers), slopes, betas)
        row_lower, _ = affine_interval(a, -b, *bounds[-1])
        return np.maximum(crown[:, 0], mv_lo(lam[:, None, :], row_lower)[:, 0])

    def polytopes(self, ints: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The leaves' polytopes `(A [L, width, n_out], b [L, width])`, padded with 0 rows."""
        n_out = self.layers[-1][0].shape[0]
        a, b = np.zeros((len(ints), width, n_out)), np.zeros((len(ints), width))
        for i, (region, _, poly) in enumerate(ints.tolist()):
            p = self.regions[region].unsafe[poly]
            a[i, : len(p.b)], b[i, : len(p.b)] = p.A, p.b
        return a, b

    def coverage(self) -> None:
        """(C3): every leaf node of every region excludes each of its region's polytopes."""
        for region, tree in enumerate(self.trees):
            for node in tree.leaves():
                for poly in range(len(self.regions[region].unsafe)):
                    if (region, node, poly) not in self.closed:
                        where = f"region {region}, node {node}, polytope {poly}"
                        raise CertificateInvalidError(f"coverage: {where} has no leaf excluding it")

    def counterexample(self, region: int, x: np.ndarray) -> None:
        """(C4)."""
        r = self.regions[region]
        if not ((r.inner_lower <= x) & (x <= r.inner_upper)).all():
            raise CertificateInvalidError(f"counterexample: outside region {region}'s box")
        low, high = point_interval(self.layers, x)
        for poly in r.unsafe:
            _, top = affine_interval(np.asarray(poly.A), -np.asarray(poly.b_inner), low, high)
            if (top <= 0).all():
                return
        raise CertificateInvalidError(
            "counterexample: its output is not provably in an unsafe polytope"
        )


SPLITTINGS: dict[str, type[Checker]] = {"input": Checker}  # "relu": `relu_check` adds its own


def _check(net_path: str | os.PathLike, spec_path: str | os.PathLike,
           cert_path: str | os.PathLike) -> None:  # fmt: skip
    manifest = read_manifest(cert_path)
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CertificateInvalidError(f"manifest: not an {FORMAT} of version {VERSION}")
    if manifest.get("network_sha256") != sha256_file(net_path):
        raise CertificateInvalidError(
            "hash: the network file is not the one certified (network_sha256)"
        )
    if manifest.get("property_sha256") != sha256_file(spec_path):
        raise CertificateInvalidError(
            "hash: the property file is not the one certified (property_sha256)"
        )
    layers, _ = read_network(read_bytes(net_path))
    regions = read_property(read_bytes(spec_path))
    if manifest.get("regions") != len(regions):
        count = manifest.get("regions")
        raise CertificateInvalidError(f"manifest: {count} regions, the property {len(regions)}")
    for k, r in enumerate(regions):
        if not (np.isfinite(r.lower).all() and np.isfinite(r.upper).all()):
            raise CertificateInvalidError(f"region {k}: its input box is not bounded")
    kind = SPLITTINGS.get(manifest.get("splitting"))
    if kind is None:
        raise CertificateInvalidError(f"manifest: splitting {manifest.get('splitting')!r}")
    checker, batches = kind(layers, regions), int(manifest.get("batches", 0))
    if manifest.get("answer") == "sat":
        for batch in read_batches(cert_path, batches):
            if "sat_x" in batch:
                region = int(np.asarray(batch["sat_region"]).reshape(-1)[0])
                return checker.counterexample(region, batch["sat_x"].reshape(-1))
        raise CertificateInvalidError("counterexample: none stored")
    if manifest.get("answer") != "unsat":
        raise CertificateInvalidError(f"manifest: answer {manifest.get('answer')!r}")
    for batch in read_batches(cert_path, batches):
        checker.read_splits(batch)
    for batch in read_batches(cert_path, batches):
        if "leaf_ints" in batch:
            checker.leaves(batch)
    checker.coverage()


def check_certificate(
    net_path: str | os.PathLike, spec_path: str | os.PathLike, cert_path: str | os.PathLike
) -> CheckResult:
    """Check the certificate `cert_path` of the property `spec_path` on the network `net_path`.

    Independent of the rest of the toolkit (its own ONNX and VNN-LIB readers, its own float64
    IBP and CROWN with every rounding bounded; see `verify.certificate`).

    Args:
        net_path: the ONNX network the certificate was written for (its SHA-256 must match
            the manifest's).
        spec_path: the VNN-LIB property (its SHA-256 must match too).
        cert_path: the certificate (format v2: a zip of `.npy` records and `manifest.json`).

    Returns:
        `CheckResult(True)`, or `CheckResult(False, reason)` naming the leaf or check that
        failed.

    Raises:
        Nothing for a bad certificate, network or property: an invalid or unreadable one is
        `CheckResult(False, "unreadable: ...")`.
    """
    try:
        _check(net_path, spec_path, cert_path)
    except CertificateInvalidError as error:
        return CheckResult(False, str(error))
    except (
        UnsupportedModelError,
        UnsupportedPropertyError,
        KeyError,
        ValueError,
        TypeError,
        OSError,
    ) as error:
        return CheckResult(False, f"unreadable: {type(error).__name__}: {error}")
    return CheckResult(True)
