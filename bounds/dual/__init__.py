"""Lagrangian-decomposition duals (Bunel, De Palma et al., UAI 2020): the decomposition and its
oracle, supergradient and proximal solvers, and the warm-start API for branch and bound."""

from bounds.dual.anytime import DualResult
from bounds.dual.decomposition import (
    Problem,
    crown_duals,
    evaluate,
    problem_from_intervals,
    zero_duals,
)
from bounds.dual.duals import Duals
from bounds.dual.layers import LayeredNet, layered

__all__ = [
    "DualResult",
    "Duals",
    "LayeredNet",
    "Problem",
    "crown_duals",
    "evaluate",
    "layered",
    "problem_from_intervals",
    "zero_duals",
]
