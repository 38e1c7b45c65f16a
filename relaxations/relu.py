"""Planet (triangle) relaxation of ReLU (Ehlers 2017; CROWN: Zhang et al. 2018).

For `xh` in `[l, u]` and `x = relu(xh)`:
- passing (`l >= 0`): `x = xh`;
- blocking (`u <= 0`): `x = 0`;
- ambiguous (`l < 0 < u`): the triangle `x >= 0`, `x >= xh`, `x <= u (xh - l) / (u - l)`.
CROWN's lower line is `alpha xh` with `alpha` in [0, 1]; its adaptive choice is
`alpha = 1 if u > -l else 0` (Zhang et al., NeurIPS 2018, Sec. 3.2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relaxations.base import RELU_PIECES, LinearBounds, LinearConstraints, Relaxation
from relaxations.registry import register


def neuron_status(lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Boolean masks (passing, blocking, ambiguous)."""
    passing = lower >= 0
    blocking = (upper <= 0) & ~passing
    ambiguous = ~passing & ~blocking
    return passing, blocking, ambiguous


def upper_line(lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
    """Slope and intercept of the triangle's upper side (exact for stable neurons)."""
    passing, _, ambiguous = neuron_status(lower, upper)
    width = torch.where(ambiguous, upper - lower, torch.ones_like(upper))
    slope = torch.where(ambiguous, upper / width, passing.to(upper.dtype))
    intercept = torch.where(ambiguous, -slope * lower, torch.zeros_like(upper))
    return slope, intercept


@register("relu", torch=(nn.ReLU, torch.relu, F.relu, "relu", torch.relu_, F.relu_, "relu_"),
          onnx=("Relu",))  # fmt: skip
class ReluRelaxation(Relaxation):
    """The Planet relaxation of ReLU; see the module docstring."""

    name = "relu"
    output_range = (0.0, float("inf"))
    rounding_ulps = 0  # max(x, 0) is exact
    convex = True
    monotone = True
    split_at_zero = True
    planet = True  # kernels.prox_relu_block
    anderson = True  # after an affine layer: the convex hull of Anderson et al.
    param_shape = ()  # the lower slope alpha
    pieces = RELU_PIECES

    def forward(self, xh: Tensor) -> Tensor:
        return torch.relu(xh)

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        return torch.relu(lower), torch.relu(upper)

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        """CROWN's adaptive lower slope: 1 where `u > -l`, else 0."""
        return (upper > -lower).to(lower.dtype)

    def project(self, params: Tensor) -> Tensor:
        """Lower slopes onto [0, 1]."""
        return params.clamp(0.0, 1.0)

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        """The ambiguous neurons (`l < 0 < u`)."""
        return neuron_status(lower, upper)[2]

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, params: Tensor | None = None
    ) -> LinearBounds:
        """Lines valid on `[lower, upper]`; `params` (clamped to [0, 1]) is the ambiguous lower
        slope `alpha`.

        `params` may carry extra leading dimensions (e.g. one slope per specification); the
        result then broadcasts against it.
        """
        passing, _, ambiguous = neuron_status(lower, upper)
        up_slope, up_intercept = upper_line(lower, upper)
        alpha = self.default_params(lower, upper) if params is None else params
        alpha = self.project(alpha)
        low_slope = torch.where(ambiguous, alpha, passing.to(alpha.dtype))
        zeros = torch.zeros_like(up_intercept)
        return LinearBounds(low_slope, zeros, up_slope, up_intercept)

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Minimiser `(xh, x)` of `coeff_pre * xh + coeff_post * x` over the relaxed set.

        The set is a segment (stable neurons) or the triangle with vertices `(l, 0)`, `(0, 0)`,
        `(u, u)` (ambiguous); a linear objective attains its minimum at a vertex.
        (Bunel, De Palma et al., UAI 2020, Sec. 3: the subproblem oracle.)
        """
        passing, blocking, _ = neuron_status(lower, upper)
        zero = torch.zeros_like(lower)
        value_l = coeff_pre * lower + coeff_post * torch.relu(lower)
        value_0 = torch.zeros_like(value_l)
        value_u = coeff_pre * upper + coeff_post * torch.relu(upper)
        # Ambiguous: vertices (l, 0), (0, 0), (u, u); stable: the segment's two ends.
        use_l = (value_l <= value_0) & (value_l <= value_u)
        use_u = ~use_l & (value_u < value_0)
        xh = torch.where(use_l, lower, torch.where(use_u, upper, zero))
        stable = passing | blocking
        stable_l = value_l <= value_u
        xh = torch.where(stable, torch.where(stable_l, lower, upper), xh)
        x = torch.where(blocking, zero, torch.where(passing, xh, torch.relu(xh)))
        return xh, x

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints:
        """`x >= 0`, `x >= xh` (only one of them for stable neurons), `x <= upper line`."""
        passing, blocking, _ = neuron_status(lower, upper)
        up_slope, up_intercept = upper_line(lower, upper)
        zeros = torch.zeros_like(lower)
        ones = torch.ones_like(lower)
        # Row 0: x >= 0 (x >= xh for passing); row 1: x >= xh (x >= 0 for blocking).
        first = torch.where(passing, ones, zeros)
        second = torch.where(blocking, zeros, ones)
        return LinearConstraints(
            lower_slopes=torch.stack([first, second]),
            lower_intercepts=torch.stack([zeros, zeros]),
            upper_slopes=up_slope.unsqueeze(0),
            upper_intercepts=up_intercept.unsqueeze(0),
        )
