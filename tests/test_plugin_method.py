"""A bound method is one file: its registration (`register_method`) declares its name, config
and capabilities, and everything that chooses methods by name finds it. Shown with a method
defined in this test file alone, and checked for the library's own: none is registered in
`bounds.registry` itself."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

import verify
from bounds.methods.crown import crown, crown_intermediate
from bounds.registry import (
    available_methods,
    get_method,
    intermediate_intervals,
    methods_with,
    register_method,
    unregister_method,
)
from bounds.types import Interval
from tests.soundness import assert_contains, box_samples, spec_values


@dataclass(frozen=True)
class HalfConfig:
    """A toy option, to show that a method's own frozen config reaches it."""

    scale: float = 1.0


@pytest.fixture
def crown_again():
    """`crown-again`: CROWN under another name, registered here by its decorator alone."""

    @register_method("crown-again", HalfConfig, "CROWN, from a test file",
                     intermediate=crown_intermediate)  # fmt: skip
    def run(graph, box, C, config, budget, given, exact=True):
        assert isinstance(config, HalfConfig)
        return (*crown(graph, box, C, given, exact=exact), {"scale": config.scale})

    yield "crown-again"
    unregister_method("crown-again")
    assert "crown-again" not in available_methods()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_method_from_one_file_is_found_by_name_and_capability(crown_again) -> None:
    assert crown_again in available_methods()
    assert crown_again in methods_with("intermediate")
    assert crown_again not in methods_with("hard_bounder")
    net = _net().double()
    x = torch.zeros(1, 3, dtype=torch.float64)
    mine = verify.bounds(net, 0.5, x=x, method=crown_again, scale=2.0)
    theirs = verify.bounds(net, 0.5, x=x, method="crown")
    assert mine.stats["scale"] == 2.0
    assert torch.equal(mine.lower, theirs.lower) and torch.equal(mine.upper, theirs.upper)
    points = box_samples(x - 0.5, x + 0.5, 2000)
    values = spec_values(net, points, torch.eye(2, dtype=torch.float64).expand(1, 2, 2))
    assert_contains(mine.lower, mine.upper, values)
    # its intermediate bounds serve another method by name
    box = Interval(x - 0.5, x + 0.5)
    graph = verify.network_graph(net, (3,))
    C = torch.eye(2, dtype=torch.float64).unsqueeze(0)
    ours = intermediate_intervals(graph, box, C, crown_again, start="crown")
    reference = intermediate_intervals(graph, box, C, "crown", start="crown")
    for name, iv in reference.items():
        assert torch.equal(ours[name].lower, iv.lower) and torch.equal(ours[name].upper, iv.upper)


def test_every_method_registers_in_its_own_file() -> None:
    for name in available_methods():
        module = get_method(name).run.__module__
        assert module != "bounds.registry", (name, module)
        assert module.startswith(("bounds.methods.", "bounds.dual.", "bounds.lp.")), (name, module)
