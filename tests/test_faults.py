"""Fault injection (`verify.faults`): the bits it flips, exact restoration of the clean model,
seeded and uniform sampling; the campaign (`verify.faults_cli`) is reproducible from its seed
and its command line writes the CSV, JSON, markdown and PNG."""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest
import torch
from torch import nn

from tests.model_zoo import make
from verify.cli.faults import Bench, Campaign, profile_ranges, run_campaign, summarise
from verify.monitor import Box, monitor
from verify.monitor.faults import (
    Fault,
    activation_sites,
    bit_positions,
    corrupt,
    inject,
    sample_faults,
    weight_sites,
)


def words(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize(
    ("bit", "expected"),
    [(31, -1.0), (30, float("inf")), (23, 0.5), (22, 1.5), (0, 1.0 + 2.0**-23)],
    ids=["sign", "exponent-msb", "exponent-lsb", "mantissa-msb", "mantissa-lsb"],
)
def test_bitflip_of_one_in_float32(bit, expected):
    one = torch.ones(3)
    out = corrupt(one, Fault("weight", "w", 1, xor=1 << bit, bits=(bit,)))
    assert out[1].item() == expected
    assert torch.equal(out[[0, 2]], one[[0, 2]]) and torch.equal(one, torch.ones(3))


def test_bit_classes_partition_the_word():
    for dtype, width in ((torch.float32, 32), (torch.float64, 64)):
        parts = [set(bit_positions(dtype, c)) for c in ("sign", "exponent", "mantissa")]
        assert set().union(*parts) == set(bit_positions(dtype, "any")) == set(range(width))
        assert sum(len(p) for p in parts) == width


@pytest.mark.parametrize("model", ["bitflip", "value", "exponent"])
def test_injector_restores_the_exact_weights(model):
    net, _ = make("conv", dtype=torch.float32)
    before = {k: words(v).clone() for k, v in net.state_dict().items()}
    trials = sample_faults(weight_sites(net), 300, target="weight", model=model, flips=3
                           if model == "bitflip" else 1, bits="exponent", seed=1)  # fmt: skip
    x = torch.rand(2, 1, 5, 5)
    changed = 0
    for faults in trials:
        with inject(net, faults):
            changed += sum(
                not torch.equal(words(v), before[k]) for k, v in net.state_dict().items()
            )
            with torch.no_grad():
                net(x)
        for k, v in net.state_dict().items():
            assert torch.equal(words(v), before[k]), k
    assert changed >= len(trials)  # every trial changed some weight while injected


def test_injector_restores_after_an_exception_and_removes_hooks():
    net, _ = make("mlp", dtype=torch.float32)
    before = {k: words(v).clone() for k, v in net.state_dict().items()}
    faults = [Fault("weight", "0.weight", 3, xor=1 << 30), Fault("activation", "1", 0, value=7.0)]
    with pytest.raises(KeyError), inject(net, faults):
        raise KeyError("boom")
    assert all(torch.equal(words(v), before[k]) for k, v in net.state_dict().items())
    assert all(not m._forward_hooks for m in net.modules())


def test_activation_fault_changes_one_element_of_one_sample():
    net, shape = make("mlp")
    x = torch.rand(4, *shape, dtype=torch.float64)
    seen = {}
    net[2].register_forward_hook(lambda m, a, out: seen.setdefault("out", out.clone()))
    with torch.no_grad():
        clean = net[:3](x)
        seen.clear()
        with inject(net, [Fault("activation", "2", 5, value=42.0, sample=2)]):
            net(x)
    diff = (seen["out"] != clean).nonzero().tolist()
    assert diff == [[2, 5]] and seen["out"][2, 5] == 42.0


def test_sampling_is_seeded_and_respects_the_bit_class():
    net, _ = make("residual", dtype=torch.float32)
    sites = weight_sites(net)
    a = sample_faults(sites, 500, target="weight", bits="mantissa", flips=2, seed=7)
    b = sample_faults(sites, 500, target="weight", bits="mantissa", flips=2, seed=7)
    c = sample_faults(sites, 500, target="weight", bits="mantissa", flips=2, seed=8)
    assert a == b and a != c
    for faults in a:
        assert sum(len(f.bits) for f in faults) == 2
        assert all(0 <= bit < 23 for f in faults for bit in f.bits)
        assert all(f.xor == sum(1 << bit for bit in f.bits) for f in faults)
        assert all(0 <= f.index < sites[f.site][0] for f in faults)


def test_sites_are_drawn_in_proportion_to_their_size():
    sites = {"big": (9000, torch.float32), "small": (1000, torch.float32)}
    trials = sample_faults(sites, 8000, target="weight", seed=0)
    share = sum(t[0].site == "big" for t in trials) / len(trials)
    assert abs(share - 0.9) < 4 * (0.9 * 0.1 / len(trials)) ** 0.5 + 1e-3
    bits = np.bincount([t[0].bits[0] for t in trials], minlength=32)
    assert bits.min() > 0.5 * len(trials) / 32  # every bit position drawn, roughly uniformly


def test_exponent_model_changes_only_the_exponent():
    trials = sample_faults({"w": (10, torch.float32)}, 400, target="weight", model="exponent")
    x = torch.full((10,), 0.75)
    for (fault,) in trials:
        out = corrupt(x, fault)
        diff = int(words(out)[fault.index] ^ words(x)[fault.index])
        assert diff != 0 and diff & ~(0xFF << 23) == 0


def test_value_model_draws_in_its_range():
    trials = sample_faults({"w": (10, torch.float64)}, 300, target="weight", model="value",
                           value_range=5.0)  # fmt: skip
    values = [t[0].value for t in trials]
    assert all(-5.0 <= v <= 5.0 for v in values) and len(set(values)) == len(values)


def test_activation_sites_leave_out_reshapes():
    net, shape = make("conv")
    sites = activation_sites(net, torch.rand(1, *shape, dtype=torch.float64))
    assert sorted(sites) == ["0", "1", "2", "3", "5", "6", "7"]  # "4" is the Flatten
    assert sites["2"][0] == 4 * 2 * 2


def digits_bench(seed: int = 0) -> tuple[Bench, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                        nn.Linear(16, 4)).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.rand(40, 6, generator=gen)
    with torch.no_grad():
        labels = net(inputs).argmax(1)
    mon = monitor(net, Box(torch.zeros(6), torch.ones(6)))
    return Bench(net, mon, inputs, labels), torch.arange(20), torch.arange(20, 40)


@pytest.mark.parametrize("target", ["weight", "activation"])
def test_campaign_is_reproducible_from_its_seed(target):
    bench, prof, held = digits_bench()
    profiled = profile_ranges(bench, bench.inputs[prof])
    campaign = Campaign(150, target, bits="exponent", seed=3, batch=64)
    first = run_campaign(bench, held, profiled, campaign)
    second = run_campaign(bench, held, profiled, campaign)
    other = run_campaign(bench, held, profiled, Campaign(150, target, bits="exponent", seed=4))
    assert first == second and first != other
    summary = summarise(first)
    assert summary["trials"] == 150 and summary["sdc"] > 0
    ours = summary["methods"]["ours"]
    # A changed top-1 under a fault our monitor did not flag: its values stayed in their
    # certified ranges; those are counted, never assumed away.
    assert 0.0 <= ours["detected_sdc"] <= 1.0
    for row in first:
        if row["detected_ours"] == 0:
            assert row["recovered_ours"] == int(row["faulty"] == row["clean"])


def cli_args(tmp_path, shared_data, *extra):
    from verify.cli import faults as faults_cli

    parser = argparse.ArgumentParser()
    faults_cli.add_parser(parser.add_subparsers(dest="command"))
    net = shared_data / "vnncomp2022/mnist_fc/onnx/mnist-net_256x2.onnx.gz"
    data = shared_data / "oval/mnist_test_first100.csv"
    argv = ["faults", str(net), "--data", str(data), "--out", str(tmp_path), *extra]
    return faults_cli, parser.parse_args(argv)


@pytest.mark.data
def test_cli_writes_the_campaign(tmp_path, shared_data, capsys):
    cli, args = cli_args(tmp_path, shared_data, "--domain", "box:0,1", "--trials", "300",
                         "--no-progress")  # fmt: skip
    assert cli.main(args) == 0
    rows = list(csv.DictReader((tmp_path / "trials.csv").read_text().splitlines()))
    assert len(rows) == 600 and {r["target"] for r in rows} == {"weight", "activation"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["false_positives"]["rate"]["ours"] == 0.0
    assert (tmp_path / "bits.png").stat().st_size > 0
    assert "| ours |" in (tmp_path / "summary.md").read_text()
    assert "| ours |" in capsys.readouterr().out
    first = (tmp_path / "trials.csv").read_text()
    assert cli.main(args) == 0 and (tmp_path / "trials.csv").read_text() == first


@pytest.mark.data
def test_python_m_verify_runs_the_campaign(tmp_path, shared_data):
    """`python -m verify faults ...` is the same subcommand (wired in `verify.cli`)."""
    from verify.cli import main as cli

    net = shared_data / "vnncomp2022/mnist_fc/onnx/mnist-net_256x2.onnx.gz"
    data = shared_data / "oval/mnist_test_first100.csv"
    argv = ["faults", str(net), "--data", str(data), "--out", str(tmp_path), "--domain",
            "box:0,1", "--trials", "20", "--no-progress", "--no-plot"]  # fmt: skip
    assert cli.main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "trials.csv").read_text().splitlines()))
    assert len(rows) == 40


def test_a_bad_faults_option_is_one_error_line(tmp_path, capsys):
    from verify.cli import main as cli

    argv = ["faults", str(tmp_path / "missing.onnx"), "--data", str(tmp_path / "x.csv"),
            "--out", str(tmp_path), "--domain", "box:0,1", "--trials", "5"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "missing.onnx" in err[0]
