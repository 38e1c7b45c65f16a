"""Typed errors raised on bad input. Each message says what is wrong and where."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class VerificationInputError(ValueError):
    """Base class of every input error raised by this toolkit."""


class UnsupportedOperationError(VerificationInputError):
    """A network contains an operation we cannot bound (names the operation and the node)."""

    def __init__(self, operation: str, node: str, detail: str = "") -> None:
        self.operation = operation
        self.node = node
        msg = f"unsupported operation {operation!r} at node {node!r}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class InvalidNetworkError(VerificationInputError):
    """NaN/Inf weights, non-constant weights, or a malformed graph."""


class ShapeMismatchError(VerificationInputError):
    """Shapes of the input region, the specification and the network disagree."""


class InvalidRegionError(VerificationInputError):
    """A negative/NaN eps, lower > upper, or an empty input box."""


class IndexOutOfTableError(InvalidRegionError):
    """An embedding index whose domain reaches outside its table's rows `[0, rows - 1]` (names
    the lookup node, the index interval and the table's size; `bounds.ops.embedding`)."""


class InvalidLimitError(VerificationInputError):
    """A time limit, budget or count that is NaN, negative, zero where it must be positive, or not a
    number (names the limit and its value)."""


def at_node(operation: str, node: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, with a relaxation's ValueError (a box outside its function's domain, e.g.
    a reciprocal's input interval containing 0, or no finite line: an overflow) raised as
    UnsupportedOperationError naming the operation and the node."""
    try:
        return fn(*args)
    except VerificationInputError:
        raise
    except ValueError as exc:
        raise UnsupportedOperationError(operation, node, str(exc)) from exc
