"""Bound computation: network graph, layer operators, bound methods, exact LP/MILP references.

Every module of `bounds.methods`, `bounds.dual` and `bounds.lp` is imported here, so a bound
method registers itself (`bounds.registry.register_method`) by being a file there."""

import importlib
import pkgutil

from bounds import dual, lp, methods
from bounds.graph.graph import Graph, Node, build_graph
from bounds.registry import available_methods, get_method
from bounds.types import Bounds, Budget, Interval

for _package in (methods, dual, lp):
    for _module in pkgutil.walk_packages(_package.__path__, _package.__name__ + "."):
        importlib.import_module(_module.name)

__all__ = [
    "Bounds",
    "Budget",
    "Graph",
    "Interval",
    "Node",
    "available_methods",
    "build_graph",
    "get_method",
]
