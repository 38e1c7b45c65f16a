"""Lagrangian-decomposition duals (Bunel, De Palma et al., UAI 2020) on any DAG of BoundOps: the
decomposition and its oracle, supergradient and proximal solvers, and the warm-start API for
branch and bound."""

from bounds.dual.anytime import DualResult
from bounds.dual.dag import Decomposition, decompose
from bounds.dual.decomposition import (
    Problem,
    evaluate,
    initial_duals,
    problem_from_intervals,
    zero_duals,
)
from bounds.dual.duals import Duals

__all__ = [
    "Decomposition",
    "DualResult",
    "Duals",
    "Problem",
    "decompose",
    "evaluate",
    "initial_duals",
    "problem_from_intervals",
    "zero_duals",
]
