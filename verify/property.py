"""The property type every reader returns (VNN-LIB 1.0 and 2.0, `verify.io`): input boxes, each
with a union of unsafe output polytopes. Arrays are float64 and read-only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verify.errors import ShapeMismatchError


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Polytope:
    """The set ``{y : A y + A_x x <= b}`` (``A_x x`` only when some row mixes inputs and outputs).

    Shapes: ``A`` ``[m, n_outputs]``, ``b`` ``[m]``, ``A_x`` ``[m, n_inputs]`` or ``None``.
    ``m == 0`` is the whole output space. Arrays are float64 and read-only. ``strict``
    (``[m]`` bool, or None: none): rows that hold with ``<`` (an ArgMax's tie rule,
    `verify.argmax_output`); bounds use the closure (a superset), ``contains`` the rows as
    stated.
    """

    A: np.ndarray
    b: np.ndarray
    A_x: np.ndarray | None = None
    strict: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "A", _readonly(self.A))
        object.__setattr__(self, "b", _readonly(self.b))
        if self.A.ndim != 2 or self.b.shape != (self.A.shape[0],):
            raise ShapeMismatchError(f"Polytope: A {self.A.shape} and b {self.b.shape} disagree")
        if self.A_x is not None:
            object.__setattr__(self, "A_x", _readonly(self.A_x))
            if self.A_x.ndim != 2 or self.A_x.shape[0] != self.A.shape[0]:
                raise ShapeMismatchError(f"Polytope: A_x {self.A_x.shape} vs A {self.A.shape}")
        if self.strict is not None:
            strict = np.array(self.strict, dtype=bool)
            strict.setflags(write=False)
            object.__setattr__(self, "strict", strict)
            if strict.shape != self.b.shape:
                raise ShapeMismatchError(f"Polytope: strict {strict.shape} vs b {self.b.shape}")

    def contains(self, y: np.ndarray, x: np.ndarray | None = None, tol: float = 0.0) -> bool:
        """Whether ``A y + A_x x <= b + tol``, ``<`` on the strict rows (``x`` [n_inputs] is
        needed iff ``A_x`` is set)."""
        lhs = self.A @ np.asarray(y, dtype=np.float64)
        if self.A_x is not None:
            if x is None:
                raise ShapeMismatchError("Polytope.contains: this polytope needs the input x")
            lhs = lhs + self.A_x @ np.asarray(x, dtype=np.float64)
        if self.strict is not None and np.any(lhs[self.strict] >= self.b[self.strict] + tol):
            return False
        return bool(np.all(lhs <= self.b + tol))


@dataclass(frozen=True, eq=False)
class Region:
    """An input box ``lower <= x <= upper`` (``[n_inputs]`` each) and its unsafe set.

    The unsafe set is the union of ``unsafe``: the property is violated in this region iff some
    ``x`` in the box has ``f(x)`` in ANY of the polytopes.
    """

    lower: np.ndarray
    upper: np.ndarray
    unsafe: tuple[Polytope, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "lower", _readonly(self.lower))
        object.__setattr__(self, "upper", _readonly(self.upper))
        object.__setattr__(self, "unsafe", tuple(self.unsafe))
        if self.lower.ndim != 1 or self.lower.shape != self.upper.shape:
            raise ShapeMismatchError(f"Region: lower {self.lower.shape} vs {self.upper.shape}")


@dataclass(frozen=True)
class NetworkDecl:
    """One network of a VNN-LIB 2.0 property over several: its name, its input's and output's
    sizes and shapes, and the network it is declared `equal-to` (the same model), if any. Its
    input is `x[input_offset : input_offset + n_inputs]` of the property's flat input, its
    output likewise of the flat output (declaration order)."""

    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    input_offset: int
    output_offset: int
    equal_to: str | None = None

    @property
    def n_inputs(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def n_outputs(self) -> int:
        return int(np.prod(self.output_shape))


@dataclass(frozen=True, eq=False)
class VnnlibProperty:
    """A parsed VNN-LIB file: the property is violated iff ``(x, f(x))`` lies in ANY region.
    ``networks``: for a property over several networks, each one's declaration (``x`` and
    ``f(x)`` are then their inputs and outputs concatenated); empty for one network."""

    path: str
    n_inputs: int
    n_outputs: int
    regions: tuple[Region, ...]
    networks: tuple[NetworkDecl, ...] = ()
