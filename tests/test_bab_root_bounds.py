"""ReLU splitting from the dual solvers' root intermediate bounds (`ReluSplitConfig.
root_intermediate`, CLI `--root-bounds`): the root's intervals tightened past alpha-CROWN's by
the Anderson relaxation, sound, and the search still agreeing with the exact MILP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_relu_bab import assert_relu_bab_agrees_with_milp, mlp
from verify.bab import BabConfig, ReluBab, ReluSplitConfig
from verify.cli.main import build_parser
from verify.cli.options import bab_config
from verify.property import Polytope, Region

ANDERSON_ROOT = ReluSplitConfig(root_intermediate="active-set", root_intermediate_iterations=60)


def _root_base(relu: ReluSplitConfig, net, region):
    runner = ReluBab(net, region, BabConfig(splitting="relu", relu=relu))
    roots, _ = runner.bounder.easy.root(lambda points: None)
    return runner, runner.bounder.easy.base64, roots


def test_the_anderson_root_bounds_are_sound_and_tighter_than_alpha_crowns():
    """On a deep float32 net whose root alpha-CROWN leaves open: the stage runs, its intervals
    lie inside alpha-CROWN's, are strictly tighter somewhere, contain every sampled
    pre-activation (in float64), and the root margin does not drop."""
    net = mlp([4, 24, 24, 24, 2], 7)
    region = Region(-np.ones(4), np.ones(4), (Polytope(np.array([[1.0, -1.0]]), np.zeros(1)),))
    _, base, roots = _root_base(ReluSplitConfig(root_intermediate="alpha-crown"), net, region)
    runner, tight, tight_roots = _root_base(ANDERSON_ROOT, net, region)
    assert "root_dual_seconds" in runner.target.stats
    assert (tight.lower >= base.lower).all() and (tight.upper <= base.upper).all()
    assert (tight.lower > base.lower + 1e-6).any() or (tight.upper < base.upper - 1e-6).any()
    assert (tight_roots.margin >= roots.margin - 1e-6).all()
    x = torch.rand(4000, 4, dtype=torch.float64) * 2 - 1
    values = runner.target.check.graph.forward(x, all_values=True)
    flat = torch.cat([values[p].flatten(1) for p in runner.target.layout.pres], dim=1)
    assert (flat >= tight.lower).all() and (flat <= tight.upper).all()


@pytest.mark.parametrize("seed", [1, 4])
@pytest.mark.parametrize("truth", ["sat", "unsat"])
def test_branch_and_bound_from_anderson_root_bounds_agrees_with_the_exact_milp(
    seed, truth, monkeypatch
):
    assert_relu_bab_agrees_with_milp(seed, truth, ANDERSON_ROOT, monkeypatch)


def test_bad_root_bound_settings_are_refused():
    with pytest.raises(ValueError, match="root_intermediate must be one of"):
        ReluSplitConfig(root_intermediate="lp")
    with pytest.raises(ValueError, match="root_share"):
        ReluSplitConfig(root_share=0.0)
    with pytest.raises(ValueError, match="root_intermediate_iterations"):
        ReluSplitConfig(root_intermediate_iterations=-1)


def test_the_cli_passes_the_root_bounds_to_the_search():
    args = build_parser().parse_args(
        ["run", "n.onnx", "p.vnnlib", "--timeout", "1", "--root-bounds", "active-set"]
    )
    assert bab_config(args).relu.root_intermediate == "active-set"
    default = bab_config(build_parser().parse_args(["run", "n", "p", "--timeout", "1"])).relu
    assert default == ReluSplitConfig() and default.root_intermediate == "active-set"
    args = build_parser().parse_args(["run", "n", "p", "--timeout", "1", "--root-bounds",
                                      "alpha-crown"])  # fmt: skip
    assert bab_config(args).relu.root_intermediate == "alpha-crown"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "n", "p", "--timeout", "1", "--root-bounds", "lp"])
