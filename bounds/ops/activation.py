"""The one generic elementwise nonlinear op, driven by a Relaxation (ReLU today)."""

from __future__ import annotations

from torch import Tensor

from bounds.ops.base import BoundOp
from bounds.types import Interval
from relaxations.base import Relaxation


class ActivationOp(BoundOp):
    """`x = sigma(xh)` elementwise; bounds come from `relaxation` given the input's interval."""

    is_affine = False

    def __init__(self, relaxation: Relaxation, shape: tuple[int, ...]) -> None:
        self.relaxation = relaxation
        self.in_shape = self.out_shape = tuple(shape)

    def forward(self, xh: Tensor) -> Tensor:
        return self.relaxation.forward(xh)

    def interval(self, xh: Interval) -> Interval:
        return Interval(*self.relaxation.interval(xh.lower, xh.upper))
