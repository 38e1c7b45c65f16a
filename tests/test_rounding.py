"""Bounds hold under IEEE rounding (`bounds.rounding`): the float-trap zoo through every
bounds method, against the networks' exact values (mpmath, 200 digits) at sampled points and at
every corner of the box, compared with no tolerance; and every op's interval against the exact
op at its endpoints and at random points, over magnitudes from 1e-30 to 1e30."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import verify
from bounds.ops import ConvOp, ElementwiseAffineOp, LinearOp, ReduceOp, SumOp
from bounds.rounding import error_bound, gamma, lower_minus, unit_roundoff, upper_plus
from bounds.types import Interval
from relaxations.exp import ExpRelaxation
from relaxations.relu import ReluRelaxation
from relaxations.sigmoid import SigmoidRelaxation
from relaxations.tanh import TanhRelaxation
from tests.model_zoo import FLOAT_TRAPS, Cancel, Product, Shift, Square, make_trap

METHODS = ("ibp", "crown", "alpha-crown", "forward")
DTYPES = (torch.float32, torch.float64)


@pytest.fixture(autouse=True)
def _precise():
    """200 digits for every exact value here (other tests change mpmath's global precision)."""
    with mpmath.workdps(200):
        yield


def mp_vector(t: torch.Tensor) -> list:
    return [mpmath.mpf(float(v)) for v in t.double().reshape(-1).tolist()]


def exact_forward(net: nn.Sequential, x: list) -> list:
    """The network's value at `x` in exact arithmetic on its stored weights (mpmath)."""
    for layer in net:
        if isinstance(layer, nn.Linear):
            W = [mp_vector(row) for row in layer.weight]
            b = mp_vector(layer.bias) if layer.bias is not None else [0] * len(W)
            x = [mpmath.fsum(w * v for w, v in zip(row, x)) + bi for row, bi in zip(W, b)]
        elif isinstance(layer, nn.ReLU):
            x = [max(v, 0) for v in x]
        elif isinstance(layer, Square):
            x = [v * v for v in x]
        elif isinstance(layer, Shift):
            x = [v - c for v, c in zip(x, mp_vector(layer.c))]
        elif isinstance(layer, Cancel):
            x = list(x) + [0 * v for v in x]  # (a + big) - big = a, a - a = 0, exactly
        elif isinstance(layer, Product):
            k = len(x) // 2
            x = [a * b for a, b in zip(x[:k], x[k:])]
        else:
            raise TypeError(type(layer).__name__)
    return x


def points(low: torch.Tensor, high: torch.Tensor, count: int, seed: int) -> list[torch.Tensor]:
    """Every corner of the box, then `count` uniform points (in the box's dtype)."""
    n = low.shape[1]
    corners = [torch.where(torch.tensor(c, dtype=torch.bool), high[0], low[0])
               for c in itertools.product([0, 1], repeat=n)]  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(count, n, generator=gen, dtype=torch.float64).to(low.dtype)
    samples = [torch.minimum(torch.maximum(low[0] + t[i] * (high[0] - low[0]), low[0]), high[0])
               for i in range(count)]  # fmt: skip
    return corners + samples


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_the_trap_from_the_issue(method, dtype):
    """`h * h - c` after a wide layer: the minimum at x = 0 is -9800.75, -3 and -1."""
    net, low, high = make_trap("trap", dtype)
    b = verify.bounds(net, lower=low, upper=high, method=method)
    assert float(b.lower[0, 0]) <= -9800.75
    assert float(b.lower[0, 1]) <= -3.0
    assert float(b.lower[0, 2]) <= -1.0


def assert_trap_contained(name: str, method: str, dtype, count: int = 40, **options) -> None:
    """`method`'s bounds on the float-trap net `name` contain its exact (mpmath) values at
    every corner and `count` uniform points, with no tolerance."""
    net, low, high = make_trap(name, dtype)
    b = verify.bounds(net, lower=low, upper=high, method=method, **options)
    lower, upper = mp_vector(b.lower[0]), mp_vector(b.upper[0])
    for x in points(low, high, count, seed=3):
        values = exact_forward(net, mp_vector(x))
        for j, v in enumerate(values):
            assert lower[j] <= v <= upper[j], (j, float(v), float(lower[j]), float(upper[j]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(FLOAT_TRAPS))
def test_float_traps_contain_the_exact_values(name, method, dtype):
    assert_trap_contained(name, method, dtype)


# --- the exact extremes of the one-hidden-layer ReLU traps, in rational arithmetic ---------


def _solve_exact(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """The solution of the square system (Gauss-Jordan in fractions), None when singular."""
    n = len(rows)
    m = [[*r, b] for r, b in zip(rows, rhs)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if m[r][col] != 0), None)
        if pivot is None:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _exact_value(net: nn.Sequential, x: list[Fraction]) -> list[Fraction]:
    for layer in net:
        if isinstance(layer, nn.Linear):
            W = [[Fraction(float(w)) for w in row] for row in layer.weight]
            b = [Fraction(float(v)) for v in layer.bias]
            x = [sum((w * v for w, v in zip(row, x)), Fraction(0)) + bi for row, bi in zip(W, b)]
        elif isinstance(layer, nn.ReLU):
            x = [max(v, Fraction(0)) for v in x]
        elif isinstance(layer, Shift):
            x = [v - Fraction(float(c)) for v, c in zip(x, layer.c)]
        else:
            raise TypeError(type(layer).__name__)
    return x


def exact_extremes(net: nn.Sequential, low: list[float], high: list[float]):
    """`(min, max)` of every output over the box, exactly, for Linear, ReLU, then Linear and
    Shift layers: a continuous piecewise-linear function attains them at a vertex of the
    arrangement of the hidden neurons' hyperplanes and the box's faces (every linear piece is
    a polytope of the box whose vertices lie on n of them)."""
    first = net[0]
    W = [[Fraction(float(w)) for w in row] for row in first.weight]
    b = [Fraction(float(v)) for v in first.bias]
    n = len(low)
    planes = [(row, -bi) for row, bi in zip(W, b)]
    for j in range(n):
        unit = [Fraction(int(i == j)) for i in range(n)]
        planes += [(unit, Fraction(low[j])), (unit, Fraction(high[j]))]
    lo, hi = None, None
    for chosen in itertools.combinations(planes, n):
        x = _solve_exact([p[0] for p in chosen], [p[1] for p in chosen])
        if x is None or any(not Fraction(a) <= v <= Fraction(c) for v, a, c in zip(x, low, high)):
            continue
        y = _exact_value(net, x)
        lo = y if lo is None else [min(a, v) for a, v in zip(lo, y)]
        hi = y if hi is None else [max(a, v) for a, v in zip(hi, y)]
    return lo, hi


ONE_HIDDEN = ("huge_weights", "thin_box")


@pytest.mark.parametrize("method", [*METHODS, "lp", "prox", "big-m", "active-set"])
@pytest.mark.parametrize("name", ONE_HIDDEN)
def test_one_hidden_traps_are_bounded_by_their_exact_extremes(name, method):
    """No bound above the exact minimum (below the exact maximum), in rational arithmetic."""
    for dtype in DTYPES:
        net, low, high = make_trap(name, dtype)
        lo, hi = exact_extremes(net, low[0].tolist(), high[0].tolist())
        b = verify.bounds(net, lower=low, upper=high, method=method)
        for j in range(len(lo)):
            assert Fraction(float(b.lower[0, j])) <= lo[j], (dtype, j, float(lo[j]))
            assert Fraction(float(b.upper[0, j])) >= hi[j], (dtype, j, float(hi[j]))


def test_the_helpers_round_outward():
    one = torch.tensor([1.0], dtype=torch.float32)
    tiny = torch.full((1,), 1e-30)
    assert float(lower_minus(one, tiny)) < 1.0 < float(upper_plus(one, tiny))
    assert float(lower_minus(one, torch.zeros(1))) == 1.0  # nothing rounded: no step
    nan = torch.tensor([math.nan])
    assert float(lower_minus(nan, torch.zeros(1))) == -math.inf
    assert float(upper_plus(nan, torch.zeros(1))) == math.inf
    assert gamma(10**8, torch.float32) == math.inf  # k u >= 0.4: no finite bound
    assert math.isclose(gamma(10, torch.float64), 10 * unit_roundoff(torch.float64), rel_tol=1e-6)
    assert float(error_bound(torch.tensor([math.nan]), 3)) == math.inf


# --- every op's interval against the exact op ------------------------------------------------

MAGNITUDE = st.floats(min_value=-30, max_value=30)


def box_strategy(n: int):
    """`n` intervals with ends of sign and magnitude 10^[-30, 30] each (one may be a point)."""
    end = st.tuples(st.sampled_from([-1.0, 1.0]), MAGNITUDE).map(lambda p: p[0] * 10.0 ** p[1])
    return st.lists(st.tuples(end, end), min_size=n, max_size=n).map(
        lambda pairs: ([min(a, b) for a, b in pairs], [max(a, b) for a, b in pairs])
    )


def _inside(iv: Interval, exact_at) -> None:
    """`exact_at(t)` (mpmath values, flat) at t = 0 (lower ends), 1 (upper ends) and between."""
    lo, hi = mp_vector(iv.lower[0]), mp_vector(iv.upper[0])
    for t in (0.0, 1.0, 0.5, 0.125, 0.9):
        for j, v in enumerate(exact_at(t)):
            assert lo[j] <= v <= hi[j], (t, j, float(v), float(lo[j]), float(hi[j]))


def _point(low: list, high: list, t: float) -> list:
    return [
        mpmath.mpf(a) + (mpmath.mpf(b) - mpmath.mpf(a)) * mpmath.mpf(t) for a, b in zip(low, high)
    ]


def _affine_case(op, low: list, high: list, dtype, matrix, bias) -> None:
    lo = torch.tensor([low], dtype=dtype)
    hi = torch.tensor([high], dtype=dtype)
    low, high = lo[0].double().tolist(), hi[0].double().tolist()  # the stored endpoints
    iv = op.interval(Interval(lo.reshape(1, *op.in_shape), hi.reshape(1, *op.in_shape)))
    iv = Interval(iv.lower.reshape(1, -1), iv.upper.reshape(1, -1))

    def exact_at(t):
        x = _point(low, high, t)
        return [mpmath.fsum(w * v for w, v in zip(row, x)) + b for row, b in zip(matrix, bias)]

    _inside(iv, exact_at)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=60, deadline=None)
@given(box=box_strategy(3), data=st.data())
def test_linear_interval_holds(dtype, box, data):
    w = data.draw(st.lists(st.lists(st.sampled_from([-3e7, -1.5, 0.0, 1e-20, 2.5, 1e6]),
                                    min_size=3, max_size=3), min_size=2, max_size=2))  # fmt: skip
    b = data.draw(st.lists(st.sampled_from([0.0, -9800.75, 1e-25, 3e20]), min_size=2, max_size=2))
    W, B = torch.tensor(w, dtype=dtype), torch.tensor(b, dtype=dtype)
    op = LinearOp(W, B)
    _affine_case(op, *box, dtype, [mp_vector(r) for r in W], mp_vector(B))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=60, deadline=None)
