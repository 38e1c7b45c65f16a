"""Bound methods by name (the only place strings choose code). Each entry has a frozen config
dataclass and a function `(graph, box, C, config, budget) -> (lower, upper, intervals, stats)`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from bounds.graph import Graph
from bounds.lp import LpConfig, milp, planet_lp
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown, crown_intervals
from bounds.methods.ibp import ibp
from bounds.types import Budget, Interval

MethodResult = tuple[Tensor, Tensor, dict[str, Interval], dict[str, Any]]


@dataclass(frozen=True)
class NoConfig:
    """Methods without options."""


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[Graph, Interval, Tensor, Any, Budget | None], MethodResult]
    config_type: type
    description: str


_METHODS: dict[str, Method] = {}


def register_method(name: str, config_type: type, description: str):
    def wrap(fn):
        _METHODS[name] = Method(name, fn, config_type, description)
        return fn

    return wrap


def get_method(name: str) -> Method:
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def available_methods() -> list[str]:
    return list(_METHODS)


@register_method("ibp", NoConfig, "interval bound propagation")
def _ibp(graph, box, C, config, budget) -> MethodResult:
    return (*ibp(graph, box, C), {})


@register_method("crown", NoConfig, "CROWN / Wong-Kolter backward linear bounds")
def _crown(graph, box, C, config, budget) -> MethodResult:
    return (*crown(graph, box, C), {})


@register_method("alpha-crown", AlphaCrownConfig, "CROWN with optimised slopes (Adam)")
def _alpha_crown(graph, box, C, config, budget) -> MethodResult:
    return alpha_crown(graph, box, C, config, budget)


@register_method("lp", LpConfig, "Planet LP with CROWN intermediate bounds (cvxpy)")
def _lp(graph, box, C, config, budget) -> MethodResult:
    intervals = crown_intervals(graph, box)
    lower, upper, stats = planet_lp(graph, box, C, intervals, config)
    return lower, upper, intervals, {"solves": stats["solves"]}


@register_method("milp", LpConfig, "exact MILP with CROWN big-M bounds (tiny nets)")
def _milp(graph, box, C, config, budget) -> MethodResult:
    intervals = crown_intervals(graph, box)
    lower, upper, stats = milp(graph, box, C, intervals, config)
    return lower, upper, intervals, {"solves": stats["solves"]}
