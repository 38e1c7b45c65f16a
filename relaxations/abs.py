"""Relaxation of `abs` (ONNX Abs, torch.abs): LeakyReLU with negative slope -1 (relaxations/
leaky_relu.py), `|xh| = -xh + 2 relu(xh)`.

On an ambiguous box (`l < 0 < u`) the convex hull of the graph is the triangle `(l, -l)`,
`(0, 0)`, `(u, u)`: the chord `k xh + c` above (`k = (u + l) / (u - l)`, `c = 2 u (-l) /
(u - l)`, widened by a few ulps) and `s xh` below with `s = -1 + 2 t` in [-1, 1], `t` in [0, 1]
the parameter (CROWN's adaptive default `t = 1` where `u > -l`: the lower line of least area;
Zhang et al. 2018, Sec. 3.2; optimised as in alpha-CROWN, Xu et al. 2021). Exact on each side of
0: `split_at_zero`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relaxations.base import Piece
from relaxations.leaky_relu import LeakyReluRelaxation
from relaxations.registry import register


@register("abs", torch=(torch.abs, "abs"), onnx=("Abs",))
class AbsRelaxation(LeakyReluRelaxation):
    """`abs` as LeakyReLU with slope -1 (no options); see the module docstring."""

    name = "abs"

    def __init__(self) -> None:
        super().__init__(negative_slope=-1.0)
        self.pieces = (Piece(-torch.inf, 0.0, -1.0, 0.0), Piece(0.0, torch.inf, 1.0, 0.0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def forward(self, xh: Tensor) -> Tensor:
        return torch.abs(xh)
