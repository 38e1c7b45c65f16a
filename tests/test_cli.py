"""`python -m verify run` / `run-all` on ACAS Xu instances from ../shared/data, the results file
format, and the results CSV."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import verify
from verify.cli.main import main
from verify.cli.options import resolve
from verify.result import VerificationResult

ROOT = Path(__file__).resolve().parents[1]
# (network, property, answer): prop 1 on N_1,1 holds; prop 2 on N_2,1 and prop 7 on N_1,9 are
# violated (Katz et al. 2017; VNN-COMP 2022).
INSTANCES = [("1_1", 1, "unsat"), ("2_1", 2, "sat"), ("1_9", 7, "sat")]


def acas(shared: Path, net: str, prop: int) -> tuple[Path, Path]:
    folder = shared / "vnncomp2022" / "acasxu"
    return (
        resolve(folder, f"onnx/ACASXU_run2a_{net}_batch_2000.onnx"),
        resolve(folder, f"vnnlib/prop_{prop}.vnnlib"),
    )


def parse_results(text: str) -> tuple[str, dict[str, float]]:
    """The status and the `(X_i v)` / `(Y_i v)` assignment of a VNN-COMP results file."""
    status, _, body = text.partition("\n")
    values = {}
    for item in body.replace("(", " ").replace(")", " \n").splitlines():
        parts = item.split()
        if parts:
            assert len(parts) == 2, item
            values[parts[0]] = float(parts[1])
    return status, values


def check_counterexample(net_path: Path, prop_path: Path, values: dict[str, float]) -> None:
    """The X values lie in some region's box, the Y values are net(X), and Y is unsafe."""
    net = verify.load_onnx(net_path)
    prop = verify.load_vnnlib(prop_path)
    x = np.array([values[f"X_{i}"] for i in range(prop.n_inputs)])
    y = np.array([values[f"Y_{i}"] for i in range(prop.n_outputs)])
    got = net.double()(torch.tensor(x).reshape(1, *net.input_shape)).detach().numpy().ravel()
    np.testing.assert_allclose(got, y, rtol=1e-9, atol=1e-12)
    assert any(
        np.all(x >= r.lower) and np.all(x <= r.upper) and any(p.contains(y) for p in r.unsafe)
        for r in prop.regions
    )


@pytest.mark.data
@pytest.mark.parametrize(("net", "prop", "answer"), INSTANCES)
def test_run_prints_the_answer_and_writes_the_results_file(
    shared_data, tmp_path, capsys, net, prop, answer
):
    net_path, prop_path = acas(shared_data, net, prop)
    results = tmp_path / "out.txt"
    args = ["run", str(net_path), str(prop_path), "--timeout", "30", "--results-file", str(results)]
    assert main(args) == 0
    assert capsys.readouterr().out == f"{answer}\n"
    status, values = parse_results(results.read_text())
    assert status == answer
    if answer == "sat":
        check_counterexample(net_path, prop_path, values)
    else:
        assert values == {}


@pytest.mark.data
def test_module_entry_point_reads_plain_names_from_their_gz(shared_data):
    net_path, prop_path = acas(shared_data, "2_1", 2)
    plain = [str(p).removesuffix(".gz") for p in (net_path, prop_path)]
    cmd = [sys.executable, "-m", "verify", "run", *plain, "--timeout", "20"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["sat"]


@pytest.mark.data
def test_run_all_writes_one_row_per_instance(shared_data, tmp_path, capsys):
    folder = shared_data / "vnncomp2022" / "acasxu"
    rows = [(f"onnx/ACASXU_run2a_{n}_batch_2000.onnx", f"vnnlib/prop_{p}.vnnlib", 116)
            for n, p, _ in INSTANCES]  # fmt: skip
    instances = tmp_path / "instances.csv"
    instances.write_text("".join(f"{a},{b},{t}\n" for a, b, t in rows))
    out = tmp_path / "results.csv"
    args = ["run-all", str(instances), "--root", str(folder), "--out", str(out)]
    assert main([*args, "--limit", "2", "--timeout-scale", "0.2"]) == 0
    printed = capsys.readouterr().out
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["network", "property", "result", "seconds"]
    assert [(r["network"], r["property"]) for r in table] == [r[:2] for r in rows[:2]]
    assert [r["result"] for r in table] == [a for _, _, a in INSTANCES[:2]]
    assert all(0 < float(r["seconds"]) < 116 * 0.2 + 1 for r in table)
    assert "[2/2]" in printed and "total" in printed


def test_results_text_format():
    x, y = torch.tensor([0.5, -1.25], dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)
    text = VerificationResult("sat", (x, y), 1.0).results_text()
    assert text == "sat\n((X_0 0.5)\n (X_1 -1.25)\n (Y_0 3.0))\n"
    assert VerificationResult("timeout").results_text() == "timeout\n"
    with pytest.raises(ValueError, match="counterexample"):
        VerificationResult("sat")
    with pytest.raises(ValueError, match="status"):
        VerificationResult("proved")


def test_parser_rejects_a_missing_timeout(capsys):
    with pytest.raises(SystemExit):
        main(["run", "net.onnx", "spec.vnnlib"])
    assert "--timeout" in capsys.readouterr().err
