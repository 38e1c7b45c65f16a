"""The relaxation of 1/x (relaxations/reciprocal.py): convex on x > 0, concave on x < 0; boxes
touching 0 are refused; strict float64/float32 validity, mpmath, and sound bounds through every
method on nets whose denominators stay positive (or negative)."""

from __future__ import annotations

import pytest
import torch

import relaxations.reciprocal  # noqa: F401  (registers "reciprocal")
import verify
from relaxations import get_relaxation
from tests.relaxation_checks import check_all
from tests.relaxations.strict_smooth import (
    DTYPES,
    assert_constraints_at_least_as_tight,
    assert_point_box_exact,
    assert_strictly_valid,
    assert_valid_mpmath,
    boxes,
)
from tests.soundness import assert_contains, box_samples

D, F = torch.float64, torch.float32
recip = get_relaxation("reciprocal")
SPECIAL = (
    (1e-3, 1.0), (1e-6, 1e6), (-1e6, -1e-6), (2.0, 2.0), (-3.0, -3.0), (1.0, 1.0 + 1e-9),
    (1e-12, 1e-11), (-1e-10, -1e-12), (0.5, 0.5 + 1e-7), (1e3, 1e4), (-1e4, -1e3),
)  # fmt: skip


def signed_boxes(dtype=D, scale=3.0, seed=0):
    """Random boxes that exclude 0 (both signs), plus `SPECIAL`."""
    lower, upper = boxes(D, scale, seed, special=SPECIAL)
    keep = (lower > 0) | (upper < 0)
    return lower[keep].to(dtype), upper[keep].to(dtype)


def test_protocol_checks():
    for scale in (0.5, 3.0, 20.0):
        check_all(recip, *signed_boxes(scale=scale))


@DTYPES
@pytest.mark.parametrize("scale", [0.5, 5.0, 50.0], ids=["narrow", "medium", "wide"])
def test_lines_strictly_valid(dtype, scale):
    assert_strictly_valid(recip, *signed_boxes(dtype, scale, seed=1), torch.reciprocal)


def test_lines_valid_in_mpmath():
    assert_valid_mpmath(recip, *signed_boxes(D, 3.0, seed=2), torch.reciprocal, lambda x: 1 / x)


def test_positive_box_default_lines():
    """l > 0: the upper line is the chord (slope -1/(l u)), the lower one the tangent at the
    midpoint (slope -1/m^2)."""
    lower, upper = torch.tensor([0.5, 2.0], dtype=D), torch.tensor([4.0, 3.0], dtype=D)
    lines = recip.linear_bounds(lower, upper)
    torch.testing.assert_close(lines.upper_slope, -1 / (lower * upper))
    torch.testing.assert_close(lines.upper_intercept, 1 / lower + 1 / upper)
    mid = (lower + upper) / 2
    torch.testing.assert_close(lines.lower_slope, -1 / mid**2)
    torch.testing.assert_close(lines.lower_intercept, 2 / mid)


def test_negative_boxes_mirror_positive_ones():
    """1/x is odd: the lines of [-u, -l] are the point reflections of those of [l, u]."""
    lower, upper = signed_boxes(scale=2.0, seed=3)
    pos = lower > 0
    lower, upper = lower[pos], upper[pos]
    a, b = recip.linear_bounds(lower, upper), recip.linear_bounds(-upper, -lower)
    torch.testing.assert_close(a.upper_slope, b.lower_slope)
    torch.testing.assert_close(a.upper_intercept, -b.lower_intercept)
    torch.testing.assert_close(a.lower_slope, b.upper_slope)


def test_interval_is_exact():
    lower, upper = signed_boxes()
    low, up = recip.interval(lower, upper)
    assert torch.equal(low, 1 / upper) and torch.equal(up, 1 / lower)


@pytest.mark.parametrize(
    "box", [(-1.0, 1.0), (0.0, 1.0), (-1.0, 0.0), (0.0, 0.0), (-0.0, 2.0)],
    ids=["contains", "lower_zero", "upper_zero", "point_zero", "negative_zero"],
)  # fmt: skip
@pytest.mark.parametrize("method", ["interval", "linear_bounds", "constraints", "default_params"])
def test_boxes_touching_zero_are_refused(box, method):
    lower = torch.tensor([1.0, -3.0, box[0]], dtype=D)
    upper = torch.tensor([2.0, -2.0, box[1]], dtype=D)
    with pytest.raises(ValueError, match=r"reciprocal relaxation.*index \(2,\) contains or"):
        getattr(recip, method)(lower, upper)


def test_overflow_raises():
    lower = torch.tensor([1.0, 1e-25], dtype=F)
    upper = torch.tensor([2.0, 1e-24], dtype=F)
    with pytest.raises(ValueError, match=r"index \(1,\).*overflows torch.float32"):
        recip.linear_bounds(lower, upper)


def test_point_box_and_constraints():
    assert_point_box_exact(recip, torch.tensor([0.5, 3.0, -2.0, 1e-3], dtype=D))
    assert_constraints_at_least_as_tight(recip, *signed_boxes(scale=2.0))


def denominator_graph(seed: int, sign: float):
    """`Linear -> reciprocal -> Linear` (float64) whose pre-activations stay `sign * [>= 0.5]`
    on the box [-1, 1]^3 (positive first weights summing below 1.5, offset 2)."""
    from bounds.graph.graph import Graph, Node
    from bounds.ops import ActivationOp, LinearOp

    gen = torch.Generator().manual_seed(seed)
    w0 = sign * torch.rand(6, 3, generator=gen, dtype=D) * 0.5
    b0 = sign * (2.0 + torch.rand(6, generator=gen, dtype=D))
    w1 = torch.randn(2, 6, generator=gen, dtype=D)
    nodes = (
        Node("input", None, (), (3,)),
        Node("linear0", LinearOp(w0, b0), ("input",), (6,)),
        Node("act0", ActivationOp(recip, (6,)), ("linear0",), (6,)),
        Node("linear1", LinearOp(w1, torch.zeros(2, dtype=D)), ("act0",), (2,)),
    )
    return Graph(nodes)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_methods_sound(sign):
    lower, upper = -torch.ones(1, 3, dtype=D), torch.ones(1, 3, dtype=D)
    for seed in (0, 1):
        graph = denominator_graph(seed, sign)
        points = box_samples(lower, upper, 2000, seed=seed)
        values = graph.forward(points[0]).unsqueeze(0)
        for method in ("ibp", "crown", "alpha-crown", "lp"):
            found = verify.bounds(graph, lower=lower, upper=upper, method=method)
            assert_contains(found.lower, found.upper, values)
