"""Value types and the protocol every convex relaxation of an elementwise nonlinearity follows.

A relaxation bounds `x = sigma(xh)` for `xh` in `[lower, upper]` (elementwise, plain tensors).
It supplies
- `linear_bounds(lower, upper, params)`: one lower and one upper line per neuron,
  `a_l xh + b_l <= x <= a_u xh + b_u` (the lines a CROWN backward pass uses), chosen by the
  relaxation's own optimisable `params` (alpha-CROWN optimises them);
- `default_params(lower, upper)` and `project(params)`: the parameters' starting point and
  their projection onto the feasible set. Parameters have shape `[*lower.shape, *param_shape]`
  (callers may add leading dimensions, e.g. one copy per specification) and must be
  normalised so that `project` needs no bounds (ReLU's slope in [0, 1]; an S-shape's tangent
  points as fractions of `[lower, upper]`); `linear_bounds` projects whatever it is given, so
  its lines are valid for any input;
- `needs_refinement(lower, upper)`: the neurons whose relaxation is not exact (CROWN tightens
  the bounds of those only);
- `constraints(lower, upper)`: the relaxed set as any number of lower and upper lines (the LP);
- `argmin(coeff_pre, coeff_post, lower, upper)`: the minimiser of `coeff_pre * xh + coeff_post *
  x` over that set (the Lagrangian-decomposition oracle). The set is a polygon in the plane
  `(xh, x)`, so the minimum is at a vertex: `polygon_argmin` finds it for any relaxation;
  a relaxation may write a faster closed form;
- `pieces`: the function as linear pieces on fixed intervals, for the exact MILP (None when
  it is not piecewise linear);
- traits, each with its default on the base classes (a relaxation declares those that differ):
  `convex`, `monotone` (False), `split_at_zero` (False; exact on each side of `xh = 0`: ReLU
  splitting applies), `planet` (False; its relaxed set is ReLU's Planet triangle, whose oracle
  the fused kernels of `kernels.prox_relu_block` compute), `anderson` (False; True: after an
  affine layer, the Anderson et al. convex hull of `bounds.dual.anderson` applies), `big_m`
  (its pieces are ReLU's, `RELU_PIECES`: the MILP encodes it with one binary per neuron),
  `output_range` (None, or the function's exact range: intervals widened for rounding are
  clipped to it) and `rounding_ulps` (None: `bounds.rounding.DEFAULT_ULPS`; how far its
  interval formulas may be from the exact values);
- `attack_derivative(xh)`: None, or for a piecewise-constant function (derivative 0 almost
  everywhere) the surrogate derivative attacks differentiate it with (`verify.attack_mode`).
Relaxations register themselves with `relaxations.registry.register` (with their torch and
ONNX spellings). This package imports nothing of ours, so `bounds` can build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def broadcast_shape(*shapes: tuple[int, ...]) -> torch.Size:
    """`torch.broadcast_shapes` by numpy's (identical) rules: torch's imports its symbolic
    shapes on the first call, 1.7 s of a fresh process; ValueError where they do not broadcast."""
    return torch.Size(np.broadcast_shapes(*(tuple(s) for s in shapes)))


@dataclass(frozen=True)
class LinearBounds:
    """Elementwise lines: `lower_slope * xh + lower_intercept <= x <= upper_slope * xh + upper_intercept`."""

    lower_slope: Tensor
    lower_intercept: Tensor
    upper_slope: Tensor
    upper_intercept: Tensor


@dataclass(frozen=True)
class MultiLinearBounds:
    """Lines of a nonlinearity of several inputs `z = f(x_1, ..., x_k)`, elementwise over their
    common shape: `sum_i lower_slopes[i] * x_i + lower_intercept <= z <= sum_i upper_slopes[i]
    * x_i + upper_intercept`."""

    lower_slopes: tuple[Tensor, ...]
    lower_intercept: Tensor
    upper_slopes: tuple[Tensor, ...]
    upper_intercept: Tensor


@dataclass(frozen=True)
class LinearConstraints:
    """The relaxed set as inequalities, each over `(xh, x)` elementwise, stacked on dim 0:

    `x >= lower_slopes[k] * xh + lower_intercepts[k]` for each k, and
    `x <= upper_slopes[k] * xh + upper_intercepts[k]` for each k; with `lower <= xh <= upper`.
    """

    lower_slopes: Tensor
    lower_intercepts: Tensor
    upper_slopes: Tensor
    upper_intercepts: Tensor

    def lower_envelope(self, xh: Tensor) -> Tensor:
        """`max_k lower line k` at `xh` `[V, *shape]` (V points per neuron), `[V, *shape]`."""
        lines = self.lower_slopes.unsqueeze(1) * xh + self.lower_intercepts.unsqueeze(1)
        return lines.amax(0)

    def upper_envelope(self, xh: Tensor) -> Tensor:
        """`min_k upper line k` at `xh` `[V, *shape]`, `[V, *shape]`."""
        lines = self.upper_slopes.unsqueeze(1) * xh + self.upper_intercepts.unsqueeze(1)
        return lines.amin(0)


@dataclass(frozen=True)
class Piece:
    """`sigma(xh) = slope * xh + intercept` for `start <= xh <= end` (constants; +-inf allowed)."""

    start: float
    end: float
    slope: float
    intercept: float


@dataclass(frozen=True)
class MultiLinearConstraints:
    """`z >= sum_i lower_slopes[i][k] * x_i + lower_intercepts[k]` and `z <= sum_i
    upper_slopes[i][k] * x_i + upper_intercepts[k]` for each k (stacked on dim 0 of every
    tensor), with each `x_i` in its box."""

    lower_slopes: tuple[Tensor, ...]
    lower_intercepts: Tensor
    upper_slopes: tuple[Tensor, ...]
    upper_intercepts: Tensor


RELU_PIECES = (Piece(-torch.inf, 0.0, 0.0, 0.0), Piece(0.0, torch.inf, 1.0, 0.0))


class Traits:
    """The traits generic code asks a relaxation for (see the module docstring), with their
    defaults: a relaxation sets only those that differ."""

    name: str = ""
    convex: bool = False
    monotone: bool = False
    split_at_zero: bool = False
    planet: bool = False  # the Planet triangle: kernels.prox_relu_block's fused oracle
    anderson: bool = False  # after an affine layer: the hull of bounds.dual.anderson
    param_shape: tuple[int, ...] = ()
    pieces: tuple[Piece, ...] | None = None
    output_range: tuple[float, float] | None = None
    rounding_ulps: int | None = None  # None: bounds.rounding.DEFAULT_ULPS

    @property
    def big_m(self) -> bool:
        """Its pieces are ReLU's (`RELU_PIECES`), so the exact MILP may encode it with one
        binary per ambiguous neuron (big-M, Tjeng et al. 2019)."""
        return self.pieces == RELU_PIECES

    def attack_derivative(self, xh: Tensor) -> Tensor | None:
        """None: attacks use the function's own derivative. A piecewise-constant function
        (derivative 0 almost everywhere) returns the surrogate derivative at `xh` that gradient
        attacks pass through it instead (BPDA, Athalye et al. 2018, Sec. 4.1)."""
        return None


class Relaxation(Traits):
    """Convex relaxation of an elementwise function (see module docstring). Subclasses set
    `name` and the traits that differ from `Traits`' defaults, and implement the methods;
    `argmin` defaults to the generic polygon oracle (`polygon_argmin` over `constraints`)."""

    def forward(self, xh: Tensor) -> Tensor:
        raise NotImplementedError

    def interval(self, lower: Tensor, upper: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def default_params(self, lower: Tensor, upper: Tensor) -> Tensor:
        raise NotImplementedError

    def project(self, params: Tensor) -> Tensor:
        raise NotImplementedError

    def linear_bounds(
        self, lower: Tensor, upper: Tensor, params: Tensor | None = None
    ) -> LinearBounds:
        raise NotImplementedError

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        raise NotImplementedError

    def argmin(
        self, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Minimiser over the polygon `constraints` (a vertex; `polygon_argmin`)."""
        return polygon_argmin(self.constraints(lower, upper), coeff_pre, coeff_post, lower, upper)

    def constraints(self, lower: Tensor, upper: Tensor) -> LinearConstraints:
        raise NotImplementedError


