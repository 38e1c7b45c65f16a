"""Convex relaxations of elementwise nonlinearities (one file each), on plain tensors."""

from relaxations.base import (
    LinearBounds,
    LinearConstraints,
    Relaxation,
    get_relaxation,
    register,
)
from relaxations.product import ProductRelaxation
from relaxations.relu import ReluRelaxation, neuron_status

__all__ = [
    "LinearBounds",
    "LinearConstraints",
    "Relaxation",
    "ReluRelaxation",
    "get_relaxation",
    "neuron_status",
    "register",
]
