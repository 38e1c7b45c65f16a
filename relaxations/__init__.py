"""Convex relaxations of elementwise nonlinearities (one file each), on plain tensors.

Importing the package imports every module in it (found by `pkgutil.iter_modules`), so each
relaxation registers itself, with its torch and ONNX spellings (`relaxations.registry`);
`get_relaxation(name, **options)` instantiates one."""

import importlib
import pkgutil

from relaxations.base import (
    LinearBounds,
    LinearConstraints,
    MultiLinearBounds,
    MultiLinearConstraints,
    MultiRelaxation,
    Relaxation,
)
from relaxations.registry import (
    available_relaxations,
    get_relaxation,
    register,
    unregister,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "LinearBounds",
    "LinearConstraints",
    "MultiLinearBounds",
    "MultiLinearConstraints",
    "MultiRelaxation",
    "Relaxation",
    "available_relaxations",
    "get_relaxation",
    "register",
    "unregister",
]
