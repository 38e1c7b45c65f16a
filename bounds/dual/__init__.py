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

# Transitional names for callers outside bounds/dual (verify/relu_bab.py, benchmarks/gpu_check.py,
# benchmarks/compile_cases_bounds.py) until they use `decompose` and `initial_duals`: the same
# functions (the chain form is gone; every graph decomposes).
layered = decompose
crown_duals = initial_duals

__all__ = [
    "Decomposition",
    "DualResult",
    "Duals",
    "Problem",
    "crown_duals",
    "decompose",
    "evaluate",
    "initial_duals",
    "layered",
    "problem_from_intervals",
    "zero_duals",
]
