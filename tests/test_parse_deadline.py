"""Reading a property counts against the time limit: a file that takes longer to read than the
limit ends in "timeout" within the limit (1 s, or 5%), not after the parse."""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import verify
from verify.io.vnnlib import parse_vnnlib
from verify.io.vnnlib_common import ParseDeadlineError


def many_regions(n_regions: int, n_inputs: int = 40) -> str:
    """A disjunction of `n_regions` boxes (one per line, as VNN-COMP's nn4sys writes them)."""
    decls = "".join(f"(declare-const X_{i} Real)\n" for i in range(n_inputs))
    decls += "(declare-const Y_0 Real)\n"
    terms = []
    for r in range(n_regions):
        box = " ".join(f"(>= X_{i} {r}.0) (<= X_{i} {r}.5)" for i in range(n_inputs))
        terms.append(f"  (and {box} (<= Y_0 -1000.0))\n")
    return decls + "(assert (or\n" + "".join(terms) + "))\n"


def test_the_reader_stops_at_its_deadline():
    text = many_regions(3000)
    start = time.monotonic()
    with pytest.raises(ParseDeadlineError, match="time limit"):
        parse_vnnlib(text, "big.vnnlib", deadline=start + 0.3)
    assert time.monotonic() - start < 1.3
    assert len(parse_vnnlib(many_regions(3)).regions) == 3  # no deadline: read whole


@pytest.fixture
def no_gc_pauses():
    """The cyclic garbage collector off while a test times reads: in a large process (the
    whole suite's objects) a full collection can land in any read and outlast it, so one read
    is no measure of another (with 20 million objects alive, one of six reads of this file
    took 1.68 s, the others 0.49-0.60 s; with the collector off, 0.43-0.46 s). A CI run
    read the file under test about four times as fast as the fastest of the three before."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_read_predicted_to_end_past_the_deadline_stops_early(no_gc_pauses):
    """Past a tenth of a stage's items (lines read, terms grouped), their rate predicts the
    rest: a file that would take four times the limit to read stops before the limit, by the
    prediction (and one given three times its reading time is read whole). The limit is a
    quarter, not a half, and the reading time the fastest of three: the rate so far can fall
    short of the rest's."""
    text = many_regions(1500)
    parse_vnnlib(text, "big.vnnlib")  # warm: the later reads are the ones timed
    whole = math.inf
    for _ in range(3):
        start = time.monotonic()
        parse_vnnlib(text, "big.vnnlib")
        whole = min(whole, time.monotonic() - start)
    start = time.monotonic()
    with pytest.raises(ParseDeadlineError, match="predicted to end past it"):
        parse_vnnlib(text, "big.vnnlib", deadline=start + whole / 4)
    assert time.monotonic() - start < whole / 4
    start = time.monotonic()
    assert len(parse_vnnlib(text, "big.vnnlib", deadline=start + 3 * whole).regions) == 1500


def test_grouping_the_terms_is_paced_too(no_gc_pauses):
    """The stage after the reading (one region per term) is paced by its own rate: with the
    reading done, a deadline it cannot meet stops it by the prediction, before the deadline."""
    from verify.io.vnnlib_common import Constraint, Context, group_regions

    n_inputs, n_terms = 40, 3000
    terms = [
        [Constraint({("X", i): -1.0}, -float(r), 1) for i in range(n_inputs)]
        + [Constraint({("X", i): 1.0}, r + 0.5, 1) for i in range(n_inputs)]
        + [Constraint({("Y", 0): 1.0}, -1000.0, 1)]
        for r in range(n_terms)
    ]
    ctx = Context("big.vnnlib", decls={("X", i): 1 for i in range(n_inputs)})
    whole = math.inf
    for _ in range(3):  # the fastest of three, as above
        start = time.monotonic()
        group_regions(ctx, [], terms, (n_inputs, 1), 1)
        whole = min(whole, time.monotonic() - start)
    ctx.deadline = time.monotonic() + whole / 4
    with pytest.raises(ParseDeadlineError, match="terms grouped"):
        group_regions(ctx, [], terms, (n_inputs, 1), 1)
    assert time.monotonic() < ctx.deadline


def test_verify_answers_timeout_within_the_limit_while_reading(tmp_path: Path):
    path = tmp_path / "big.vnnlib"
    path.write_text(many_regions(6000))
    net = nn.Sequential(nn.Linear(40, 8), nn.ReLU(), nn.Linear(8, 1))
    torch.manual_seed(0)
    start = time.monotonic()
    result = verify.verify(net, path, timeout=0.5)
    assert result.status == "timeout" and time.monotonic() - start < 1.5


def test_run_all_reads_within_each_instances_limit(tmp_path: Path):
    """`run-all` reads the property before the search: that reading is paced by the
    instance's limit too (a row "timeout" within 1 s of it)."""
    from verify.cli.main import main

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(40, 8), nn.ReLU(), nn.Linear(8, 1)).eval()
    torch.onnx.export(net, (torch.zeros(1, 40),), str(tmp_path / "net.onnx"), dynamo=False,
                      opset_version=13)  # fmt: skip
    (tmp_path / "big.vnnlib").write_text(many_regions(6000))
    (tmp_path / "instances.csv").write_text("net.onnx,big.vnnlib,1\n")
    start = time.monotonic()
    main(["run-all", str(tmp_path / "instances.csv"), "--out", str(tmp_path / "out.csv")])
    assert time.monotonic() - start < 4.0  # 1 s limit, imports and the ONNX export aside
    row = (tmp_path / "out.csv").read_text().splitlines()[1].split(",")
    assert row[2] == "timeout" and float(row[3]) < 2.0
