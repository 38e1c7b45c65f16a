"""The GPU session script runs end to end (tiny sizes, CPU, Triton's interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check


@pytest.mark.slow
def test_gpu_check_smoke_runs_and_checks_pass(tmp_path):
    status = gpu_check.main(["--smoke", "--skip", "steps,crf", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "gpu_check_smoke.json").read_text())
    assert {r["part"] for r in rows} == {"bounds", "prox-kernels", "anderson"}
    assert all(r.get("ok", True) for r in rows), rows
    assert status == 0


def test_gpu_check_sh_copies_only_this_runs_tables(tmp_path):
    """`gpu_check.sh` sends back the tables its run wrote, not older `gpu_check*` results (a
    copy of the script in a scratch tree, with a `python` that writes two tables)."""
    root = tmp_path / "tree"
    (root / "benchmarks" / "results").mkdir(parents=True)
    script = Path(gpu_check.__file__).with_name("gpu_check.sh")
    shutil.copy(script, root / "benchmarks" / "gpu_check.sh")
    results = root / "benchmarks" / "results"
    for old in ("gpu_check_h200.txt", "gpu_check_h200.json", "gpu_check_smoke.json"):
        (results / old).write_text("old\n")
        os.utime(results / old, (1_000_000_000, 1_000_000_000))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        "echo new > benchmarks/results/gpu_check.txt\n"
        "echo '[]' > benchmarks/results/gpu_check.json\n"
        "echo log > benchmarks/results/other.txt\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)}
    run = subprocess.run(["bash", str(root / "benchmarks" / "gpu_check.sh")], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.txt"]


def test_anderson_part_halves_its_batch_until_it_fits(monkeypatch):
    """An out-of-memory error above `fits` domains: the part runs at 2 of the 8 asked and
    reports it; where nothing fits, the error comes from batch 1."""
    real, tried, fits = gpu_check._anderson_run, [], [2]

    def limited(device, size, batch, method, seed=0):
        tried.append(batch)
        if batch > fits[0]:
            raise torch.OutOfMemoryError("CUDA out of memory (emulated)")
        return real(device, size, batch, method, seed)

    monkeypatch.setattr(gpu_check, "_anderson_run", limited)
    size = {**gpu_check.SMOKE, "batch": 8}
    rows = gpu_check.anderson_steps(torch.device("cpu"), size)
    assert [(r["batch"], r["batch_asked"]) for r in rows] == [(2, 8), (2, 8)]
    assert all(r["ok"] for r in rows), rows
    assert tried[:3] == [8, 4, 2]
    tried.clear()
    fits[0] = 0
    with pytest.raises(torch.OutOfMemoryError):
        gpu_check._fitting_run(torch.device("cpu"), size, 4, "sp-fw")
    assert tried == [4, 2, 1]


def test_steps_part_judges_a_compiled_output_by_the_eager_one():
    """Same structure and values: 0; a state that lost items (the 2026-11-30 compiled sweep):
    inf, so the row is not ok and its timing is not taken."""
    from bounds.dual.proximal import ProxState

    t = (torch.ones(2, 3),)
    state = ProxState(t, t, t, t, torch.zeros(2), t)
    assert gpu_check.output_difference(state, state) == 0.0
    assert gpu_check.output_difference(state._replace(best_value=torch.ones(2)), state) == 1.0
    broken = tuple.__new__(ProxState, tuple(state)[:2])
    assert gpu_check.output_difference(broken, state) == float("inf")
    inf = torch.full((2,), float("inf"))
    assert gpu_check.output_difference((inf,), (inf,)) == 0.0  # alpha-CROWN's unbounded ends
