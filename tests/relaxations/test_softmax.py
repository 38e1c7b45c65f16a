"""The softmax relaxation (relaxations/softmax.py) and the clipped exponential beside it
(relaxations/exp.py): dense samples of random and degenerate boxes, tiny to huge (+-1e4)
ranges, float32 and float64; finite lines and finite gradients where exp overflows."""

from __future__ import annotations

import math

import pytest
import torch

from relaxations import get_relaxation
from relaxations.exp import clip_level
from tests.relaxation_checks import check_all
from tests.relaxations.strict_smooth import DTYPES, assert_strictly_valid, boxes

D, F = torch.float64, torch.float32
SCALES = (1e-3, 1.0, 10.0, 100.0, 1e4)


def clipped_sum(ys, dtype) -> torch.Tensor:
    """`sum_k min(exp(y_k), B)` in float64 with the clip level of `dtype`."""
    c = clip_level(dtype)
    return sum(torch.exp(y.clamp(max=c)) for y in ys)


def softmax_boxes(m: int, n: int, scale: float, dtype, seed: int = 0):
    """`m` difference boxes `[n]` (some nearly or exactly degenerate), in `dtype`, and the
    exact interval of the clipped sum over them (the box is a product: ends give it)."""
    gen = torch.Generator().manual_seed(seed)
    centre = torch.randn(m, n, generator=gen, dtype=D) * scale
    width = torch.rand(m, n, generator=gen, dtype=D) * 2 * scale
    width[:, : n // 10] *= 1e-6
    width[:, n // 10 : n // 10 + 3] = 0.0
    lower = centre.to(dtype)
    upper = torch.maximum((centre + width).to(dtype), lower)
    p_l = clipped_sum(lower.to(D), dtype).to(dtype)
    p_u = clipped_sum(upper.to(D), dtype).to(dtype)
    return (*lower, p_l), (*upper, p_u)


def samples(lowers, uppers, k: int, seed: int = 1) -> torch.Tensor:
    """`[k, m, n]` float64 points of the difference boxes: the two extreme corners, then
    uniform."""
    lo = torch.stack([t.to(D) for t in lowers[:-1]])
    up = torch.stack([t.to(D) for t in uppers[:-1]])
    t = torch.rand(k, *lo.shape, generator=torch.Generator().manual_seed(seed), dtype=D)
    t[0], t[1] = 0.0, 1.0
    return lo + t * (up - lo)


def true_softmax(y: torch.Tensor) -> torch.Tensor:
    """`1 / (1 + sum_k exp(y_k))` over dim 1 of `[k, m, n]`, in float64."""
    zero = torch.zeros_like(y[:, :1])
    return torch.softmax(torch.cat([zero, y], 1), 1)[:, 0]


def line_values(slopes, intercept, y: torch.Tensor, p: torch.Tensor):
    """A line at the points, in float64, and the magnitude of its terms."""
    value, size = intercept.to(D).expand(y.shape[0], -1), intercept.to(D).abs()
    for k, s in enumerate(slopes[:-1]):
        value = value + s.to(D) * y[:, k]
        size = size + (s.to(D) * y[:, k]).abs()
    return value + slopes[-1].to(D) * p, size + (slopes[-1].to(D) * p).abs()


def assert_sound(relaxation, lowers, uppers, params, dtype, k: int = 3000) -> None:
    lines = relaxation.linear_bounds(lowers, uppers, params)
    f_lo, f_hi = relaxation.interval(lowers, uppers)
    tensors = (*lines.lower_slopes, *lines.upper_slopes, lines.lower_intercept)
    assert all(bool(torch.isfinite(t).all()) for t in (*tensors, lines.upper_intercept))
    assert ((f_lo >= 0) & (f_lo <= f_hi) & (f_hi <= 1)).all()
    y = samples(lowers, uppers, k)
    f, p = true_softmax(y), clipped_sum(y.unbind(1), dtype)
    low, low_size = line_values(lines.lower_slopes, lines.lower_intercept, y, p)
    up, up_size = line_values(lines.upper_slopes, lines.upper_intercept, y, p)
    # The lines' own float64 evaluation rounds by ~1e-16 of their terms' magnitudes.
    assert (low <= f + 1e-14 * low_size).all(), float((low - f).max())
    assert (up >= f - 1e-14 * up_size).all(), float((f - up).max())
    assert (f_lo.to(D) <= f).all() and (f <= f_hi.to(D)).all()


@DTYPES
@pytest.mark.parametrize("m", [2, 5, 12])
@pytest.mark.parametrize("scale", SCALES)
def test_lines_and_interval_contain_softmax(dtype, m, scale):
    relaxation = get_relaxation("softmax", terms=m)
    lowers, uppers = softmax_boxes(m, 150, scale, dtype, seed=m)
    default = relaxation.default_params(lowers, uppers)
    gen = torch.Generator().manual_seed(7)
    noisy = default + torch.randn(default.shape, generator=gen, dtype=D).to(dtype)
    for params in (None, torch.zeros_like(default), torch.ones_like(default), noisy):
        assert_sound(relaxation, lowers, uppers, params, dtype)


@DTYPES
def test_loose_clipped_sum_bounds_stay_sound(dtype):
    """Valid but loose (CROWN's) bounds on the clipped sum: wider, below 0, or infinite."""
    relaxation = get_relaxation("softmax", terms=4)
    lowers, uppers = softmax_boxes(4, 150, 5.0, dtype, seed=3)
    for p_l, p_u in ((lowers[-1] * 0.5 - 1, uppers[-1] * 2 + 1), (-torch.inf, torch.inf)):
        p_l = torch.as_tensor(p_l, dtype=dtype).expand_as(lowers[-1])
        p_u = torch.as_tensor(p_u, dtype=dtype).expand_as(uppers[-1])
        assert_sound(relaxation, (*lowers[:-1], p_l), (*uppers[:-1], p_u), None, dtype)


def test_huge_ranges_give_the_limits():
    """Differences of +-1e4: all far below 0 gives f ~ 1, one far above gives f ~ 0, a box
    across gives [0, 1]; the lines are the finite interval constants."""
    relaxation = get_relaxation("softmax", terms=2)
    for dtype in (D, F):
        lo = torch.tensor([[-1e4, -2e4, -1e4], [-1e4, -1e4, -5.0]], dtype=dtype)
        up = torch.tensor([[-5e3, 1e4, 1e4], [-5e3, -5e3, 1e4]], dtype=dtype)
        big_p = torch.full((3,), torch.inf, dtype=dtype)
        lowers, uppers = (*lo, torch.zeros(3, dtype=dtype)), (*up, big_p)
        f_lo, f_hi = relaxation.interval(lowers, uppers)
        assert f_lo[0] > 0.999 and f_hi[0] == 1.0
        assert f_lo[1] == 0.0 and f_hi[1] == 1.0
        assert f_lo[2] == 0.0 and 0.99 < f_hi[2] <= 1.0
        lines = relaxation.linear_bounds(lowers, uppers)
        for s in (*lines.lower_slopes, *lines.upper_slopes):
            assert torch.equal(s[1:], torch.zeros_like(s[1:]))
        assert_sound(relaxation, lowers, uppers, None, dtype)


def test_point_boxes_are_nearly_exact():
    relaxation = get_relaxation("softmax", terms=3)
    y = torch.tensor([[0.0, -3.0, 2.0, 40.0], [1.0, -3.0, -2.0, 40.0], [0.5, 0.0, 0.0, -40.0]])
    y = y.to(D)
    ys = (*y, clipped_sum(y, D))
    f = true_softmax(y.unsqueeze(0))[0]
    f_lo, f_hi = relaxation.interval(ys, ys)
    lines = relaxation.linear_bounds(ys, ys)
    at = lambda slopes, b: b + sum(s * t for s, t in zip(slopes, ys))  # noqa: E731
    for value in (f_lo, f_hi, at(lines.lower_slopes, lines.lower_intercept)):
        torch.testing.assert_close(value, f, rtol=1e-12, atol=1e-300)
    torch.testing.assert_close(at(lines.upper_slopes, lines.upper_intercept), f, rtol=1e-12,
                               atol=1e-300)  # fmt: skip


@DTYPES
def test_gradients_stay_finite_where_exp_overflows(dtype):
    """alpha-CROWN differentiates the lines in their parameters and the boxes: no inf or nan
    from the overflowing branches."""
    relaxation = get_relaxation("softmax", terms=3)
    lowers, uppers = softmax_boxes(3, 60, 1e4, dtype, seed=2)
    lowers = tuple(t.clone().requires_grad_(True) for t in lowers)
    uppers = tuple(t.clone().requires_grad_(True) for t in uppers)
    params = relaxation.default_params(lowers, uppers).detach().requires_grad_(True)
    lines = relaxation.linear_bounds(lowers, uppers, params)
    total = lines.lower_intercept.sum() - lines.upper_intercept.sum()
    total = total + sum(s.sum() for s in (*lines.lower_slopes, *lines.upper_slopes))
    total.backward()
    for t in (params, *lowers, *uppers):
        assert torch.isfinite(t.grad).all()


def test_argmin_minimises_over_the_lines():
    relaxation = get_relaxation("softmax", terms=3)
    lowers, uppers = softmax_boxes(3, 40, 2.0, D, seed=5)
    gen = torch.Generator().manual_seed(9)
    coeffs = tuple(torch.randn(40, generator=gen, dtype=D) for _ in range(4))
    c = torch.randn(40, generator=gen, dtype=D)
    xs, z = relaxation.argmin(coeffs, c, lowers, uppers)
    best = sum(a * x for a, x in zip(coeffs, xs)) + c * z
    lines = relaxation.linear_bounds(lowers, uppers)
    lo, up = torch.stack(lowers), torch.stack(uppers)
    t = torch.rand(2000, *lo.shape, generator=gen, dtype=D)
    points = lo + t * (up - lo)
    for slopes, b in ((lines.lower_slopes, lines.lower_intercept),
                      (lines.upper_slopes, lines.upper_intercept)):  # fmt: skip
        zs = b + sum(s * points[:, k] for k, s in enumerate(slopes))
        value = sum(a * points[:, k] for k, a in enumerate(coeffs)) + c * zs
        assert (best <= value + 1e-12).all()
    for x, low, high in zip(xs, lowers, uppers):
        assert ((x >= low) & (x <= high)).all()


def test_bad_options_and_input_counts():
    with pytest.raises(ValueError):
        get_relaxation("softmax", terms=0)
    with pytest.raises(ValueError, match="3 inputs, expected 4"):
        get_relaxation("softmax", terms=3).forward(*torch.zeros(3, 2))


CLIP = get_relaxation("clipped_exp")
C64, C32 = clip_level(D), clip_level(F)
CLIP_BOXES = (
    (-3.0, 2.0), (C64 - 5, C64 + 5), (C64 - 1e-6, C64), (C64, C64 + 3), (C64 + 1, C64 + 9),
    (C32 - 5, C32 + 5), (C32, C32 + 3), (-1e4, 1e4), (-1e4, -10.0), (300.0, 1e4),
)  # fmt: skip


def test_clipped_exp_protocol_checks():
    check_all(CLIP, *boxes(scale=3.0, special=CLIP_BOXES))


@DTYPES
@pytest.mark.parametrize("scale", [1.0, 20.0, 200.0])
def test_clipped_exp_lines_strictly_valid(dtype, scale):
    c = clip_level(dtype)
    lower, upper = boxes(dtype, scale, seed=4, special=CLIP_BOXES)
    assert_strictly_valid(CLIP, lower, upper, lambda x: torch.exp(x.clamp(max=c)))


def test_clipped_exp_is_exp_below_the_clip_level():
    """On boxes below `c` the lines are exp's (so the softmax's sum is bounded as tightly as
    the exp / sum / reciprocal composition bounded it)."""
    exp = get_relaxation("exp")
    lower, upper = torch.tensor([-3.0, 0.0, 10.0], dtype=D), torch.tensor([1.0, 0.5, 40.0], dtype=D)
    mine, theirs = CLIP.linear_bounds(lower, upper), exp.linear_bounds(lower, upper)
    for a, b in zip((mine.lower_slope, mine.upper_slope), (theirs.lower_slope, theirs.upper_slope)):
        torch.testing.assert_close(a, b)
    assert math.isclose(float(CLIP.forward(torch.tensor(1e4, dtype=D))), math.exp(C64))
