"""Public API: sound bounds (`bounds`), model and specification loading, errors."""

from bounds.types import Bounds, Budget, Interval
from verify.api import bounds, network_graph
from verify.errors import (
    InvalidNetworkError,
    InvalidRegionError,
    ShapeMismatchError,
    SpecificationError,
    UnsupportedOperationError,
    VerificationInputError,
)
from verify.onnx_loader import load_onnx
from verify.vnnlib import load_vnnlib

__all__ = [
    "Bounds",
    "Budget",
    "Interval",
    "InvalidNetworkError",
    "InvalidRegionError",
    "ShapeMismatchError",
    "SpecificationError",
    "UnsupportedOperationError",
    "VerificationInputError",
    "bounds",
    "load_onnx",
    "load_vnnlib",
    "network_graph",
]
