"""The GPU session script runs end to end (tiny sizes, CPU, Triton's interpreter)."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_check


@pytest.mark.slow
def test_gpu_check_smoke_runs_and_checks_pass(tmp_path):
    status = gpu_check.main(["--smoke", "--skip", "steps,crf", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "gpu_check_smoke.json").read_text())
    assert {r["part"] for r in rows} == {"bounds", "prox-kernels", "anderson"}
    assert all(r.get("ok", True) for r in rows), rows
    assert status == 0