@given(box=box_strategy(3), data=st.data())
def test_elementwise_interval_holds(dtype, box, data):
    s = data.draw(st.lists(st.sampled_from([-1e8, -1.0, 0.0, 1e-30, 3.0]), min_size=3, max_size=3))
    c = data.draw(st.lists(st.sampled_from([0.0, -9800.75, 1e-28, 1e25]), min_size=3, max_size=3))
    S, Cst = torch.tensor(s, dtype=dtype), torch.tensor(c, dtype=dtype)
    op = ElementwiseAffineOp((3,), S, Cst)
    Sm, Cm = mp_vector(S), mp_vector(Cst)
    matrix = [[Sm[i] if j == i else 0 for j in range(3)] for i in range(3)]
    _affine_case(op, *box, dtype, matrix, Cm)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=40, deadline=None)
@given(box=box_strategy(8))
def test_conv_and_reduce_intervals_hold(dtype, box):
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(2, 2, 2, 2, generator=gen, dtype=torch.float64) * 1e5).to(dtype)
    bias = torch.tensor([-7.5, 1e4], dtype=dtype)
    conv = ConvOp(weight, bias, (2, 2, 2))
    W, b = conv.as_matrix()
    _affine_case(conv, *box, dtype, [mp_vector(r) for r in W], mp_vector(b))
    red = ReduceOp((2, 2, 2), (1, 2), keepdim=False, mean=True)
    W, b = red.as_matrix()
    # the mean's 1/4 is exact; as_matrix evaluates it in dtype
    _affine_case(red, *box, dtype, [mp_vector(r) for r in W], mp_vector(b))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=60, deadline=None)
