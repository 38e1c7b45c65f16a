"""The bad-input corpus: every case asserts the error type, the what-and-where in its message,
and that nothing was written or mutated (`no_side_effects`, `unchanged_module`)."""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn


@contextlib.contextmanager
def raises_where(error: type[BaseException], *where: str) -> Iterator[pytest.ExceptionInfo]:
    """`pytest.raises(error)` whose message must contain every string of `where` (the what and
    where: a path, a line, a node name, an index, a row)."""
    with pytest.raises(error) as info:
        yield info
    message = str(info.value)
    for fragment in where:
        assert fragment in message, f"{fragment!r} not in the message {message!r}"


def snapshot_tree(folder: Path) -> dict[str, tuple[int, int]]:
    """`{relative path: (size, mtime_ns)}` of every file under `folder`."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@contextlib.contextmanager
def no_side_effects(folder: Path) -> Iterator[None]:
    """Asserts that no file under `folder` was created, changed or removed (even on error)."""
    before = snapshot_tree(folder)
    try:
        yield
    finally:
        assert snapshot_tree(folder) == before, "files were written or changed"


def module_state(net: nn.Module) -> dict:
    """Everything a call could mutate: parameters, buffers, training flags, structure."""
    return {
        "tensors": {k: v.detach().clone() for k, v in net.state_dict().items()},
        "training": [m.training for m in net.modules()],
        "structure": repr(net),
        "requires_grad": [p.requires_grad for p in net.parameters()],
    }


@contextlib.contextmanager
def unchanged_module(net: nn.Module) -> Iterator[None]:
    """Asserts that `net` is left as it was (even when the call raises)."""
    before = module_state(net)
    try:
        yield
    finally:
        after = module_state(net)
        assert after["structure"] == before["structure"]
        assert after["training"] == before["training"]
        assert after["requires_grad"] == before["requires_grad"]
        assert after["tensors"].keys() == before["tensors"].keys()
        for key, value in before["tensors"].items():
            assert torch.equal(after["tensors"][key], value), f"{key} was mutated"


def line_of(message: str) -> int | None:
    """The line number in a `path:line: ...` message, or None."""
    match = re.search(r":(\d+):", message)
    return int(match.group(1)) if match else None


__all__ = ["copy", "line_of", "module_state", "no_side_effects", "raises_where", "unchanged_module"]
