"""Smoke tests of benchmarks/gpu_check_crf.py on a tiny instance: the end-to-end timings run
(on CPU here: the path a GPU run takes, on CPU tensors), every kernel check passes and every
solver step runs in the eager modes (on CPU: Triton through its interpreter)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import gpu_check_crf
from kernels import backend


def test_end_to_end_rows_on_cpu():
    rows = gpu_check_crf.end_to_end("cpu", smoke=True, repeats=1)
    names = [r["name"] for r in rows]
    assert names == ["meanfield x5 b=1", "meanfield x5 b=2", "lp at 3x MF b=1"]
    assert all(r["kind"] == "e2e" and math.isfinite(r["ms"]) and r["ms"] > 0 for r in rows)
    lp = rows[-1]
    assert isinstance(lp["lower_than_meanfield"], bool) and lp["time_ratio"] > 0
    assert all(r.get("target_met") is None for r in rows)  # smoke: no target judged
    lines = gpu_check_crf.format_e2e(rows)
    assert len(lines) == 3 and "lp at 3x MF" in lines[-1]


@pytest.mark.slow
@pytest.mark.skipif(not backend.INTERPRET and not torch.cuda.is_available(), reason="no Triton")
def test_gpu_check_smoke_runs_and_passes():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ("eager-reference", "eager-triton")
    rows = gpu_check_crf.run(device, smoke=True, iterations=2, modes=modes, e2e=False)
    kernels = [r for r in rows if r["kind"] == "kernel"]
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(kernels) == 7 and all(r["ok"] for r in kernels)
    assert len(steps) == 5 * len(modes) and all(r["ok"] for r in steps)
    assert all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in kernels + steps)
    assert "FAIL" not in gpu_check_crf.format_table(rows)
    with pytest.raises(ValueError):
        gpu_check_crf.run(device, smoke=True, modes=("fastest",))
