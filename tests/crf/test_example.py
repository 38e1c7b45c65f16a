"""Smoke tests of the CRF examples: ``examples/crf_refine.py`` on its synthetic input and
``examples/crf_segmentation.py`` (a network trained in-process, refined by a batched CRF)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crf_refine_example_runs(tmp_path):
    energies = _load("crf_refine").main(["--synthetic", "--out", str(tmp_path)])
    assert set(energies) == {"meanfield", "qp", "dc-neg", "lp"}
    assert (tmp_path / "lp_overlay.png").exists()


def test_crf_segmentation_example_runs(capsys):
    out = _load("crf_segmentation").main(["--steps", "20", "--test", "2", "--device", "cpu"])
    for key in ("before", "after"):
        acc, miou = out[key]
        assert 0.0 <= acc <= 1.0 and 0.0 <= miou <= 1.0
    assert out["crf_seconds"] > 0 and "mean IoU" in capsys.readouterr().out


@pytest.mark.slow
def test_crf_segmentation_example_crf_improves_the_network():
    """The example's point, at its defaults (150 training steps, 8 test images)."""
    out = _load("crf_segmentation").main(["--device", "cpu"])
    assert out["after"][0] > out["before"][0] and out["after"][1] > out["before"][1]
