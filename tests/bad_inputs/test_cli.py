"""Bad command lines and bad instances files: exit status 2 (argparse or one `error:` line) naming
the option, file or row, checked before any verification work, and nothing written."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import verify.cli.main as cli
from tests.bad_inputs.conftest import no_side_effects
from tests.bad_inputs.tiny import tiny_onnx, tiny_vnnlib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "net": tiny_onnx(tmp_path / "net.onnx"),
        "prop": tiny_vnnlib(tmp_path / "prop.vnnlib"),
        "dir": tmp_path,
    }


@pytest.fixture
def no_verification(monkeypatch):
    """Any call of the verification fails the test: the checks come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("verification ran before the bad option was caught")

    monkeypatch.setattr(cli, "verify", refuse)


def _run_args(files, *extra: str) -> list[str]:
    return ["run", str(files["net"]), str(files["prop"]), *extra]


BAD_OPTIONS = [
    ("timeout-nan", ["--timeout", "nan"], "--timeout"),
    ("timeout-negative", ["--timeout", "-1"], "--timeout"),
    ("timeout-zero", ["--timeout", "0"], "--timeout"),
    ("timeout-inf", ["--timeout", "inf"], "--timeout"),
    ("timeout-text", ["--timeout", "soon"], "--timeout"),
    ("threads-zero", ["--timeout", "5", "--threads", "0"], "--threads"),
    ("prox-sweeps-negative", ["--timeout", "5", "--prox-sweeps", "-1"], "--prox-sweeps"),
    ("method-unknown", ["--timeout", "5", "--method", "nope"], "available"),
    ("device-unknown", ["--timeout", "5", "--device", "tpu9"], "--device"),
    ("splitting-unknown", ["--timeout", "5", "--splitting", "neurons"], "--splitting"),
]


@pytest.mark.parametrize(
    ("args", "where"), [c[1:] for c in BAD_OPTIONS], ids=[c[0] for c in BAD_OPTIONS]
)
def test_run_rejects_bad_options(files, no_verification, capsys, args, where):
    with no_side_effects(files["dir"]), pytest.raises(SystemExit) as info:
        cli.main(_run_args(files, *args))
    assert info.value.code == 2
    assert where in capsys.readouterr().err


BAD_RUN_ALL = [
    ("limit-negative", ["--limit", "-1"], "--limit"),
    ("limit-zero", ["--limit", "0"], "--limit"),
    ("scale-nan", ["--timeout-scale", "nan"], "--timeout-scale"),
    ("scale-negative", ["--timeout-scale", "-0.5"], "--timeout-scale"),
]


@pytest.mark.parametrize(
    ("args", "where"), [c[1:] for c in BAD_RUN_ALL], ids=[c[0] for c in BAD_RUN_ALL]
)
def test_run_all_rejects_bad_options(files, no_verification, capsys, args, where):
    instances = files["dir"] / "instances.csv"
    instances.write_text("net.onnx,prop.vnnlib,5\n")
    out = files["dir"] / "results.csv"
    with no_side_effects(files["dir"]), pytest.raises(SystemExit) as info:
        cli.main(["run-all", str(instances), "--out", str(out), *args])
    assert info.value.code == 2
    assert where in capsys.readouterr().err


def test_timeout_nan_in_the_python_api_is_rejected():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "a", "b", "--timeout", "NaN"])


def test_results_file_in_a_missing_folder_is_caught_before_verification(
    files, no_verification, capsys
):
    target = files["dir"] / "missing" / "out.txt"
    with no_side_effects(files["dir"]):
        status = cli.main(_run_args(files, "--timeout", "5", "--results-file", str(target)))
    err = capsys.readouterr().err
    assert status == 2 and "--results-file" in err and str(target.parent) in err


def test_results_file_that_is_a_folder(files, no_verification, capsys):
    with no_side_effects(files["dir"]):
        status = cli.main(_run_args(files, "--timeout", "5", "--results-file", str(files["dir"])))
    err = capsys.readouterr().err
    assert status == 2 and "is a folder" in err


def test_method_under_relu_splitting_is_refused(files, no_verification, capsys):
    args = _run_args(files, "--timeout", "5", "--splitting", "relu", "--method", "ibp")
    with no_side_effects(files["dir"]):
        status = cli.main(args)
    err = capsys.readouterr().err
    assert status == 2 and "--method ibp" in err and "ReLU splitting" in err


@pytest.mark.parametrize("which", ["net", "prop"])
def test_missing_input_file_is_named(files, no_verification, capsys, which):
    args = _run_args(files, "--timeout", "5")
    missing = files["dir"] / f"absent_{which}"
    args[1 if which == "net" else 2] = str(missing)
    with no_side_effects(files["dir"]):
        status = cli.main(args)
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error:") and "absent_" + which in err


