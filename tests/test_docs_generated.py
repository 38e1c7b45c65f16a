"""The generated reference pages (`docs/gen_ref.py`: the command line from the argparse parsers,
the ops from the registries) are current, and every subcommand and flag has a help text (the
command-line page is made of them)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_ref", ROOT / "docs" / "gen_ref.py")
gen_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_ref)

PARSERS = {"python -m verify": gen_ref.build_parser, "python -m crf": gen_ref.crf_parser}


def test_generated_pages_are_current() -> None:
    """In a fresh interpreter: the pages document the shipped registries, not what other tests
    of this process registered (plugin activations and methods)."""
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_ref.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}{done.stderr}: commit the regenerated pages"


@pytest.mark.parametrize("prog", PARSERS)
def test_every_flag_has_help(prog: str) -> None:
    missing = []
    commands = list(gen_ref.subcommands(PARSERS[prog]()))
    assert commands, f"{prog}: no subcommands found"
    for name, help_text, sub in commands:
        if not help_text.strip():
            missing.append(f"{prog} {name} (the subcommand)")
        for action in gen_ref.arguments(sub):
            if action.help in (None, argparse.SUPPRESS) or not action.help.strip():
                flag = action.option_strings[0] if action.option_strings else action.dest
                missing.append(f"{prog} {name} {flag}")
    assert not missing, f"arguments without a help text: {missing}"


def test_cli_page_lists_every_flag() -> None:
    page = gen_ref.cli_page()
    for prog, build in PARSERS.items():
        for name, _, sub in gen_ref.subcommands(build()):
            assert f"### `{prog} {name}`" in page
            for action in gen_ref.arguments(sub):
                assert (action.option_strings or [action.dest])[0] in page
