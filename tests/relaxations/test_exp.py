"""The relaxation of exp (relaxations/exp.py): chord above, tangent below; strict float64 and
float32 validity, mpmath, the positive default lower line, and the overflow error."""

from __future__ import annotations

import mpmath
import pytest
import torch

import relaxations.exp  # noqa: F401  (registers "exp")
from relaxations import get_relaxation
from tests.relaxation_checks import check_all, check_methods_sound
from tests.relaxations.strict_smooth import (
    DTYPES,
    assert_constraints_at_least_as_tight,
    assert_point_box_exact,
    assert_strictly_valid,
    assert_valid_mpmath,
    boxes,
)

D, F = torch.float64, torch.float32
exp = get_relaxation("exp")
SPECIAL = (
    (0.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (-5.0, -5.0 + 1e-7), (-1e-7, 1e-7), (-40.0, 40.0),
    (-700.0, 50.0), (-1e4, 2.0), (-0.3, 8.0), (50.0, 60.0), (-3.0, 0.5), (1e-7, 1e-7),
    (-1e-300, 1e-300), (3.0, 3.0 + 1e-9), (-800.0, -700.0),
)  # fmt: skip
# The harness samples its polygons by `low + t (up - low)`, which loses everything at the
# magnitudes of (-700, 50) (e^50 * 750 ~ 1e24); that box is checked by the strict tests only.
HARNESS = (*(b for b in SPECIAL if b != (-700.0, 50.0)), (-700.0, 5.0))


def test_protocol_checks():
    for scale in (0.5, 3.0, 15.0):
        check_all(exp, *boxes(scale=scale, special=HARNESS))


@DTYPES
@pytest.mark.parametrize("scale", [0.5, 5.0, 20.0], ids=["narrow", "medium", "wide"])
def test_lines_strictly_valid(dtype, scale):
    lower, upper = boxes(dtype, scale, seed=3, special=SPECIAL)
    keep = upper <= (80.0 if dtype == F else 700.0)  # past these, overflow errors (tested below)
    assert_strictly_valid(exp, lower[keep], upper[keep], torch.exp)


def test_near_overflow_boxes_are_valid():
    lower = torch.tensor([600.0, 700.0, -1e4], dtype=D)
    upper = torch.tensor([700.0, 701.0, 695.0], dtype=D)
    assert_strictly_valid(exp, lower, upper, torch.exp)
    lower32, upper32 = torch.tensor([70.0, -80.0], dtype=F), torch.tensor([80.0, 79.0], dtype=F)
    assert_strictly_valid(exp, lower32, upper32, torch.exp)


def test_lines_valid_in_mpmath():
    assert_valid_mpmath(exp, *boxes(D, 5.0, seed=4, special=SPECIAL), torch.exp, mpmath.exp)


def test_default_lower_line_is_positive_on_the_box():
    """The default tangent point `min(mid, l + 0.99)` keeps `e^d (1 + x - d) > 0` on the box."""
    lower, upper = boxes(D, 3.0, special=SPECIAL)
    keep = (upper < 300) & (lower > -600)  # e^x neither overflows nor underflows
    lower, upper = lower[keep], upper[keep]
    lines = exp.linear_bounds(lower, upper)
    at_l = lines.lower_slope * lower + lines.lower_intercept
    assert (lines.lower_slope > 0).all() and (at_l > 0).all()
    d = torch.minimum((lower + upper) / 2, lower + 0.99)
    torch.testing.assert_close(lines.lower_slope, torch.exp(d))


def test_params_are_tangent_points_and_upper_is_the_chord():
    lower, upper = torch.tensor([-1.0, 0.0], dtype=D), torch.tensor([2.0, 0.5], dtype=D)
    for t, point in ((0.0, lower), (1.0, upper)):
        lines = exp.linear_bounds(lower, upper, torch.full((2, 1), t, dtype=D))
        torch.testing.assert_close(lines.lower_slope, torch.exp(point))
        chord = (torch.exp(upper) - torch.exp(lower)) / (upper - lower)
        torch.testing.assert_close(lines.upper_slope, chord)


def test_point_box_interval_and_constraints():
    assert_point_box_exact(exp, torch.tensor([-3.0, 0.0, 2.0, 50.0], dtype=D))
    lower, upper = boxes(special=SPECIAL)
    low, up = exp.interval(lower, upper)
    assert torch.equal(low, torch.exp(lower)) and torch.equal(up, torch.exp(upper))
    keep = upper < 300
    assert_constraints_at_least_as_tight(exp, lower[keep], upper[keep])


@pytest.mark.parametrize(
    ("dtype", "box", "index"),
    [(F, (80.0, 90.0), 1), (F, (87.0, 88.0), 1), (D, (700.0, 720.0), 1), (D, (-1.0, 710.0), 1)],
    ids=["f32_past_88", "f32_intercept", "f64_past_709", "f64_wide"],
)  # fmt: skip
def test_overflow_raises_naming_the_index(dtype, box, index):
    lower = torch.tensor([0.0, box[0]], dtype=dtype)
    upper = torch.tensor([1.0, box[1]], dtype=dtype)
    match = rf"exp relaxation: at index \({index},\).*overflows {dtype}"
    with pytest.raises(ValueError, match=match):
        exp.linear_bounds(lower, upper)
    with pytest.raises(ValueError, match=match):
        exp.constraints(lower, upper)
    low, up = exp.interval(lower, upper)  # the interval stays sound (inf where it overflows)
    assert torch.equal(low, torch.exp(lower)) and torch.equal(up, torch.exp(upper))


def test_overflowing_tangent_falls_back_to_the_default_line():
    """float32 [-37, 84.9]: the tangent at u overflows (e^84.9 * 84.9 > 3.4e38), the default
    tangent near l does not; params at u give the default's (valid, finite) lower line."""
    lower, upper = torch.tensor([-37.0], dtype=F), torch.tensor([84.9], dtype=F)
    lines = exp.linear_bounds(lower, upper, torch.ones(1, 1, dtype=F))
    default = exp.linear_bounds(lower, upper)
    assert torch.equal(lines.lower_slope, default.lower_slope)
    assert_strictly_valid(exp, lower, upper, torch.exp)


def test_infinite_bounds_raise():
    with pytest.raises(ValueError, match=r"finite; at index \(0,\)"):
        exp.linear_bounds(torch.tensor([-torch.inf]), torch.tensor([0.0]))


def test_methods_sound():
    check_methods_sound(exp, scale=1.0)
    check_methods_sound(exp, methods=("lp",), seeds=(0,), scale=1.0, radius=0.5)


def test_argmin_finds_the_vertex_at_a_steep_tangent():
    """On [-40, 40] the tangent at 40 has slope e^40 ~ 2e17: where it meets the tangent at 0
    (xh ~ 39), `a xh + b` cancels from ~1e19, so the envelope there is off by ~1e3. The
    minimum of -0.92 xh + 0.127 x is that vertex, ~ -0.92 * 39 + 0.127 * 40 = -30.8; a point
    of the set, (38, 39) on the tangent at 0, already gives -30.04 (once 0.92 was returned)."""
    lower, upper = torch.tensor([-40.0], dtype=D), torch.tensor([40.0], dtype=D)
    cp, cq = torch.tensor([-0.92], dtype=D), torch.tensor([0.127], dtype=D)
    xh, x = exp.argmin(cp, cq, lower, upper)
    value = float(cp * xh + cq * x)
    assert value <= -0.92 * 38 + 0.127 * 39
    assert 38.9 < float(xh) <= 40.0 and abs(float(x) - (1 + float(xh))) < 1e-6
