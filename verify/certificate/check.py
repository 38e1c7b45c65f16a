"""The independent checker of certificates (format v1, package docstring): `check_certificate`.

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
- (C4) a "sat" answer's point lies in a region's box and its output's sound interval
  (`crown64.point_interval`) lies inside one polytope (every row's upper bound <= 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from verify.certificate.arith import affine_interval, matmul_lo
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

    def __init__(self, layers: list[Layer], regions: list[Region]) -> None:
        self.layers, self.regions = layers, regions
        self.relus = [k for k, (_, _, relu) in enumerate(layers, start=1) if relu]
        self.trees = [Tree(r.lower, r.upper) for r in regions]
        self.closed: set[tuple[int, int, int]] = set()
        self._cache: tuple | None = None

    def splits(self, ints: np.ndarray, points: np.ndarray) -> None:
        for (region, parent, dim, left, right), point in zip(ints.tolist(), points.tolist()):
            if not 0 <= region < len(self.trees):
                raise CertificateInvalidError(f"split of region {region}: no such region")
            self.trees[region].add_split(parent, dim, point, left, right)

    def bounds_of(self, region: int, node: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The intervals of every layer on the node's box (cached for the last node)."""
        if self._cache is None or self._cache[0] != (region, node):
            box = self.trees[region].boxes[node]
            self._cache = ((region, node), intervals(self.layers, box))
        return self._cache[1]

    def leaf(self, ints: np.ndarray, lam: np.ndarray, claim: float,
             box: tuple[np.ndarray, np.ndarray], alphas: list[np.ndarray]) -> None:  # fmt: skip
        """One leaf `(region, node, polytope)`: checks (C2); Invalid naming the leaf."""
        region, node, poly = (int(v) for v in ints)
        name = f"leaf (region {region}, node {node}, polytope {poly})"
        if not 0 <= region < len(self.trees) or node not in self.trees[region].boxes:
            raise CertificateInvalidError(f"{name}: no such node")
        if node in self.trees[region].split:
            raise CertificateInvalidError(f"{name}: the node was split, it is no leaf")
        unsafe = self.regions[region].unsafe
        if not 0 <= poly < len(unsafe):
            raise CertificateInvalidError(f"{name}: no such polytope")
        rows = len(unsafe[poly].b)
        if not np.isfinite(lam).all() or (lam < 0).any() or lam[rows:].any() or not lam.any():
            raise CertificateInvalidError(
                f"{name}: lambda must be finite, >= 0, not all 0, over {rows} rows"
            )
        derived = self.trees[region].boxes[node]
        if (derived[0] < box[0]).any() or (derived[1] > box[1]).any():
            raise CertificateInvalidError(
                f"{name}: its box is not the tree's (a split moved or flipped)"
            )
        slopes = self.slopes(name, alphas)
        claim = float(claim)
        if not claim > 0:
            raise CertificateInvalidError(f"{name}: claimed bound {claim} is not > 0")
        got = self.derive(region, node, poly, lam[:rows], slopes)
        if not claim <= got:
            raise CertificateInvalidError(
                f"{name}: claimed bound {claim} exceeds the re-derived bound {got}"
            )
        self.closed.add((region, node, poly))

    def derive(self, region: int, node: int, poly: int, lam: np.ndarray,
               slopes: dict[int, np.ndarray]) -> float:  # fmt: skip
        """A sound lower bound of `lam^T (C y - b)` on the node's box (C2): the better of
        CROWN's backward pass at `slopes` and the rows' intervals from the output's interval
        (`lam >= 0`)."""
        a = np.asarray(self.regions[region].unsafe[poly].A, np.float64)
        b = np.asarray(self.regions[region].unsafe[poly].b, np.float64)
        layers, box = [*self.layers, (a, -b, False)], self.trees[region].boxes[node]
        bounds = self.bounds_of(region, node)
        crown = backward(layers, bounds, box, lam[None], len(layers), slopes)[0]
        row_lower, _ = affine_interval(a, -b, *bounds[-1])
        return float(max(crown, matmul_lo(lam, row_lower)))

    def slopes(self, name: str, alphas: list[np.ndarray]) -> dict[int, np.ndarray]:
        if len(alphas) != len(self.relus):
            raise CertificateInvalidError(
                f"{name}: {len(alphas)} slope layers for {len(self.relus)} ReLUs"
            )
        out = {}
        for k, alpha in zip(self.relus, alphas):
            if alpha.shape != (self.layers[k - 1][0].shape[0],):
                raise CertificateInvalidError(
                    f"{name}: slopes of ReLU layer {k} have shape {alpha.shape}"
                )
            if not ((alpha >= 0) & (alpha <= 1)).all():
                raise CertificateInvalidError(
                    f"{name}: a slope alpha of ReLU layer {k} is outside [0, 1]"
                )
            out[k] = alpha
        return out

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


def _batch_leaves(checker: Checker, batch: dict[str, np.ndarray]) -> None:
    if "leaf_ints" not in batch:
        return
    relus = sorted(k for k in batch if k.startswith("leaf_alpha"))
    relus.sort(key=lambda k: int(k[len("leaf_alpha") :]))
    for i, ints in enumerate(batch["leaf_ints"]):
        box = (batch["leaf_lower"][i], batch["leaf_upper"][i])
        checker.leaf(ints, batch["leaf_lambda"][i], batch["leaf_claim"][i], box,
                     [batch[k][i] for k in relus])  # fmt: skip


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
    checker, batches = Checker(layers, regions), int(manifest.get("batches", 0))
    if manifest.get("answer") == "sat":
        for batch in read_batches(cert_path, batches):
            if "sat_x" in batch:
                region = int(np.asarray(batch["sat_region"]).reshape(-1)[0])
                return checker.counterexample(region, batch["sat_x"].reshape(-1))
        raise CertificateInvalidError("counterexample: none stored")
    if manifest.get("answer") != "unsat":
        raise CertificateInvalidError(f"manifest: answer {manifest.get('answer')!r}")
    for batch in read_batches(cert_path, batches):
        if "split_ints" in batch:
            checker.splits(batch["split_ints"], batch["split_point"])
    for batch in read_batches(cert_path, batches):
        _batch_leaves(checker, batch)
    checker.coverage()


def check_certificate(
    net_path: str | os.PathLike, spec_path: str | os.PathLike, cert_path: str | os.PathLike
) -> CheckResult:
    """Check the certificate `cert_path` of the property `spec_path` (VNN-LIB) on the network
    `net_path` (ONNX): `CheckResult(True)` or `CheckResult(False, reason)`."""
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
