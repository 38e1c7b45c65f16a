"""Networks that end in ArgMax / ArgMin: the property is rewritten on the logits.

A classifier exported with its decision, `k = argmax(z)`, has an integer output no bound can
follow through. But `argmax(z) = k` is a polytope of the logits: `z_j <= z_k` for every `j`,
strict for the `j` that win a tie (ONNX ArgMax keeps the first maximal index, or the last with
`select_last_index = 1`). ArgMin likewise with `z_k <= z_j`. So the ONNX reader stops before a
final ArgMax / ArgMin over activations (`ArgOutput` on the module), and `rewrite` turns each
unsafe polytope over the indices (`A k <= b`) into the union, over the index values it
admits, of those polytopes of the logits:

- each polytope's rows mention some outputs `I` (an index per position of the ArgMax output);
  every assignment of classes to `I` (at most `MAX_ASSIGNMENTS`) is checked against the rows
  exactly (rational arithmetic), and each one that satisfies them gives one polytope of the
  logits;
- the strict rows are marked (`Polytope.strict`): bounds use their closure (a superset of the
  unsafe set, so "unsat" stays sound), a counterexample must meet them strictly in float64.

`indices` maps a logits output back to the ArgMax output a counterexample reports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from verify.errors import SpecificationError
from verify.property import Polytope, Region, VnnlibProperty

MAX_ASSIGNMENTS = 10_000
"""Most index assignments one polytope may expand to (its outputs' classes, multiplied)."""


@dataclass(frozen=True)
class ArgOutput:
    """A final `op` ("ArgMax" or "ArgMin") over axis `axis` of the per-sample logits of shape
    `logits_shape`; `keepdims` as in ONNX; `select_last_index`: ties go to the last index."""

    op: str
    axis: int
    logits_shape: tuple[int, ...]
    keepdims: bool = True
    select_last_index: bool = False
    node: str = ""

    @property
    def classes(self) -> int:
        return self.logits_shape[self.axis]

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The per-sample shape of the index output."""
        shape = list(self.logits_shape)
        if self.keepdims:
            shape[self.axis] = 1
        else:
            del shape[self.axis]
        return tuple(shape)

    @property
    def n_logits(self) -> int:
        return int(np.prod(self.logits_shape))

    def class_index(self) -> np.ndarray:
        """`[n_outputs, classes]`: the flat logits index of each (output, class)."""
        flat = np.arange(int(np.prod(self.logits_shape))).reshape(self.logits_shape)
        return np.moveaxis(flat, self.axis, -1).reshape(-1, self.classes)

    def winner_rows(self, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows `R z <= 0` (`[classes - 1, n_logits]`) and their strictness saying that the
        ArgMax (ArgMin) of the output whose classes sit at the flat logits `index` (its row of
        `class_index`) is `k`."""
        n_logits = self.n_logits
        rows, strict = [], []
        sign = 1.0 if self.op == "ArgMax" else -1.0
        for j in range(self.classes):
            if j == k:
                continue
            row = np.zeros(n_logits)
            row[index[j]], row[index[k]] = sign, -sign  # z_j <= z_k (ArgMin: z_k <= z_j)
            rows.append(row)
            strict.append(j > k if self.select_last_index else j < k)  # j would win a tie
        return np.array(rows).reshape(-1, n_logits), np.array(strict, dtype=bool)


def _admits(A: np.ndarray, b: np.ndarray, classes: tuple[int, ...]) -> bool:
    """Whether `A k <= b` holds for the integer `k`, in exact rational arithmetic (float64
    could round `0.1 + 0.2` above `0.3` and drop a class the file admits)."""
    return all(sum((Fraction(a) * k for a, k in zip(row, classes)), Fraction(0)) <= Fraction(c)
               for row, c in zip(A.tolist(), b.tolist()))  # fmt: skip


def _expand(poly: Polytope, arg: ArgOutput, index: np.ndarray, where: str) -> list[Polytope]:
    """The polytopes of the logits whose union is `{z : A argmax(z) <= b}` (`index`: the
    ArgMax's `class_index`)."""
    if poly.A_x is not None:
        raise SpecificationError(f"{where}: rows over the inputs and an ArgMax output together")
    involved = np.flatnonzero(np.any(poly.A != 0, axis=0))
    count = arg.classes ** len(involved)
    if count > MAX_ASSIGNMENTS:
        raise SpecificationError(
            f"{where}: the rows mention {len(involved)} outputs of {arg.node or arg.op}, "
            f"{count} class assignments (> {MAX_ASSIGNMENTS})"
        )
    out, n_logits = [], arg.n_logits
    for classes in itertools.product(range(arg.classes), repeat=len(involved)):
        if not _admits(poly.A[:, involved], poly.b, classes):
            continue
        parts = [arg.winner_rows(index[i], k) for i, k in zip(involved, classes)]
        if not parts:  # no output mentioned: the polytope is all of the logits' space
            out.append(Polytope(np.zeros((0, n_logits)), np.zeros(0)))
            continue
        rows = np.concatenate([r for r, _ in parts])
        strict = np.concatenate([s for _, s in parts])
        out.append(Polytope(rows, np.zeros(len(rows)), strict=strict))
    return out


def rewrite(spec: VnnlibProperty, arg: ArgOutput) -> VnnlibProperty:
    """`spec`, stated on the ArgMax output, restated on the logits (module docstring).
    `SpecificationError` when its outputs are not the ArgMax output's, or a polytope expands
    to more than `MAX_ASSIGNMENTS` assignments."""
    n_out = int(np.prod(arg.output_shape))
    if spec.n_outputs != n_out:
        raise SpecificationError(
            f"{spec.path}: the property has {spec.n_outputs} outputs but the network's "
            f"{arg.op} ({arg.node}) gives {n_out}"
        )
    index = arg.class_index()
    regions = []
    for r, region in enumerate(spec.regions):
        unsafe = []
        for p, poly in enumerate(region.unsafe):
            unsafe += _expand(poly, arg, index, f"{spec.path}: region {r}, polytope {p}")
        regions.append(Region(region.lower, region.upper, tuple(unsafe)))
    return VnnlibProperty(spec.path, spec.n_inputs, arg.n_logits, tuple(regions), spec.networks)


def indices(logits: Tensor, arg: ArgOutput) -> Tensor:
    """The ArgMax (ArgMin) output `[n_outputs]` (float64) of flat logits `[n_logits]`, ties
    resolved as ONNX does."""
    z = logits.detach().double().reshape(-1)[torch.from_numpy(arg.class_index())]
    z = -z if arg.op == "ArgMin" else z
    if arg.select_last_index:
        return (arg.classes - 1 - z.flip(1).argmax(1)).double()
    return z.argmax(1).double()  # torch.argmax returns the first maximal index