def test_run_all_out_in_a_missing_folder(files, no_verification, capsys):
    instances = files["dir"] / "instances.csv"
    instances.write_text("net.onnx,prop.vnnlib,5\n")
    out = files["dir"] / "nowhere" / "results.csv"
    with no_side_effects(files["dir"]):
        status = cli.main(["run-all", str(instances), "--out", str(out)])
    assert status == 2 and "nowhere" in capsys.readouterr().err


def test_missing_instances_file(files, capsys):
    out = files["dir"] / "results.csv"
    status = cli.main(["run-all", str(files["dir"] / "absent.csv"), "--out", str(out)])
    assert status == 2 and "absent.csv" in capsys.readouterr().err


BAD_ROWS = [
    ("header", "network,property,timeout", "timeout 'timeout' is not a number"),
    ("missing-column", "net.onnx,prop.vnnlib", "2 columns"),
    ("one-column", "net.onnx", "1 columns"),
    ("non-numeric-timeout", "net.onnx,prop.vnnlib,soon", "'soon' is not a number"),
    ("nan-timeout", "net.onnx,prop.vnnlib,nan", "must be finite"),
    ("negative-timeout", "net.onnx,prop.vnnlib,-3", "must be finite and > 0"),
    ("empty-name", ",prop.vnnlib,5", "empty network"),
    ("missing-network", "absent.onnx,prop.vnnlib,5", "absent.onnx"),
    ("missing-property", "net.onnx,absent.vnnlib,5", "absent.vnnlib"),
    ("garbage-network", "garbage.onnx,prop.vnnlib,5", "garbage.onnx"),
]


@pytest.mark.parametrize(("row", "why"), [c[1:] for c in BAD_ROWS], ids=[c[0] for c in BAD_ROWS])
def test_bad_rows_are_reported_with_their_number_and_skipped(files, capsys, row, why):
    (files["dir"] / "garbage.onnx").write_bytes(b"\x08\x01garbage")
    instances = files["dir"] / "instances.csv"
    instances.write_text(f"net.onnx,prop.vnnlib,5\n{row}\nnet.onnx,prop.vnnlib,5\n")
    out = files["dir"] / "results.csv"
    assert cli.main(["run-all", str(instances), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{instances}:2: skipped" in err and why in err
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["result"] for r in table] == ["unsat", "unsat"]  # the good rows ran


def test_limit_counts_valid_rows(files, capsys):
    instances = files["dir"] / "instances.csv"
    instances.write_text("network,property,timeout\n" + "net.onnx,prop.vnnlib,5\n" * 3)
    out = files["dir"] / "results.csv"
    assert cli.main(["run-all", str(instances), "--out", str(out), "--limit", "3"]) == 0
    with open(out, newline="") as f:
        assert len(list(csv.DictReader(f))) == 3


SLOW_RUN_ALL = """
import signal, sys, time
# Ctrl-C as at a terminal, even when the tests were started in the background (a shell starts
# background jobs with SIGINT ignored, and the child would inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
import verify.verifier as verifier
from verify.bab.common import RegionOutcome


def slow_region(net, region, deadline, config, seed):  # branch and bound that takes its time
    while time.monotonic() < deadline:
        time.sleep(0.02)
    return RegionOutcome("timeout")


verifier.solve_region = slow_region
from verify.cli.main import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_first_ctrl_c_stops_run_all_and_keeps_the_finished_rows(tmp_path):
    """A real SIGINT to a real process (branch and bound replaced by a stand-in that runs to its
    deadline): the finished row is kept, the interrupted one is written as `unknown`, no further
    instance starts, the exit status is 130."""
    tiny_onnx(tmp_path / "net.onnx")
    tiny_vnnlib(tmp_path / "prop.vnnlib", threshold=-1e3)  # sat: the attack answers at once
    instances = tmp_path / "instances.csv"
    instances.write_text("net.onnx,prop.vnnlib,5\n" + "net.onnx,prop.vnnlib.slow,60\n" * 2)
    tiny_vnnlib(tmp_path / "prop.vnnlib.slow")  # unsat: reaches the stand-in
    out = tmp_path / "results.csv"
    cmd = [sys.executable, "-c", SLOW_RUN_ALL, "run-all", str(instances), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    first = proc.stdout.readline()
    assert "[1/3]" in first and ": sat" in first, first + proc.stderr.read()
    time.sleep(1.0)  # inside the second instance
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["property"], r["result"]) for r in table] == [
        ("prop.vnnlib", "sat"),
        ("prop.vnnlib.slow", "unknown"),
    ]
    assert float(table[1]["seconds"]) < 30
    assert "interrupted" in err and "[3/3]" not in rest


def test_highs_banner_stays_out_of_our_output():
    code = (
        "import torch, verify; from torch import nn; torch.manual_seed(0);"
        "net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1));"
        "verify.bounds(net, 0.1, x=torch.zeros(1, 2), method='lp'); print('done')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    assert "HiGHS" not in out.stderr
