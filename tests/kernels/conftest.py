"""Kernel tests build their tensors with the default device: the CPU here (Triton's
interpreter, set in tests/conftest.py), CUDA where a GPU is present, so that the same tests
check the compiled kernels there (the interpreter cannot be on beside real CUDA kernels).
Seeded data is made on the CPU and moved (`tests.kernels.cpu_generated`): CUDA refuses a CPU
`torch.Generator`, and the same seeds then give the same data on both machines."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _kernel_device():
    if not torch.cuda.is_available():
        yield
        return
    previous = torch.get_default_device()
    torch.set_default_device("cuda")
    try:
        yield
    finally:
        torch.set_default_device(previous)
