"""The examples run end to end (the slow ones in their --quick mode) and print what they show."""

from __future__ import annotations

import runpy
import sys
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


def run_example(name: str, monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])
    runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    return capsys.readouterr().out


def test_vae_latent_proves_a_box_and_writes_the_picture(monkeypatch, capsys, tmp_path):
    out = tmp_path / "box.png"
    text = run_example("vae_latent", monkeypatch, capsys, "--quick", "--out", str(out))
    assert "test accuracy" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:3] in ("0.5", "1.0")]
    assert [row[2] for row in rows] == ["proven", "proven"]
    assert "crosses the 3/8 boundary): no: one reads" in text
    assert out.read_bytes().startswith(b"\x89PNG")


def test_learned_program_prints_the_certified_deltas(monkeypatch, capsys):
    text = run_example("learned_program", monkeypatch, capsys, "--quick")
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["100"], ["300"])]
    assert len(rows) == 2
    for row in rows:
        witnessed, certified = float(row[3]), float(row[4])
        assert float(row[2]) <= witnessed <= certified <= 1.01 * witnessed
    assert "verify: sat" in text