class MultiRelaxation(Traits):
    """Convex relaxation of an elementwise function of `n_inputs` tensors of one shape (a
    product of two variables). The same protocol as `Relaxation`, with `lower`/`upper` tuples
    (one per input): `linear_bounds` gives `MultiLinearBounds`, `argmin(coeffs_pre, coeff_post,
    lowers, uppers)` gives `(tuple of inputs, output)`, `constraints` a `MultiLinearConstraints`.
    `needs_refinement(lower, upper)` takes one input's interval: the neurons of that input
    whose bounds matter (its interval is computed before the other inputs' are known)."""

    n_inputs: int = 2

    def forward(self, *inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def interval(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def default_params(self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]) -> Tensor:
        raise NotImplementedError

    def project(self, params: Tensor) -> Tensor:
        raise NotImplementedError

    def linear_bounds(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...], params: Tensor | None = None
    ) -> MultiLinearBounds:
        raise NotImplementedError

    def needs_refinement(self, lower: Tensor, upper: Tensor) -> Tensor:
        raise NotImplementedError

    def argmin(
        self, coeffs_pre: tuple[Tensor, ...], coeff_post: Tensor,
        lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...],
    ) -> tuple[tuple[Tensor, ...], Tensor]:  # fmt: skip
        raise NotImplementedError

    def constraints(
        self, lowers: tuple[Tensor, ...], uppers: tuple[Tensor, ...]
    ) -> MultiLinearConstraints:
        raise NotImplementedError


