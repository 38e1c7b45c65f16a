"""Bad input to the monitors and the fault injector: a typed error naming what and where, the
network left as it was, nothing written by a failing campaign."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch
from torch import nn

from bounds.errors import (
    InvalidLimitError,
    InvalidNetworkError,
    InvalidRegionError,
    ShapeMismatchError,
)
from tests.bad_inputs.conftest import no_side_effects, raises_where, unchanged_module
from verify.monitor import Ball, Box, MonitorMismatchError, MonitorOptionError, monitor
from verify.monitor.faults import Fault, FaultSiteError, inject, sample_faults, weight_sites

D = torch.float64


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double().eval()


def box(low: float = -1.0, high: float = 1.0, n: int = 4) -> Box:
    return Box(torch.full((n,), low, dtype=D), torch.full((n,), high, dtype=D))


def _nan_box() -> Box:
    lower = torch.zeros(4, dtype=D)
    lower[2] = float("nan")
    return Box(lower, torch.ones(4, dtype=D))


def _empty_box() -> Box:
    upper = torch.ones(4, dtype=D)
    upper[1] = -2.0
    return Box(torch.zeros(4, dtype=D), upper)


BAD_DOMAINS = [
    ("shape", box(n=5), {"input_shape": (4,)}, ShapeMismatchError, ["domain", "(5,)", "(4,)"]),
    ("shape-unknown", box(n=5), {}, ShapeMismatchError, ["rejects inputs", "(5,)"]),
    ("empty", _empty_box(), {}, InvalidRegionError, ["domain", "lower > upper", "(0, 1)"]),
    ("nan", _nan_box(), {}, InvalidRegionError, ["domain", "lower", "NaN", "(2,)"]),
    ("nan-in-list", [box(), _nan_box()], {}, InvalidRegionError, ["domain[1]", "NaN"]),
    ("empty-list", [], {}, InvalidRegionError, ["empty list"]),
    ("eps", Ball(torch.zeros(4, dtype=D), -0.1), {}, InvalidRegionError, ["eps", ">= 0"]),
    ("not-a-region", "box", {}, InvalidRegionError, ["Box, a Ball", "str"]),
    ("method", box(), {"method": "lp"}, MonitorOptionError, ["method", "'lp'"]),
    ("granularity", box(), {"granularity": "x"}, MonitorOptionError, ["granularity", "'x'"]),
    ("precision", box(), {"precision": "f16"}, MonitorOptionError, ["precision", "'f16'"]),
    (
        "precision-finer",
        Box(torch.zeros(4), torch.ones(4)),
        {"precision": "float64"},
        MonitorOptionError,
        ["'float64'", "float32 network"],
    ),
]


@pytest.mark.parametrize(("domain", "kw", "error", "where"), [c[1:] for c in BAD_DOMAINS],
                         ids=[c[0] for c in BAD_DOMAINS])  # fmt: skip
def test_bad_domain_or_option(domain, kw, error, where):
    net = mlp().float() if "precision" in kw else mlp()
    with unchanged_module(net), raises_where(error, *where):
        monitor(net, domain, **kw)


def test_net_in_training_mode():
    net = mlp().train()
    with unchanged_module(net), raises_where(InvalidNetworkError, "training mode", "net.eval()"):
        monitor(net, box())


def test_submodule_in_training_mode_is_named():
    net = mlp()
    net[2].train()
    with unchanged_module(net), raises_where(InvalidNetworkError, "'2'", "training mode"):
        monitor(net, box())


def test_wrap_refuses_a_net_put_back_in_training_mode():
    net = mlp()
    mon = monitor(net, box())
    net.train()
    with unchanged_module(net), raises_where(InvalidNetworkError, "training mode"):
        mon.wrap(net)


def test_monitor_refuses_other_weights():
    mon = monitor(mlp(0), box())
    other = mlp(1)
    with unchanged_module(other), raises_where(MonitorMismatchError, "'0.weight'", "differs"):
        mon.check(other, torch.zeros(1, 4, dtype=D))


def test_monitor_refuses_a_copy_taken_after_a_fault():
    net = mlp()
    mon = monitor(net, box())
    with inject(net, [Fault("weight", "2.bias", 1, xor=1 << 60)]):
        faulted = copy.deepcopy(net)
    with raises_where(MonitorMismatchError, "'2.bias'", "before the faults"):
        mon.wrap(faulted)


def test_monitor_refuses_another_graph():
    mon = monitor(mlp(), box())
    torch.manual_seed(0)
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 3)).double().eval()  # fmt: skip
    with unchanged_module(other), raises_where(MonitorMismatchError, "graphs differ"):
        mon.wrap(other)


def test_monitor_refuses_another_input_shape():
    mon = monitor(mlp(), box())
    torch.manual_seed(0)
    other = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).double().eval()
    with unchanged_module(other), raises_where(MonitorMismatchError, "another network", "(4,)"):
        mon.wrap(other)


def test_monitor_refuses_a_replaced_submodule():
    net = mlp()
    mon = monitor(net, box())
    net[0] = copy.deepcopy(net[0])
    with raises_where(MonitorMismatchError, "submodules were replaced"):
        mon.check(net, torch.zeros(1, 4, dtype=D))


BAD_CHECKS = [
    ("shape", torch.zeros(2, 5, dtype=D), None, ShapeMismatchError, ["(2, 5)", "[batch, *(4,)]"]),
    ("dtype", torch.zeros(2, 4), None, ShapeMismatchError, ["torch.float32", "torch.float64"]),
    ("region-range", torch.zeros(2, 4, dtype=D), [0, 2], InvalidRegionError, ["region[1] = 2"]),
    ("region-shape", torch.zeros(2, 4, dtype=D), [0, 1, 0], ShapeMismatchError, ["[batch] = [2]"]),
    ("region-float", torch.zeros(2, 4, dtype=D), [0.5, 1.0], InvalidRegionError, ["integer"]),
]


@pytest.mark.parametrize(("x", "region", "error", "where"), [c[1:] for c in BAD_CHECKS],
                         ids=[c[0] for c in BAD_CHECKS])  # fmt: skip
def test_bad_check(x, region, error, where):
    net = mlp()
    mon = monitor(net, [box(-1, 0), box(0, 1)])
    with unchanged_module(net), raises_where(error, *where):
        mon.check(net, x, region=region)


BAD_WRAPS = [
    ("action", {"action": "fix"}, MonitorOptionError, ["action", "'fix'"]),
    ("nodes", {"nodes": "some"}, MonitorOptionError, ["nodes", "'some'"]),
    ("node-name", {"nodes": ["nope"]}, MonitorOptionError, ["'nope'", "known"]),
    ("ranges", {"ranges": {"_0": (0.0, 1.0)}}, MonitorOptionError, ["'_2'"]),
    ("ranges-shape", {"ranges": {"_0": (torch.zeros(3), 1.0), "_2": (0.0, 1.0)}},
     ShapeMismatchError, ["ranges['_0']", "(8,)"]),
]  # fmt: skip


@pytest.mark.parametrize(("kw", "error", "where"), [c[1:] for c in BAD_WRAPS],
                         ids=[c[0] for c in BAD_WRAPS])  # fmt: skip
def test_bad_wrap(kw, error, where):
    net = mlp()
    mon = monitor(net, box())
    with unchanged_module(net), raises_where(error, *where):
        mon.wrap(net, **kw)


BAD_FAULTS = [
    ("site", Fault("weight", "9.weight", 0, xor=1), FaultSiteError, ["'9.weight'"]),
    ("index", Fault("weight", "0.weight", 32, xor=1), FaultSiteError, ["element 32", "32 elem"]),
    ("module", Fault("activation", "nope", 0, value=1.0), FaultSiteError, ["'nope'"]),
    ("target", Fault("memory", "0.weight", 0, xor=1), FaultSiteError, ["'memory'"]),
]


@pytest.mark.parametrize(("fault", "error", "where"), [c[1:] for c in BAD_FAULTS],
                         ids=[c[0] for c in BAD_FAULTS])  # fmt: skip
def test_bad_fault_changes_nothing(fault, error, where):
    net = mlp()
    good = Fault("weight", "0.bias", 0, xor=1 << 62)
    with unchanged_module(net), raises_where(error, *where), inject(net, [good, fault]):
        pass


def test_activation_fault_outside_the_batch():
    net = mlp()
    fault = Fault("activation", "0", 1, value=1.0, sample=5)
    with (
        unchanged_module(net),
        raises_where(FaultSiteError, "sample 5", "batch 2"),
        inject(net, [fault]),
    ):
        net(torch.zeros(2, 4, dtype=D))


BAD_SAMPLING = [
    ("bits", {"bits": "upper"}, InvalidLimitError, ["bits", "'upper'"]),
    ("model", {"model": "stuck"}, InvalidLimitError, ["model", "'stuck'"]),
    ("flips", {"flips": 0}, InvalidLimitError, ["flips", ">= 1"]),
    ("target", {"target": "disk"}, InvalidLimitError, ["target", "'disk'"]),
]


@pytest.mark.parametrize(("kw", "error", "where"), [c[1:] for c in BAD_SAMPLING],
                         ids=[c[0] for c in BAD_SAMPLING])  # fmt: skip
def test_bad_sampling(kw, error, where):
    options = {"target": "weight", **kw}
    with raises_where(error, *where):
        sample_faults(weight_sites(mlp()), 3, **options)


def _cli(tmp_path, *argv):
    from verify.cli import faults as faults_cli

    parser = argparse.ArgumentParser()
    faults_cli.add_parser(parser.add_subparsers(dest="command"))
    return faults_cli, parser.parse_args(["faults", *argv, "--out", str(tmp_path)])


@pytest.mark.data
def test_cli_bad_data_writes_nothing(tmp_path, shared_data, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,3\n")
    net = shared_data / "vnncomp2022/mnist_fc/onnx/mnist-net_256x2.onnx.gz"
    cli, args = _cli(tmp_path, str(net), "--domain", "box:0,1", "--data", str(bad),
                     "--trials", "5")  # fmt: skip
    with no_side_effects(tmp_path):
        assert cli.main(args) == 2
    assert "bad.csv:1: 3 columns" in capsys.readouterr().err


def test_cli_missing_out_folder(tmp_path, capsys):
    cli, args = _cli(tmp_path / "nope", "net.onnx", "--domain", "ball:0.1", "--data", "x.csv",
                     "--trials", "5")  # fmt: skip
    with no_side_effects(tmp_path):
        assert cli.main(args) == 2
    assert "is not a writable folder" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["box:1", "box:2,1", "ball:-1", "cube:1", "ball:x"])
def test_cli_bad_domain_option(tmp_path, text, capsys):
    with pytest.raises(SystemExit):
        _cli(tmp_path, "net.onnx", "--domain", text, "--data", "x.csv", "--trials", "5")
    err = capsys.readouterr().err
    assert "--domain" in err and ("box:LOW,HIGH or ball:EPS" in err or "list of numbers" in err)
