"""The public API's docstrings state every argument (with its shape where it is a tensor), what
it returns and what it raises, in the sections the API reference renders (Google style:
`Args:`, `Returns:`, `Raises:`), so a new argument without its line fails here."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from torch import nn

import crf
import verify
from verify.monitor import Monitor
from verify.monitor.api import monitor
from verify.property import Polytope, Region

PUBLIC = {
    "verify.bounds": verify.bounds,
    "verify.network_graph": verify.network_graph,
    "verify.verify": verify.verify,
    "verify.monitor": monitor,
    "verify.Monitor.wrap": Monitor.wrap,
    "verify.Monitor.check": Monitor.check,
    "verify.check_certificate": verify.check_certificate,
    "verify.load_onnx": verify.load_onnx,
    "verify.load_vnnlib": verify.load_vnnlib,
    "verify.find_counterexample": verify.find_counterexample,
    "crf.DenseCRF": crf.DenseCRF,
    "crf.DenseCRF.map": crf.DenseCRF.map,
    "crf.DenseCRF.energy": crf.DenseCRF.energy,
}


def _section(doc: str, name: str) -> str:
    """The body of a Google-style section (its indented lines after `name:`)."""
    match = re.search(rf"^(\s*){name}:\n((?:\1\s+.*\n|\s*\n)+)", doc + "\n", re.M)
    return match.group(2) if match else ""


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_sections(name: str) -> None:
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj) or ""
    function = obj.__init__ if inspect.isclass(obj) else obj
    params = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
    args = _section(doc, "Args")
    missing = [p for p in params if not re.search(rf"^\s+\**{p}:", args, re.M)]
    assert not missing, f"{name}: arguments without a line in Args: {missing}"
    assert _section(doc, "Raises").strip(), f"{name}: no Raises section"
    if not inspect.isclass(obj):
        assert _section(doc, "Returns").strip(), f"{name}: no Returns section"


def test_find_counterexample_checks_the_shape() -> None:
    """The size mismatch its docstring names is a typed error, before any attack."""
    net = nn.Sequential(nn.Linear(3, 2)).eval()
    region = Region(np.zeros(4), np.ones(4), (Polytope(np.eye(2)[:1], np.zeros(1)),))
    with pytest.raises(verify.ShapeMismatchError, match="4 inputs"):
        verify.find_counterexample(net, region, input_shape=(3,))
