"""The BoundOp interface: a layer as a (possibly multi-input) operator with forward, interval,
adjoint (`vjp`) and bias term. Ops hold constants only: no bounds, no flags; methods pass state.

An affine op computes `y = L(x_1, ..., x_k) + b` with `L` linear. For a functional `A` on `y`
(`[batch, n_specs, *out_shape]`): `A . y = sum_i <vjp(A)_i, x_i> + bias_term(A)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from bounds.types import Interval


class BoundOp(ABC):
    """Base class; see the module docstring."""

    n_inputs: int = 1
    is_affine: bool = True

    @abstractmethod
    def forward(self, *inputs: Tensor) -> Tensor: ...

    @abstractmethod
    def interval(self, *inputs: Interval) -> Interval: ...

    def vjp(self, A: Tensor) -> tuple[Tensor, ...]:
        """Adjoint of the linear part: the functional on each input."""
        raise NotImplementedError(f"{type(self).__name__} is not affine")

    def bias_term(self, A: Tensor) -> Tensor:
        """`A . b`, shape `[batch, n_specs]`."""
        raise NotImplementedError(f"{type(self).__name__} is not affine")

    def constants(self) -> tuple[Tensor, ...]:
        """The op's constant tensors (for NaN/Inf and dtype checks)."""
        return ()

    def to(self, dtype: torch.dtype, device: torch.device | str) -> BoundOp:
        """A copy with its constants in `dtype` on `device`."""
        return self


class UnaryAffineOp(BoundOp):
    """Single-input affine op `y = L x + b` defined by `linear`, `abs_linear`, `bias_vector`."""

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    # `L` has no negative entry (`abs_linear` is `linear`: selections, reshapes, broadcasts,
    # sums, padding): the interval is `[L l + b, L u + b]`, exact, where the centre-radius form
    # loses the lower end to cancellation under a huge upper one and gives `inf - inf = nan`
    # when an end is infinite (a softmax's sum of `exp`s).
    nonnegative: bool = False

    @abstractmethod
    def linear(self, x: Tensor) -> Tensor:
        """`L x` for `x` of shape `[N, *in_shape]`."""

    @abstractmethod
    def abs_linear(self, x: Tensor) -> Tensor:
        """`|L| x` (elementwise absolute value of the matrix of `L`)."""

    @abstractmethod
    def bias_vector(self) -> Tensor | None:
        """`b` broadcastable to `out_shape`, or None."""

    @abstractmethod
    def adjoint(self, A: Tensor) -> Tensor:
        """`L^T` applied to `A` of shape `[N, *out_shape]`, giving `[N, *in_shape]`."""

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x)
        b = self.bias_vector()
        return y if b is None else y + b

    def interval(self, x: Interval) -> Interval:
        if self.nonnegative:
            return Interval(self.forward(x.lower), self.forward(x.upper))
        center = self.forward(x.center)
        radius = self.abs_linear(x.radius)
        return Interval(center - radius, center + radius)

    def vjp(self, A: Tensor) -> tuple[Tensor]:
        batch, specs = A.shape[:2]
        flat = A.reshape(batch * specs, *A.shape[2:])
        return (self.adjoint(flat).reshape(batch, specs, *self.in_shape),)

    def bias_term(self, A: Tensor) -> Tensor:
        b = self.bias_vector()
        if b is None:
            return A.new_zeros(A.shape[:2])
        full = torch.broadcast_to(b, self.out_shape)
        return (A * full).flatten(2).sum(-1)

    def as_matrix(self) -> tuple[Tensor, Tensor]:
        """Dense `(W [out, in], b [out])` on flattened shapes; for the LP on small nets only."""
        n_in = 1
        for d in self.in_shape:
            n_in *= d
        proto = self.constants()[0] if self.constants() else torch.zeros((), dtype=torch.float64)
        eye = torch.eye(n_in, dtype=proto.dtype, device=proto.device).reshape(n_in, *self.in_shape)
        W = self.linear(eye).reshape(n_in, -1).T
        zero = torch.zeros(1, *self.in_shape, dtype=proto.dtype, device=proto.device)
        return W, self.forward(zero).reshape(-1)
