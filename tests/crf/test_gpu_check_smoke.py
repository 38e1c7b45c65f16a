"""Smoke test of benchmarks/gpu_check_crf.py on a tiny instance: every kernel check passes and
every solver step runs in the eager modes (on CPU: Triton through its interpreter)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import gpu_check_crf
from kernels import backend


@pytest.mark.slow
@pytest.mark.skipif(not backend.INTERPRET and not torch.cuda.is_available(), reason="no Triton")
def test_gpu_check_smoke_runs_and_passes():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ("eager-reference", "eager-triton")
    rows = gpu_check_crf.run(device, smoke=True, iterations=2, modes=modes)
    kernels = [r for r in rows if r["kind"] == "kernel"]
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(kernels) == 7 and all(r["ok"] for r in kernels)
    assert len(steps) == 5 * len(modes) and all(r["ok"] for r in steps)
    assert all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in kernels + steps)
    assert "FAIL" not in gpu_check_crf.format_table(rows)
    with pytest.raises(ValueError):
        gpu_check_crf.run(device, smoke=True, modes=("fastest",))
