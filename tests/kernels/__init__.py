"""Shared by the kernel tests: the dtypes they run, the Triton availability mark, and seeded
data made on the CPU whatever the default device (CUDA on a GPU machine, see conftest.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch

from kernels import backend

DTYPES = [torch.float32, torch.float64]
needs_triton = pytest.mark.skipif(
    not backend.HAS_TRITON or not (backend.INTERPRET or torch.cuda.is_available()),
    reason="needs triton (and TRITON_INTERPRET=1 on CPU)",
)

T = TypeVar("T")


def to_device(tree: T, device: torch.device | str) -> T:
    """`tree` (a tensor, or tuples / lists of them and of other values) with every tensor on
    `device`."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, (tuple, list)):
        return type(tree)(to_device(item, device) for item in tree)
    return tree


def cpu_generated(make: Callable[..., T]) -> Callable[..., T]:
    """Decorator of a seeded data builder: it runs with the CPU as the default device (its
    `torch.Generator()` is a CPU one, which CUDA refuses for CUDA tensors: "Expected a 'cuda'
    device type for generator"), and the tensors it returns move to `device=` (keyword; default:
    the default device at the call). The same seed thus gives the same numbers on every machine,
    and a GPU run checks the kernels on the data the CPU runs check."""

    @functools.wraps(make)
    def wrapper(*args: Any, device: torch.device | str | None = None, **kwargs: Any) -> T:
        target = torch.get_default_device() if device is None else device
        with torch.device("cpu"):
            out = make(*args, **kwargs)
        return to_device(out, target)

    return wrapper
