"""The decomposition dual's certified value (bounds/dual/certified.py): at any multipliers it is
at most the dual value `q(rho)` (weak duality holds for it by construction) and, for one-input
relaxations, equal to it up to rounding; it does not rest on the oracle, so an oracle that
misses its minimum (as exp's did on [-40, 40]) cannot make a reported bound unsound."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import relaxations.exp  # noqa: F401  (registers "exp")
import verify
from bounds.dual import evaluate, initial_duals
from bounds.dual.certified import best_lines, certified_value
from bounds.dual.duals import Duals
from relaxations import get_relaxation
from tests.model_zoo import FLOAT_TRAPS
from tests.test_dual_dag import CASES, _setup
from tests.test_rounding import assert_trap_contained

D = torch.float64
SMOOTH = [("residual", "sigmoid"), ("split_concat", "tanh"), ("residual", "exp")]


def _random_duals(problem, seed: int, scale: float) -> Duals:
    gen = torch.Generator().manual_seed(seed)
    init = initial_duals(problem)
    return Duals(tuple(r + scale * torch.randn(r.shape, generator=gen, dtype=D) for r in init.rho))


@pytest.mark.parametrize("name, relaxation", [*CASES, *SMOOTH])
@pytest.mark.parametrize("scale", [0.0, 0.3, 3.0])
def test_certified_is_at_most_the_dual_value_and_tight(name, relaxation, scale):
    _, box, _, intervals, problem = _setup(name, relaxation=relaxation, specs=3, batch=2)
    duals = _random_duals(problem, seed=4, scale=scale)
    q, _ = evaluate(problem, duals)
    cert = certified_value(problem.net, box, intervals, problem.c, duals.rho)
    assert (cert <= q).all()
    if not any(len(e) > 1 for e in problem.net.act_edges):  # one-input relaxations: exact
        assert (q - cert <= 1e-9 * (1 + q.abs())).all(), (q - cert).max()


def test_best_lines_is_the_polygon_minimum():
    """One neuron of exp on [-40, 40], the oracle's old failure: the best pair of lines gives
    the minimum -0.92 * 39 + 0.127 * 40 ~ -30.8 of -0.92 xh + 0.127 x (not 0.92)."""
    exp = get_relaxation("exp")
    low, up = torch.tensor([-40.0], dtype=D), torch.tensor([40.0], dtype=D)
    cons = exp.constraints(low, up)
    r, g = torch.tensor([[-0.92]], dtype=D), torch.tensor([0.127], dtype=D)
    lam, mu, a1, a2, b1, b2 = best_lines(
        cons.lower_slopes.unsqueeze(1), cons.lower_intercepts, r, g, low[None], up[None]
    )
    assert abs(float(lam + mu) - 1.0) <= 2.3e-16
    a, b = lam * a1 + mu * a2, lam * b1 + mu * b2
    s = r[0] + g * a[0]
    value = float(torch.minimum(s * low, s * up) + g * b)
    assert -30.9 < value < -30.7


def test_a_missed_oracle_minimum_does_not_reach_the_bound(monkeypatch):
    """The solvers' oracle returns a point that is far from the minimum (each call moves `xh`
    to the box's lower end on the lower envelope): their `q` is then too high, and the
    reported prox bound must still contain the network's values."""
    sigmoid = get_relaxation("sigmoid")
    cls = type(sigmoid)
    honest = cls.argmin

    def missed(self, coeff_pre, coeff_post, lower, upper):
        xh, x = honest(self, coeff_pre, coeff_post, lower, upper)
        low = self.constraints(lower, upper).lower_envelope(lower.expand_as(xh).unsqueeze(0))[0]
        return lower.expand_as(xh), low.expand_as(x) + 10.0

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(3, 8), nn.Sigmoid(), nn.Linear(8, 8), nn.Sigmoid(),
                        nn.Linear(8, 2)).to(D).eval()  # fmt: skip
    lo, hi = -torch.ones(1, 3, dtype=D), torch.ones(1, 3, dtype=D)
    monkeypatch.setattr(cls, "argmin", missed)
    b = verify.bounds(net, lower=lo, upper=hi, method="prox", iterations=20)
    assert (b.stats["dual_value"] > torch.cat([b.lower, -b.upper], 1)).any()  # q was wrong
    x = lo + (hi - lo) * torch.rand(500, 3, dtype=D)
    y = net(x)
    assert (y >= b.lower).all() and (y <= b.upper).all()


@pytest.mark.parametrize("method", ["supergradient", "prox"])
@pytest.mark.parametrize("name", list(FLOAT_TRAPS))
def test_float_traps_contain_the_exact_values(name, method):
    assert_trap_contained(name, method, torch.float32, count=20, iterations=20)
