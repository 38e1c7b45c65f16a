"""The quickstart example runs end to end and prints a row per method."""

from __future__ import annotations

import runpy
from pathlib import Path

from bounds import available_methods

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_quickstart_prints_every_method(capsys):
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "test accuracy" in out
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    for method in available_methods():
        if method != "milp":
            assert method in rows, method
