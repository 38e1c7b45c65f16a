"""Bound methods by name (the only place strings choose code). Each method registers itself in
its own file (`register_method`, e.g. `bounds/methods/crown.py`), with a frozen config
dataclass, a function `(graph, box, C, config, budget) -> (lower, upper, intervals, stats)` (its
final bounds) and its other capabilities:
- `intermediate`: how it computes intermediate bounds (`IntermediateBounds`);
- `hard_bounder`: it bounds branch-and-bound split domains (of its `relaxation`) as the hard
  bounder of ReLU splitting (`verify.bab.relu.hard_bounder`); `warm_start`: that hard bounder
  returns and takes warm starts;
- `root_intermediate`: it may tighten the root's intermediate bounds in ReLU splitting.
`methods_with(capability)` lists the methods that have one (`CAPABILITIES`). This module
imports no method: `bounds/__init__.py` imports every module of `bounds.methods`, `bounds.dual`
and `bounds.lp`, so a method file is found by being there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from torch import Tensor

from bounds.graph.graph import Graph
from bounds.types import Interval

MethodResult = tuple[Tensor, Tensor, dict[str, Interval], dict[str, Any]]


class IntermediateBounds(Protocol):
    """A bound method's intermediate-bounds capability (`Method.intermediate`): intervals of
    every node on `box` for the specs `C`; `iterations` is a dual solver's budget per layer;
    `given` intervals are intersected in; `deadline` (`time.monotonic()`): every stage stops by
    then, keeping valid intervals; `start`: the intervals a dual solver starts from (and
    intersects with), None to start from `given` as they are."""

    def __call__(
        self, graph: Graph, box: Interval, C: Tensor, iterations: int = 50,
        given: dict[str, Interval] | None = None, deadline: float | None = None,
        start: IntermediateBounds | None = None,
    ) -> dict[str, Interval]: ...  # fmt: skip


@dataclass(frozen=True)
class NoConfig:
    """Methods without options."""


class Relaxation(Enum):
    """The convex relaxation a dual method solves (what a hard bounder of split domains needs
    to know about it)."""

    PLANET = "planet"  # Lagrangian decomposition of the Planet relaxation
    ANDERSON = "anderson"  # the Anderson relaxation (ReLU chains)


CAPABILITIES = ("final", "intermediate", "hard_bounder", "warm_start", "root_intermediate")


@dataclass(frozen=True)
class Method:
    """A registered bound method: `run` its final bounds, `config_type` its frozen options, and
    its capabilities (module docstring): `intermediate` (None: it gives no intermediate bounds
    of its own), `hard_bounder`, `warm_start` and `root_intermediate`; `relaxation`: the
    relaxation a dual method solves (None for the others)."""

    name: str
    run: Callable[..., MethodResult]  # (graph, box, C, config, budget, given, exact)
    config_type: type
    description: str
    intermediate: IntermediateBounds | None = None
    hard_bounder: bool = False
    warm_start: bool = False
    root_intermediate: bool = False
    relaxation: Relaxation | None = None

    def can(self, capability: str) -> bool:
        """Whether the method has `capability` (one of `CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; one of {CAPABILITIES}")
        if capability == "final":
            return True
        return bool(getattr(self, capability))


_METHODS: dict[str, Method] = {}


def register_method(
    name: str, config_type: type, description: str, *,
    intermediate: IntermediateBounds | None = None, hard_bounder: bool = False,
    warm_start: bool = False, root_intermediate: bool = False,
    relaxation: Relaxation | None = None,
) -> Callable[[Callable[..., MethodResult]], Callable[..., MethodResult]]:  # fmt: skip
    """Register the method `name` (its run function decorated) with its config and
    capabilities."""

    def wrap(fn: Callable[..., MethodResult]) -> Callable[..., MethodResult]:
        _METHODS[name] = Method(
            name, fn, config_type, description, intermediate, hard_bounder, warm_start,
            root_intermediate, relaxation,
        )  # fmt: skip
        return fn

    return wrap


def unregister_method(name: str) -> None:
    """Remove the method `name` (e.g. one a test registered); KeyError if it is not there."""
    del _METHODS[name]


def get_method(name: str) -> Method:
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def available_methods() -> list[str]:
    return list(_METHODS)


def methods_with(capability: str) -> tuple[str, ...]:
    """The names of the methods that have `capability` (`CAPABILITIES`), in registration
    order."""
    return tuple(name for name, method in _METHODS.items() if method.can(capability))


def intermediate_intervals(
    graph: Graph, box: Interval, C: Tensor, kind: str, iterations: int = 50,
    given: dict[str, Interval] | None = None, deadline: float | None = None,
    start: str = "alpha-crown",
) -> dict[str, Interval]:  # fmt: skip
    """Intervals of every node by the intermediate-bounds capability of the method `kind`
    (`IntermediateBounds`); `iterations` is the decomposition solvers' budget per layer;
    `given` intervals are intersected in; `deadline` (`time.monotonic()`): every stage stops by
    then, keeping valid intervals. The dual solvers start from (and intersect with) the
    intervals of `start`: "alpha-crown" (`IntermediateBounds`) or "crown" (for `given`
    intervals that are alpha-CROWN's already)."""
    if start not in ("crown", "alpha-crown"):
        raise ValueError(f"start must be 'crown' or 'alpha-crown', got {start!r}")
    capable = methods_with("intermediate")
    if kind not in capable:
        raise ValueError(f"intermediate must be one of {capable}, got {kind!r}")
    begin = None if start == "crown" else get_method(start).intermediate
    compute = get_method(kind).intermediate
    return compute(graph, box, C, iterations, given, deadline, begin)
