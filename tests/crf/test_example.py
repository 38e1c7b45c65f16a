"""Smoke test of ``examples/crf_refine.py`` on its synthetic input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crf_refine.py"


def test_crf_refine_example_runs(tmp_path):
    spec = importlib.util.spec_from_file_location("crf_refine_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    energies = module.main(["--synthetic", "--out", str(tmp_path)])
    assert set(energies) == {"meanfield", "qp", "dc-neg", "lp"}
    assert (tmp_path / "lp_overlay.png").exists()
