"""McCormick relaxation of the product of two variables `z = x y` over a box (McCormick,
Math. Programming 1976; its use for neural networks with products: e.g. Shi et al., ICLR 2020,
"Robustness verification for transformers").

For `x` in `[lx, ux]` and `y` in `[ly, uy]` the convex hull of the graph of `x y` is
- `z >= ly x + lx y - lx ly` and `z >= uy x + ux y - ux uy` (lower planes),
- `z <= uy x + lx y - lx uy` and `z <= ly x + ux y - ux ly` (upper planes),
whose vertices are the four corners `(x, y, x y)`. A CROWN pass needs one line on each side:
a convex combination `t P1 + (1 - t) P2` of the two planes (valid: both are), with `t` the
relaxation's parameter (one for the lower side, one for the upper; default 1/2). The minimum
of a linear function over the hull is at a corner (the LD oracle).
"""

from __future__ import annotations

import torch
from torch import Tensor

from relaxations.base import (
    MultiLinearBounds,
    MultiLinearConstraints,
    MultiRelaxation,
    broadcast_shape,
)
from relaxations.registry import register


def _planes(lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]):
    """`(slope_x, slope_y, intercept)` of the two lower then the two upper planes."""
    (lx, ly), (ux, uy) = lowers, uppers
    return (
        ((ly, lx, -lx * ly), (uy, ux, -ux * uy)),
        ((uy, lx, -lx * uy), (ly, ux, -ux * ly)),
    )


def _mix(t: Tensor, first, second) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(t * a + (1 - t) * b for a, b in zip(first, second))


@register("product")
class ProductRelaxation(MultiRelaxation):
    """McCormick envelopes of `x * y`; see the module docstring."""

    name = "product"
    n_inputs = 2
    convex = False
    monotone = False
    split_at_zero = False
    param_shape = (2,)  # (t of the lower side, t of the upper side)
    pieces = None

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return x * y

    def interval(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor]:
        """The exact range: the extreme corner products."""
        (lx, ly), (ux, uy) = lowers, uppers
        corners = torch.stack([lx * ly, lx * uy, ux * ly, ux * uy])
        return corners.amin(0), corners.amax(0)

    def default_params(self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]) -> Tensor:
        shape = broadcast_shape(*(t.shape for t in (*lowers, *uppers)))
        return lowers[0].new_full((*shape, 2), 0.5)

    def project(self, params: Tensor) -> Tensor:
        return params.clamp(0.0, 1.0)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """Any input neuron that is not fixed (the product is linear in `x` when `y` is fixed,
        but that depends on the other input, unknown here)."""
        return upper > lower

    def linear_bounds(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...], params: Tensor | None = None
    ) -> MultiLinearBounds:
        """One lower and one upper line per element; `params[..., 0]`, `params[..., 1]` mix the
        lower and the upper planes (projected onto [0, 1])."""
        if params is None:
            params = self.default_params(lowers, uppers)
        params = self.project(params)
        (low1, low2), (up1, up2) = _planes(lowers, uppers)
        ax, ay, b = _mix(params[..., 0], low1, low2)
        cx, cy, d = _mix(params[..., 1], up1, up2)
        return MultiLinearBounds((ax, ay), b, (cx, cy), d)

    def constraints(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]
    ) -> MultiLinearConstraints:
        """The four McCormick planes (two per side)."""
        lows, ups = _planes(lowers, uppers)

        def stack(planes, i):
            return torch.stack(torch.broadcast_tensors(*(p[i] for p in planes)))

        return MultiLinearConstraints(
            (stack(lows, 0), stack(lows, 1)), stack(lows, 2),
            (stack(ups, 0), stack(ups, 1)), stack(ups, 2),
        )  # fmt: skip

    def argmin(
        self,
        coeffs_pre: tuple[Tensor, ...],
        coeff_post: Tensor,
        lowers: tuple[Tensor, ...],
        uppers: tuple[Tensor, ...],
    ) -> tuple[tuple[Tensor, ...], Tensor]:
        """Minimiser of `a x + b y + c z` over the hull: the best of its four corners."""
        (a, b), c = coeffs_pre, coeff_post
        (lx, ly), (ux, uy) = lowers, uppers
        xs = torch.stack(torch.broadcast_tensors(lx, lx, ux, ux, a))[:4]
        ys = torch.stack(torch.broadcast_tensors(ly, uy, ly, uy, a))[:4]
        values = a * xs + b * ys + c * xs * ys
        pick = values.argmin(0, keepdim=True)
        x, y = xs.gather(0, pick)[0], ys.gather(0, pick)[0]
        return (x, y), x * y
