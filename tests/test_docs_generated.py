"""The generated reference pages (`docs/gen_ref.py`: the command line from the argparse parsers,
the ops from the registries) are current, and every subcommand and flag has a help text (the
command-line page is made of them)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_ref", ROOT / "docs" / "gen_ref.py")
gen_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_ref)

PARSERS = {"python -m verify": gen_ref.build_parser, "python -m crf": gen_ref.crf_parser}


def test_generated_pages_are_current() -> None:
    stale = [p.relative_to(ROOT).as_posix() for p in gen_ref.stale()]
    assert not stale, f"{stale} not current: run python docs/gen_ref.py and commit the pages"


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
