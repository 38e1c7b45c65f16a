"""Public API: sound bounds (`bounds`), complete verification (`verify`, with proof certificates
checked by `check_certificate`), certified activation monitors against silent data corruption
(`monitor`), model and specification loading, errors."""

from bounds.types import Bounds, Budget, Interval
from verify.api import bounds, network_graph
from verify.attack import find_counterexample
from verify.bab import BabConfig
from verify.certificate import CheckResult, check_certificate
from verify.errors import (
    InvalidNetworkError,
    InvalidRegionError,
    ShapeMismatchError,
    SpecificationError,
    UnsupportedOperationError,
    VerificationInputError,
)
from verify.io.onnx_loader import load_onnx
from verify.io.vnnlib_load import load_vnnlib
from verify.monitor import Ball, Box, Monitor, MonitorMismatchError
from verify.monitor.api import monitor  # after the package: `verify.monitor` is the function
from verify.result import VerificationResult
from verify.verifier import verify

__all__ = [
    "BabConfig",
    "Ball",
    "Bounds",
    "Box",
    "Budget",
    "CheckResult",
    "Interval",
    "InvalidNetworkError",
    "InvalidRegionError",
    "Monitor",
    "MonitorMismatchError",
    "ShapeMismatchError",
    "SpecificationError",
    "UnsupportedOperationError",
    "VerificationInputError",
    "VerificationResult",
    "bounds",
    "check_certificate",
    "find_counterexample",
    "load_onnx",
    "load_vnnlib",
    "monitor",
    "network_graph",
    "verify",
]
