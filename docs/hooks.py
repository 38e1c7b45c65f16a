"""MkDocs hooks (`mkdocs.yml`): the build fails when a generated reference page is not current
(`docs/gen_ref.py`), so a new flag or op cannot leave the docs behind silently."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]


def on_pre_build(config) -> None:
    """Check docs/reference/cli.md and ops.md against the code before anything is built."""
    for folder in (ROOT, ROOT / "docs"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    from gen_ref import stale  # after the path: docs/gen_ref.py, on this checkout's packages

    old = stale()
    if old:
        names = ", ".join(str(p.relative_to(ROOT)) for p in old)
        raise PluginError(f"{names} not current: run python docs/gen_ref.py")
