"""Every ```python block of README.md and docs/**/*.md runs: the blocks of one file in order, in
one namespace, in a fresh folder, so a renamed function or argument fails here and not in a
reader's hands.

- A block that reads `../shared/data` (the path as the docs write it, relative to the
  repository root) gets the shared data folder's real path; without that folder it is skipped
  with the reason, and the file's other blocks still run.
- A block whose first line is `# docs-test: skip (REASON)` is not run (for long runs only; the
  reason is required).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
DATA_PATH = "../shared/data"
SKIP = re.compile(r"^# docs-test: skip \((?P<reason>[^)]+)\)\s*$")
FENCE = re.compile(r"^```python[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)


def doc_files() -> list[Path]:
    """README.md and every page under docs/, sorted."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of a markdown text: (line of the fence, source)."""
    return [(text.count("\n", 0, m.start()) + 1, m.group("body")) for m in FENCE.finditer(text)]


def skip_reason(source: str) -> str | None:
    """The reason of a `# docs-test: skip (REASON)` first line, else None."""
    first = source.lstrip("\n").split("\n", 1)[0]
    match = SKIP.match(first)
    return match.group("reason") if match else None


def run_blocks(path: Path, workdir: Path) -> list[str]:
    """Run the file's blocks in order in one namespace inside `workdir`; returns the reasons of
    the blocks skipped. A failing block raises, naming the file and line."""
    skipped, namespace = [], {"__name__": f"docs_{path.stem}"}
    old = Path.cwd()
    os.chdir(workdir)
    try:
        for line, source in python_blocks(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{line}"
            reason = skip_reason(source)
            if reason is None and DATA_PATH in source and not SHARED_DATA.is_dir():
                reason = f"needs {SHARED_DATA}, absent"
            if reason is not None:
                skipped.append(f"{where}: {reason}")
                continue
            code = compile(source.replace(DATA_PATH, SHARED_DATA.as_posix()), where, "exec")
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    exec(code, namespace)
                except Exception as error:
                    raise AssertionError(f"the block at {where} failed: {error!r}") from error
    finally:
        os.chdir(old)
    return skipped


def test_blocks_found() -> None:
    """The extraction is not vacuous: the pages that teach the API carry runnable blocks."""
    counts = {
        p.relative_to(ROOT).as_posix(): len(python_blocks(p.read_text())) for p in doc_files()
    }
    assert counts["README.md"] >= 2
    assert counts["docs/getting-started.md"] >= 3
    assert sum(counts.values()) >= 12


def test_skip_marker() -> None:
    assert skip_reason("# docs-test: skip (takes ten minutes)\nx = 1\n") == "takes ten minutes"
    assert skip_reason("x = 1  # docs-test: skip (not first)\n") is None
    assert skip_reason("# docs-test: skip\nx = 1\n") is None  # a reason is required


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_doc_blocks_run(path: Path, tmp_path: Path) -> None:
    skipped = run_blocks(path, tmp_path)
    if skipped:
        pytest.skip("; ".join(skipped))
