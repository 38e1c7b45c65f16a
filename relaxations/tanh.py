"""CROWN relaxation of `tanh` (Zhang et al., NeurIPS 2018, appendix A: S-shaped activations;
tangent points optimised as in alpha-CROWN, Xu et al., ICLR 2021). Convex on `x <= 0`, concave
on `x >= 0`; the lines are `relaxations.s_shaped`'s."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relaxations.registry import register
from relaxations.s_shaped import MonotoneSRelaxation


@register("tanh", torch=(torch.tanh, F.tanh, "tanh", nn.Tanh), onnx=("Tanh",))
class TanhRelaxation(MonotoneSRelaxation):
    """tanh; the derivative is `1 / cosh(x)^2` (accurate where `tanh` rounds to +-1, unlike
    `1 - tanh(x)^2`; `cosh` overflowing gives 0, below the true value by less than a rounding
    margin)."""

    name = "tanh"
    output_range = (-1.0, 1.0)

    def f(self, x: Tensor) -> Tensor:
        return torch.tanh(x)

    def df(self, x: Tensor) -> Tensor:
        return torch.cosh(x).square().reciprocal()
