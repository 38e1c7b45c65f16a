"""Bound computation: network graph, layer operators, bound methods, exact LP/MILP references."""

from bounds.graph.graph import Graph, Node, build_graph
from bounds.registry import available_methods, get_method
from bounds.types import Bounds, Budget, Interval

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
