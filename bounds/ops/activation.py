"""The generic nonlinear ops, driven by a relaxation: `ActivationOp` (elementwise, one input)
and `MultiActivationOp` (elementwise over several inputs of one shape, e.g. a product)."""

from __future__ import annotations

from torch import Tensor

from bounds.ops.base import BoundOp
from bounds.rounding import DEFAULT_ULPS, widen_ulps
from bounds.types import Interval
from relaxations.base import MultiRelaxation, Relaxation


class ActivationOp(BoundOp):
    """`x = sigma(xh)` elementwise; bounds come from `relaxation` given the input's interval."""

    is_affine = False

    def __init__(self, relaxation: Relaxation, shape: tuple[int, ...]) -> None:
        self.relaxation = relaxation
        self.in_shape = self.out_shape = tuple(shape)

    def forward(self, xh: Tensor) -> Tensor:
        return self.relaxation.forward(xh)

    def rounding_ulps(self) -> int:
        """How far (in ulps) the relaxation's interval formulas may be from the exact function
        values (`Relaxation.rounding_ulps`, default `bounds.rounding.DEFAULT_ULPS`)."""
        ulps = self.relaxation.rounding_ulps
        return DEFAULT_ULPS if ulps is None else ulps

    def in_range(self, iv: Interval) -> Interval:
        """`iv` clipped to the function's exact range (`Relaxation.output_range`, optional):
        widening for rounding never needs to leave it."""
        bounds = self.relaxation.output_range
        if bounds is None:
            return iv
        return Interval(iv.lower.clamp(min=bounds[0]), iv.upper.clamp(max=bounds[1]))

    def interval(self, xh: Interval) -> Interval:
        """The relaxation's interval, each end widened by `rounding_ulps` (`bounds.rounding`)."""
        iv = Interval(*self.relaxation.interval(xh.lower, xh.upper))
        return self.in_range(widen_ulps(iv, self.rounding_ulps()))

    def relaxation_bounds(self, *inputs: Interval) -> tuple:
        """`(lower, upper)` as the relaxation takes them: tensors (one input), or tuples."""
        return inputs[0].lower, inputs[0].upper


class MultiActivationOp(ActivationOp):
    """`z = f(x_1, ..., x_k)` elementwise over inputs of one shape (`relaxation.n_inputs`)."""

    def __init__(self, relaxation: MultiRelaxation, shape: tuple[int, ...]) -> None:
        super().__init__(relaxation, shape)
        self.n_inputs = relaxation.n_inputs

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.relaxation.forward(*inputs)

    def interval(self, *inputs: Interval) -> Interval:
        iv = Interval(*self.relaxation.interval(*self.relaxation_bounds(*inputs)))
        return self.in_range(widen_ulps(iv, self.rounding_ulps()))

    def relaxation_bounds(self, *inputs: Interval) -> tuple:
        return tuple(i.lower for i in inputs), tuple(i.upper for i in inputs)
