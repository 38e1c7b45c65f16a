"""Smoke tests of benchmarks/soundness_sweep.py on a tiny zoo net: the point makers stay in the
box, sound bounds have no point outside, and deliberately shrunk bounds are caught."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from benchmarks import soundness_sweep as ss
from tests.model_zoo import make


def zoo_case(eps: float = 0.4) -> ss.Case:
    """The zoo `mlp` (4 -> 8 -> 8 -> 3, float64) on an eps box; rows: outputs and y0 - y1."""
    net, shape = make("mlp")
    x = torch.rand((1, *shape), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    C = ss.with_outputs(torch.tensor([[[1.0, -1.0, 0.0]]], dtype=torch.float64))
    rows = [ss.row_name(c) for c in C[0]]
    return ss.Case("mlp", net, x - eps, x + eps, C, rows, "zoo mlp")


def run(case: ss.Case, bounds: list[ss.MethodBounds], n: int = 4000, steps: int = 30):
    plan = ss.plan_points(n, len(case.rows), case.lower.numel(), steps)
    nets = ss.Nets.of(case)
    return ss.sweep(nets, case.lower, case.upper, plan, bounds, seed=0, progress=lambda s: None)


@pytest.fixture(scope="module")
def case_and_bounds():
    case = zoo_case()
    # In this process (no fork: a fork of the test process, whose HiGHS threads already ran,
    # can deadlock); the MILP's solves are limited by HiGHS's own time limit.
    methods = [ss.method_bounds(case, m, wall=None) for m in ("ibp", "crown", "alpha-crown")]
    order = list(range(len(case.rows)))
    milp = ss.milp_bounds(case, solve_limit=30, budget=120, order=order, isolate=False)
    return case, [*methods, milp]


def test_row_names_and_rows():
    case = zoo_case()
    assert case.rows == ["y0", "y1", "y2", "y0-y1"]
    assert ss.row_name(torch.tensor([0.0, -2.0, 1.0])) == "-2*y1+y2"


def test_points_lie_in_the_box_corners_and_faces():
    case, gen = zoo_case(), torch.Generator().manual_seed(0)
    lo, up = case.lower, case.upper
    for make_points in (ss.uniform_points, ss.corner_points, ss.face_points):
        x = make_points(lo, up, 500, gen)
        assert x.shape == (500, 4) and bool((x >= lo).all()) and bool((x <= up).all())
    corners = ss.corner_points(lo, up, 16, gen)
    assert bool(((corners == lo) | (corners == up)).all())
    assert len(torch.unique(corners, dim=0)) == 16  # every corner of the 4-d box
    faces = ss.face_points(lo, up, 500, gen)
    assert bool(((faces == lo) | (faces == up)).any(dim=1).all())  # each one on a face
    assert not bool(((faces == lo) | (faces == up)).all(dim=1).all())  # not all corners


def test_plan_has_every_kind_and_enough_points():
    plan = ss.plan_points(10_000, rows=4, numel=4, steps=20)
    assert plan.total >= 10_000
    assert plan.counts["corner"] == 16  # 2^4 corners, no repeats
    assert plan.counts["pgd"] == 2 * 4 * plan.restarts * 21 >= 1000
    assert min(plan.counts.values()) > 0


def test_tally_counts_points_outside_and_the_worst_row():
    t = ss.Tally()
    v = torch.tensor([[0.0, 1.0], [2.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    t.update(v, v.float(), torch.tensor([0.5, 0.0]), torch.tensor([3.0, 3.0]))
    assert (t.points, t.outside64, t.outside32) == (3, 2, 2)
    assert (t.min_slack, t.min_row, t.min_side) == (-1.0, 1, "lower")


def test_run_limited_reports_results_errors_and_timeouts():
    assert ss.run_limited(lambda: 41 + 1, 30) == ("ok", 42)
    status, text = ss.run_limited(lambda: 1 / 0, 30)
    assert status == "error" and "ZeroDivisionError" in text
    start = time.perf_counter()
    assert ss.run_limited(lambda: time.sleep(30), 0.5) == ("timeout", None)
    assert time.perf_counter() - start < 10


def test_sound_bounds_have_no_point_outside_and_milp_is_tight(case_and_bounds):
    case, bounds = case_and_bounds
    assert [b.status for b in bounds] == ["ok"] * 4
    tallies, seen = run(case, bounds)
    for b in bounds:
        for kind, t in tallies[b.method].items():
            assert t.points > 0 and t.outside64 == 0, (b.method, kind, t)
    assert case.net[0].weight.dtype == torch.float64  # the sweep's float32 twin is a copy
    # the exact MILP bounds are reached by PGD up to the MILP's 1e-6 relative loosening
    assert tallies["milp"]["pgd"].min_slack < 1e-4
    assert bool((seen.low >= bounds[-1].lower).all() and (seen.high <= bounds[-1].upper).all())


@pytest.mark.parametrize("side", ["lower", "upper"])
def test_shrunk_bounds_are_caught(case_and_bounds, side):
    """Exact bounds moved inwards by 1e-3 on one row are violated, and PGD finds it."""
    case, bounds = case_and_bounds
    exact = bounds[-1]
    for row in range(len(case.rows)):
        lower, upper = exact.lower.clone(), exact.upper.clone()
        if side == "lower":
            lower[row] += 1e-3
        else:
            upper[row] -= 1e-3
        wrong = ss.MethodBounds("shrunk", lower, upper, 0.0, "ok")
        tallies, _ = run(case, [wrong])
        assert tallies["shrunk"]["pgd"].outside64 > 0, (row, side)
        assert tallies["shrunk"]["pgd"].min_side == side
        assert case.rows[tallies["shrunk"]["pgd"].min_row] == case.rows[row]


def test_shrunk_uniform_range_is_caught_by_pgd():
    """Bounds equal to the range seen by uniform samples alone are broken by PGD and corners."""
    case = zoo_case()
    unbounded = torch.full((len(case.rows),), math.inf, dtype=torch.float64)
    plan = ss.Plan({"uniform": 2000}, 0, 0)
    _, seen = ss.sweep(ss.Nets.of(case), case.lower, case.upper, plan,
                       [ss.MethodBounds("none", -unbounded, unbounded, 0.0, "ok")], 1,
                       progress=lambda s: None)  # fmt: skip
    tallies, _ = run(case, [ss.MethodBounds("uniform range", seen.low, seen.high, 0.0, "ok")])
    assert tallies["uniform range"]["pgd"].outside64 > 0
    assert tallies["uniform range"]["corner"].outside64 > 0


def test_main_writes_a_clean_report_on_acasxu(shared_data, tmp_path):
    argv = ["--nets", "acasxu", "--methods", "ibp,crown", "--points", "3000", "--steps", "5",
            "--out-dir", str(tmp_path)]  # fmt: skip
    payload = ss.main(argv)
    saved = json.loads((tmp_path / "soundness_sweep.json").read_text())
    assert saved["meta"]["outside_f64_total"] == payload["meta"]["outside_f64_total"] == 0
    rows = saved["nets"]["acasxu"]["methods"]
    assert [r["method"] for r in rows] == ["ibp", "crown"]
    assert all(r["points"] >= 3000 and r["rows_bounded"] == r["rows"] == 9 for r in rows)
    assert "| acasxu | crown | ok | 9/9 |" in (tmp_path / "soundness_sweep.md").read_text()