def _crossings(slopes: Tensor, intercepts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`(xh, i, j)`: where lines i < j meet, `[K (K - 1) / 2, *shape]` (nan where parallel),
    and the index pairs."""
    i, j = torch.triu_indices(len(slopes), len(slopes), offset=1, device=slopes.device)
    ds = slopes[i] - slopes[j]
    di = intercepts[j] - intercepts[i]
    cross = torch.where(ds != 0, di / torch.where(ds != 0, ds, torch.ones_like(ds)), torch.nan)
    return cross, i, j


def _values(slopes: Tensor, intercepts: Tensor, xh: Tensor) -> tuple[Tensor, Tensor]:
    """Every line at every point, `[K, V, *shape]`, and a bound on each value's rounding error
    (`2 eps (|a xh| + |b|)`: one product and one sum)."""
    products = slopes.unsqueeze(1) * xh
    values = products + intercepts.unsqueeze(1)
    eps = torch.finfo(values.dtype).eps
    return values, 2 * eps * (products.abs() + intercepts.unsqueeze(1).abs())


def polygon_vertices(
    cons: LinearConstraints, lower: Tensor, upper: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Candidate vertices `(xh, x, feasible)` of the relaxed set, each `[V, *shape]`: both
    envelopes at both ends of `[lower, upper]`, and both envelopes at every crossing of two
    lines inside it. Every vertex of the polygon is among the feasible candidates (a vertex is
    an end of the box on an envelope, a kink of an envelope, or where the envelopes meet).

    Steep lines (exp's tangent at 40 has slope 2e17) make a crossing's `xh` and a line's value
    there inexact by far more than the vertex's own size: `a xh + b` cancels to ~40 from
    ~1e19, each off by ~1e3. So at a crossing of lines i and j the pair's value is the flatter
    line's (its error is small, and it moves little with the crossing's error); the other lines
    come in as envelopes, and feasibility allows every value its rounding error. A candidate so
    admitted may be infeasible by that much, never better by more than the error allows."""
    lines_s = torch.cat([cons.lower_slopes, cons.upper_slopes])
    lines_i = torch.cat([cons.lower_intercepts, cons.upper_intercepts])
    lines_s, lines_i = torch.broadcast_tensors(lines_s, lines_i)
    n_low = len(cons.lower_slopes)
    shape = broadcast_shape(lower.shape, lines_s.shape[1:])
    ends = torch.stack([lower.expand(shape), upper.expand(shape)])
    cross, i, j = _crossings(lines_s, lines_i)
    inside = (cross >= lower) & (cross <= upper)
    xh = torch.cat([ends, torch.where(inside, cross, lower.expand(shape))])
    values, errors = _values(lines_s, lines_i, xh)  # [K, V, *shape]
    # The pair's own value at each crossing: its flatter line's.
    extra = (1,) * (values.dim() - 2)
    i_, j_ = i.view(-1, *extra), j.view(-1, *extra)
    flatter = torch.where(lines_s[i].abs() <= lines_s[j].abs(), i_, j_).unsqueeze(0)
    pick = flatter.expand(1, values.shape[1] - 2, *values.shape[2:])
    pair_value = values[:, 2:].gather(0, pick)[0]
    # The pair out of the envelopes at its own crossing, its value put back in.
    k = torch.arange(len(lines_s), device=xh.device).view(-1, 1)
    in_pair = torch.zeros((len(lines_s), xh.shape[0]), dtype=torch.bool, device=xh.device)
    in_pair[:, 2:] = (k == i.view(1, -1)) | (k == j.view(1, -1))
    in_pair = in_pair.view(*in_pair.shape, *extra)
    is_low = (k < n_low).view(-1, 1, *extra)
    low = values.masked_fill(~is_low | in_pair, -torch.inf).amax(0)
    up = values.masked_fill(is_low | in_pair, torch.inf).amin(0)
    err = errors.amax(0)  # the pair's own lines included
    has_low, has_up = i_ < n_low, j_ >= n_low  # i < j: the pair's lower line is i, if any
    low = torch.cat([low[:2], torch.where(has_low, torch.maximum(low[2:], pair_value), low[2:])])
    up = torch.cat([up[:2], torch.where(has_up, torch.minimum(up[2:], pair_value), up[2:])])
    feasible = low <= up + 2 * err + 1e-9 * (1 + low.abs() + up.abs())
    feasible = feasible & torch.cat([torch.ones_like(ends, dtype=torch.bool), inside])
    return torch.cat([xh, xh]), torch.cat([low, up]), torch.cat([feasible, feasible])


def polygon_argmin(
    cons: LinearConstraints, coeff_pre: Tensor, coeff_post: Tensor, lower: Tensor, upper: Tensor
) -> tuple[Tensor, Tensor]:
    """Minimiser `(xh, x)` of `coeff_pre * xh + coeff_post * x` over the polygon `cons` on
    `[lower, upper]` (Bunel, De Palma et al., UAI 2020, Sec. 3: the subproblem is linear over a
    2-D convex set, so a vertex attains the minimum); shapes broadcast as the inputs do."""
    xh, x, feasible = polygon_vertices(cons, lower, upper)
    value = coeff_pre.unsqueeze(0) * xh + coeff_post.unsqueeze(0) * x
    value = torch.where(feasible, value, torch.inf)
    best = value.argmin(0, keepdim=True)
    full = broadcast_shape(value.shape, xh.shape)
    pick = best.expand(1, *full[1:])
    return xh.expand(full).gather(0, pick)[0], x.expand(full).gather(0, pick)[0]