@given(a=box_strategy(3), c=box_strategy(3))
def test_sum_interval_holds(dtype, a, c):
    op = SumOp((3,), (1.0, -1.0))
    ivs = [
        Interval(torch.tensor([lo], dtype=dtype), torch.tensor([hi], dtype=dtype))
        for lo, hi in (a, c)
    ]
    out = op.interval(*ivs)
    ends = [(iv.lower[0].double().tolist(), iv.upper[0].double().tolist()) for iv in ivs]

    def exact_at(t):
        x, y = _point(*ends[0], t), _point(*ends[1], 1 - t)
        return [p - q for p, q in zip(x, y)]

    _inside(out, exact_at)


ACTIVATIONS = [
    (ReluRelaxation(), lambda v: max(v, 0)),
    (SigmoidRelaxation(), lambda v: 1 / (1 + mpmath.exp(-v))),
    (TanhRelaxation(), mpmath.tanh),
    (ExpRelaxation(), mpmath.exp),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("relaxation, exact", ACTIVATIONS, ids=lambda r: getattr(r, "name", ""))
@settings(max_examples=60, deadline=None)
@given(box=box_strategy(2))
def test_activation_interval_holds(relaxation, exact, dtype, box):
    from bounds.ops import ActivationOp

    low, high = box
    if relaxation.name == "exp":  # exp overflows past ~88 (float32) / ~709 (float64)
        low, high = [min(v, 80.0) for v in low], [min(v, 80.0) for v in high]
    op = ActivationOp(relaxation, (2,))
    lo, hi = torch.tensor([low], dtype=dtype), torch.tensor([high], dtype=dtype)
    out = op.interval(Interval(lo, hi))
    ends = (lo[0].double().tolist(), hi[0].double().tolist())
    _inside(out, lambda t: [exact(v) for v in _point(*ends, t)])


def test_a_module_whose_float_evaluations_disagree_is_accepted():
    """`(h + 1e8) - 1e8` rounds `h` away in float32 but not in the folded graph: a valid
    network, not an internal error; its bounds contain the exact value `h`."""

    class Plus(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return (self.fc(x) + 1e8) - 1e8

    torch.manual_seed(0)
    net = Plus().eval()
    b = verify.bounds(net, lower=-torch.ones(1, 3), upper=torch.ones(1, 3), method="crown")
    x = torch.zeros(1, 3)
    h = net.fc(x)
    assert bool((b.lower <= h).all() and (h <= b.upper).all())
    assert np.isfinite(b.lower.numpy()).all()
