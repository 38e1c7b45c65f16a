"""Shared by the kernel tests: the dtypes they run and the Triton availability mark."""

import pytest
import torch

from kernels import backend

DTYPES = [torch.float32, torch.float64]
needs_triton = pytest.mark.skipif(
    not backend.HAS_TRITON or not (backend.INTERPRET or torch.cuda.is_available()),
    reason="needs triton (and TRITON_INTERPRET=1 on CPU)",
)
