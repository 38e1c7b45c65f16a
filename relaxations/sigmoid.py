"""CROWN relaxation of the logistic sigmoid `1 / (1 + exp(-x))` (Zhang et al., NeurIPS 2018,
appendix A: S-shaped activations; tangent points optimised as in alpha-CROWN, Xu et al., ICLR
2021). Convex on `x <= 0`, concave on `x >= 0`; the lines are `relaxations.s_shaped`'s."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relaxations.registry import register
from relaxations.s_shaped import MonotoneSRelaxation


@register("sigmoid", torch=(torch.sigmoid, F.sigmoid, "sigmoid", nn.Sigmoid), onnx=("Sigmoid",))
class SigmoidRelaxation(MonotoneSRelaxation):
    """Sigmoid; the derivative is `sigmoid(x) sigmoid(-x)` (accurate where `sigmoid(x)`
    rounds to 1, unlike `s (1 - s)`)."""

    name = "sigmoid"
    output_range = (0.0, 1.0)

    def f(self, x: Tensor) -> Tensor:
        return torch.sigmoid(x)

    def df(self, x: Tensor) -> Tensor:
        return torch.sigmoid(x) * torch.sigmoid(-x)
