"""Convex relaxations of elementwise nonlinearities (one file each), on plain tensors.

Importing the package registers every relaxation (`get_relaxation(name, **options)`)."""

from relaxations.abs import AbsRelaxation
from relaxations.base import (
    LinearBounds,
    LinearConstraints,
    MultiLinearBounds,
    MultiLinearConstraints,
    MultiRelaxation,
    Relaxation,
    get_relaxation,
    register,
)
from relaxations.exp import ClippedExpRelaxation, ExpRelaxation
from relaxations.floor import FloorRelaxation
from relaxations.hardtanh import HardtanhRelaxation
from relaxations.leaky_relu import LeakyReluRelaxation
from relaxations.power import PowerRelaxation, SquareRelaxation
from relaxations.product import ProductRelaxation
from relaxations.reciprocal import ReciprocalRelaxation
from relaxations.relu import ReluRelaxation, neuron_status
from relaxations.sigmoid import SigmoidRelaxation
from relaxations.sign import HeavisideRelaxation, SignRelaxation
from relaxations.softmax import SoftmaxRelaxation
from relaxations.tanh import TanhRelaxation
from relaxations.trig import CosRelaxation, SinRelaxation

__all__ = [
    "AbsRelaxation",
    "ClippedExpRelaxation",
    "CosRelaxation",
    "ExpRelaxation",
    "FloorRelaxation",
    "HardtanhRelaxation",
    "HeavisideRelaxation",
    "LeakyReluRelaxation",
    "LinearBounds",
    "LinearConstraints",
    "MultiLinearBounds",
    "MultiLinearConstraints",
    "MultiRelaxation",
    "PowerRelaxation",
    "ProductRelaxation",
    "ReciprocalRelaxation",
    "Relaxation",
    "ReluRelaxation",
    "SigmoidRelaxation",
    "SignRelaxation",
    "SinRelaxation",
    "SoftmaxRelaxation",
    "SquareRelaxation",
    "TanhRelaxation",
    "get_relaxation",
    "neuron_status",
    "register",
]
