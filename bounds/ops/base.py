"""The BoundOp interface: a layer as a (possibly multi-input) operator with forward, interval,
adjoint (`vjp`) and bias term. Ops hold constants only: no bounds, no flags; methods pass state.

An affine op computes `y = L(x_1, ..., x_k) + b` with `L` linear. For a functional `A` on `y`
(`[batch, n_specs, *out_shape]`): `A . y = sum_i <vjp(A)_i, x_i> + bias_term(A)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property

import torch
from torch import Tensor

from bounds.rounding import CONSTANT_ROUNDINGS, error_bound, lower_minus, magnitude, upper_plus
from bounds.types import Interval


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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

    def backward_error(self, A: Tensor, sizes: list[Tensor]) -> Tensor:
        """A proven bound `[batch, n_specs]` on the rounding error of `vjp(A)` and
        `bias_term(A)` as they enter a linear bound, given the magnitudes `sizes` (`[batch,
        *shape]`, one per input) of the inputs' values: `sum_i |vjp(A)_i - exact| . sizes_i +
        |bias_term(A) - exact|` (`bounds.rounding`; affine ops only)."""
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

    # Pure data movement (reshapes, selections, padding, broadcasts): no arithmetic, so no
    # rounding. Other ops round; see `bounds.rounding` for the error model.
    exact: bool = False
    # `sign_split` costs about what `linear` does (elementwise maps): each end's rounding is
    # then bounded by its own terms (a huge upper end does not loosen a small lower one).
    cheap_split: bool = False

    @cached_property
    def weight_parts(self) -> tuple[Tensor, Tensor, Tensor]:
        """`(|W|, W+, W-)` of an op with a `weight` (Linear, Conv, MatMul), computed once."""
        w = self.weight
        return w.abs(), w.clamp(min=0), w.clamp(max=0)

    def fan_in(self) -> int:
        """The most non-zeros in a row of `L` (terms summed per output); default: all inputs."""
        return numel(self.in_shape)

    def fan_out(self) -> int:
        """The most non-zeros in a column of `L` (terms the adjoint sums per input); default:
        all outputs."""
        return numel(self.out_shape)

    def sign_split(self, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor] | None:
        """`(L+ low + L- high, L+ high + L- low)` (no bias), the interval from its endpoints, or
        None where the op has no such form (then centre and radius, with its rounding error)."""
        return None

    def interval(self, x: Interval) -> Interval:
        """From the endpoints, widened by the proven rounding error (`bounds.rounding`):
        `gamma_(n+4) (|L| m + |b|)`, `m = max(|l|, |u|)`, `n` = `fan_in`."""
        b = self.bias_vector()
        if self.nonnegative:
            low, high = self.linear(x.lower), self.linear(x.upper)
        else:
            split = self.sign_split(x.lower, x.upper)
            if split is None:  # L c - |L| r: the rounding of c and r is one more rounding each
                center, radius = self.linear(x.center), self.abs_linear(x.radius)
                split = (center - radius, center + radius)
            low, high = split
        if b is not None:
            low, high = low + b, high + b
        if self.exact:
            return Interval(low, high)
        if self.nonnegative:  # each end's own terms
            mags = [self.linear(x.lower.abs()), self.linear(x.upper.abs())]
        elif self.cheap_split:  # L+ |l| + |L-| |u| and L+ |u| + |L-| |l|
            first, second = self.sign_split(x.lower.abs(), -x.upper.abs())
            mags = [first, -second]
        else:
            mags = [self.abs_linear(magnitude(x))] * 2
        if b is not None:
            mags = [m + b.abs() for m in mags]
        n, k = self.fan_in(), self.fan_in() + 4 + CONSTANT_ROUNDINGS
        low = lower_minus(low, error_bound(mags[0], k, n))
        return Interval(low, upper_plus(high, error_bound(mags[1], k, n)))

    def backward_error(self, A: Tensor, sizes: list[Tensor]) -> Tensor:
        """`gamma_(fan_out+2) |A| . (|L| m) + gamma_(N+2) |A| . |b|` (`N` = outputs summed by
        `bias_term`); none for data movement."""
        b = self.bias_vector()
        sums = not self.exact or self.fan_out() > 1  # a data move's adjoint may add copies
        if not sums and b is None:
            return A.new_zeros(A.shape[:2])
        absA = A.abs()
        err = A.new_zeros(A.shape[:2])
        if sums:
            spread = self.abs_linear(sizes[0]).flatten(1).unsqueeze(-1)  # [B, n, 1]: |L| m
            k = self.fan_out() + 2 + CONSTANT_ROUNDINGS
            summed = (absA.flatten(2) @ spread).squeeze(-1)
            err = error_bound(summed, k, self.fan_out())
        if b is not None:
            n = numel(self.out_shape)
            full = torch.broadcast_to(b.abs(), self.out_shape)
            k = n + 2 + CONSTANT_ROUNDINGS
            err = err + error_bound((absA * full).flatten(2).sum(-1), k, n)
        return err

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
