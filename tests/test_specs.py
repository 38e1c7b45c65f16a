"""Specification helpers: margins and VNN-LIB regions as C matrices; proof checks."""

from __future__ import annotations

import torch

from verify.io.vnnlib import parse_vnnlib
from verify.specs import margin_spec, region_proven, region_spec

TWO_POLYTOPES = """
(declare-const X_0 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(assert (>= X_0 0.0))
(assert (<= X_0 1.0))
(assert (or (and (<= Y_0 Y_1) (<= Y_0 2.0)) (and (>= Y_0 5.0))))
"""


def test_margin_spec_rows():
    C = margin_spec(torch.tensor([2]), 4)
    y = torch.tensor([0.0, 1.0, 5.0, 3.0])
    torch.testing.assert_close(C[0] @ y, torch.tensor([5.0, 4.0, 2.0]))


def test_region_spec_and_proof_need_every_polytope_excluded():
    region = parse_vnnlib(TWO_POLYTOPES).regions[0]
    C, b, owner = region_spec(region)
    assert C.shape == (1, 3, 2) and owner == [0, 0, 1]
    # Row values C y for y = (3, 1): Y_0 - Y_1 = 2 > 0 excludes polytope 0; -Y_0 = -3 > -5 excludes 1.
    y = torch.tensor([3.0, 1.0])
    values = C[0] @ y
    assert region_proven(values, b, owner, 2)
    # y = (6, 1): polytope 1 (Y_0 >= 5) is reached.
    assert not region_proven(C[0] @ torch.tensor([6.0, 1.0]), b, owner, 2)


def test_polytope_without_rows_is_never_excluded():
    text = TWO_POLYTOPES.replace(
        "(assert (or (and (<= Y_0 Y_1) (<= Y_0 2.0)) (and (>= Y_0 5.0))))",
        "(assert (or (<= Y_0 1.0) (and (<= X_0 2.0))))",
    )
    region = parse_vnnlib(text).regions
    total = sum(len(r.unsafe) for r in region)
    assert total >= 1
    for r in region:
        C, b, owner = region_spec(r)
        if any(len(p.b) == 0 for p in r.unsafe):
            assert not region_proven(torch.full((C.shape[1],), 1e9), b, owner, len(r.unsafe))
