"""The GPU session script runs end to end (tiny sizes, CPU, Triton's interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

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
