"""VNN-COMP's tool interface (`vnncomp_scripts/`), driven as the competition's harness does:
`prepare_instance.sh v1 CATEGORY ONNX VNNLIB`, then `run_instance.sh v1 CATEGORY ONNX VNNLIB
RESULTS TIMEOUT`; the results file holds the answer (a counterexample for "sat"), and a run
killed at its timeout still leaves a valid results file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from verify.cli.vnncomp import CACHE_NAME

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "vnncomp_scripts"
ACAS = ROOT.parent / "shared" / "data" / "vnncomp2022" / "acasxu"
ANSWERS = ("sat", "unsat", "timeout", "unknown", "error")


def _instance(tmp_path: Path, threshold: float) -> tuple[Path, Path]:
    """A 2-input ReLU net and the property `y0 >= threshold` on [-1, 1]^2."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1)).eval()
    onnx_path = tmp_path / "net.onnx"
    torch.onnx.export(net, (torch.zeros(1, 2),), str(onnx_path), dynamo=False, opset_version=13)
    with torch.no_grad():
        grid = torch.cartesian_prod(torch.linspace(-1, 1, 101), torch.linspace(-1, 1, 101))
        top = float(net(grid).max())
    spec = tmp_path / f"prop_{threshold}.vnnlib"
    lines = [f"(declare-const X_{i} Real)" for i in range(2)] + ["(declare-const Y_0 Real)"]
    lines += [f"(assert (>= X_{i} -1.0))\n(assert (<= X_{i} 1.0))" for i in range(2)]
    lines.append(f"(assert (>= Y_0 {top + threshold!r}))")
    spec.write_text("\n".join(lines) + "\n")
    return onnx_path, spec


def _run(script: str, *args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / script), "v1", "test", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "LDVERIFY_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}


def test_prepare_then_run_writes_the_answers(tmp_path: Path) -> None:
    env = _env(tmp_path)
    for margin, answer in ((0.5, "unsat"), (-0.5, "sat")):
        onnx_path, spec = _instance(tmp_path, margin)
        prepared = _run("prepare_instance.sh", onnx_path, spec, env=env)
        assert prepared.returncode == 0, prepared.stderr
        assert (tmp_path / "cache" / CACHE_NAME).is_file()
        results = tmp_path / f"{answer}.txt"
        done = _run("run_instance.sh", onnx_path, spec, results, 60, env=env)
        assert done.returncode == 0, done.stderr
        text = results.read_text()
        assert text.split("\n")[0] == answer, text
        if answer == "sat":  # ((X_0 v) (X_1 v) (Y_0 v)), each a float, y0 above the threshold
            values = dict(re.findall(r"\((X_\d+|Y_\d+) (\S+)\)", text))
            assert set(values) == {"X_0", "X_1", "Y_0"}
            assert all(-1 <= float(values[f"X_{i}"]) <= 1 for i in range(2))


def test_a_refused_instance_fails_prepare_with_the_reason(tmp_path: Path) -> None:
    onnx_path, spec = _instance(tmp_path, 0.5)
    spec.write_text(spec.read_text().replace("(declare-const X_1 Real)", ""))
    prepared = _run("prepare_instance.sh", onnx_path, spec, env=_env(tmp_path))
    assert prepared.returncode == 1 and "error:" in prepared.stderr


def test_a_stale_cache_is_not_used(tmp_path: Path) -> None:
    """The cache holds another instance: run reads the files again (their hashes differ)."""
    env = _env(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _run("prepare_instance.sh", *_instance(other, -0.5), env=env)
    onnx_path, spec = _instance(tmp_path, 0.5)
    results = tmp_path / "r.txt"
    _run("run_instance.sh", onnx_path, spec, results, 60, env=env)
    assert results.read_text().split("\n")[0] == "unsat"


@pytest.mark.skipif(not ACAS.exists(), reason="VNN-COMP 2022 ACAS Xu data absent")
def test_a_run_killed_at_its_timeout_leaves_a_valid_results_file(tmp_path: Path) -> None:
    """ACAS Xu 1_1 prop_1 runs for minutes; the harness kills it after 8 s."""
    onnx_path = ACAS / "onnx" / "ACASXU_run2a_1_1_batch_2000.onnx.gz"
    spec = ACAS / "vnnlib" / "prop_1.vnnlib.gz"
    results = tmp_path / "killed.txt"
    cmd = ["bash", str(SCRIPTS / "run_instance.sh"), "v1", "acasxu", str(onnx_path), str(spec),
           str(results), "116"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=_env(tmp_path), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(8)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert results.read_text().split("\n")[0] in ANSWERS
    assert not list(tmp_path.glob("*.part"))


def test_install_tool_runs_the_readmes_first_command() -> None:
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.+?)\n```", readme, re.S).group(1).strip()
    assert first in (SCRIPTS / "install_tool.sh").read_text()


def test_two_networks_given_relative_to_the_callers_folder(tmp_path: Path) -> None:
    """VNN-COMP 2026's `"a.onnx;b.onnx"` first column, relative paths: each network is found
    (the scripts change folder), and a network equivalent to its copy is proven so."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    for name in ("a", "b"):
        torch.onnx.export(net, (torch.zeros(1, 3),), str(tmp_path / f"{name}.onnx"),
                          dynamo=False, opset_version=13)  # fmt: skip
    lines = ["(vnnlib-version <2.0>)",
             "(declare-network a (declare-input X Real [3]) (declare-output Y Real [2]))",
             "(declare-network b (equal-to a) (declare-input Z Real [3]) "
             "(declare-output W Real [2]))"]  # fmt: skip
    lines += [f"(assert (>= X[{i}] 0.0))\n(assert (<= X[{i}] 1.0))" for i in range(3)]
    lines.append("(assert (or (>= (- Y[0] W[0]) 0.001) (<= (- Y[0] W[0]) -0.001)))")
    (tmp_path / "prop.vnnlib").write_text("\n".join(lines) + "\n")
    env = _env(tmp_path)
    args = ("a.onnx;b.onnx", "prop.vnnlib")
    prepared = subprocess.run(
        ["bash", str(SCRIPTS / "prepare_instance.sh"), "v1", "test", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    done = subprocess.run(["bash", str(SCRIPTS / "run_instance.sh"), "v1", "test", *args,
                           "out.txt", "60"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_text().split("\n")[0] == "unsat"


def _dummy(argv0: str) -> subprocess.Popen:
    """A sleeping process whose command line reads `argv0` (as `ps` and /proc show it)."""
    return subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" sleep 60'])


def test_prepare_kills_only_the_run_it_left_behind(tmp_path: Path) -> None:
    """The run recorded in the cache's PID file is killed; another user's `verify run-all`
    (or any other process) is not."""
    env = _env(tmp_path)
    onnx_path, spec = _instance(tmp_path, 0.5)
    leftover, bystander = _dummy("python -m verify run a b"), _dummy("python -m verify run-all x")
    try:
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "run.pid").write_text(str(leftover.pid))
        time.sleep(0.2)
        assert _run("prepare_instance.sh", onnx_path, spec, env=env).returncode == 0
        assert leftover.wait(timeout=10) != 0  # killed
        assert bystander.poll() is None  # still running
        assert not (tmp_path / "cache" / "run.pid").exists()
    finally:
        for proc in (leftover, bystander):
            proc.kill()
            proc.wait()
