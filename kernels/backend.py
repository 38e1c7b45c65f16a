"""Which implementation the dispatching kernel functions run: Triton or the torch reference.

Every kernel file in this package exposes ``name(...)``, which checks shapes and dtypes and then
runs either its Triton kernel (through a ``torch.library`` custom op, so compiled code can call
it) or ``name_reference(...)`` in plain torch. The choice, per call:

- an explicit ``use_triton=True / False`` argument wins;
- otherwise the backend mode: ``"auto"`` (Triton for CUDA tensors, the reference elsewhere),
  ``"triton"`` (always Triton: on CPU tensors this needs ``TRITON_INTERPRET=1`` set before the
  kernel modules are imported, the Triton interpreter) or ``"reference"`` (never Triton).

The mode starts from the environment variable ``LDVERIFY_KERNELS`` (default ``"auto"``) and can
be changed with :func:`kernel_backend`. Triton is optional: without it, ``"auto"`` always picks
the reference and ``use_triton=True`` raises a clear error.
"""

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference path needs no Triton
    triton = None
    tl = SimpleNamespace(constexpr=None)  # kernel signatures only read ``tl.constexpr``

__all__ = [
    "ENV_VAR",
    "HAS_TRITON",
    "INTERPRET",
    "MODES",
    "backend_mode",
    "cdiv",
    "jit",
    "kernel_backend",
    "next_power_of_2",
    "tl",
    "triton",
    "use_triton",
]

ENV_VAR = "LDVERIFY_KERNELS"
MODES = ("auto", "triton", "reference")
HAS_TRITON = triton is not None
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # read by triton.jit at decoration


def _mode_from_env() -> str:
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {MODES}, got {mode!r}")
    return mode


_MODE = _mode_from_env()


def jit(fn: Callable[..., Any]) -> Any:
    """``triton.jit`` when Triton is installed; otherwise the plain function (never launched)."""
    return triton.jit(fn) if HAS_TRITON else fn


def backend_mode() -> str:
    """The current mode: ``"auto"``, ``"triton"`` or ``"reference"``."""
    return _MODE


@contextmanager
def kernel_backend(mode: str) -> Iterator[None]:
    """Temporarily set the backend mode (compiled functions recompile when it changes)."""
    global _MODE
    if mode not in MODES:
        raise ValueError(f"kernel backend must be one of {MODES}, got {mode!r}")
    old, _MODE = _MODE, mode
    try:
        yield
    finally:
        _MODE = old


def use_triton(x: torch.Tensor, override: bool | None = None) -> bool:
    """Whether a kernel called on tensor ``x`` runs Triton (see the module docstring)."""
    if override is None:
        wanted = _MODE == "triton" or (_MODE == "auto" and x.is_cuda and HAS_TRITON)
    else:
        wanted = bool(override)
    if wanted and not HAS_TRITON:
        raise RuntimeError("the Triton kernel path was requested but triton is not installed")
    if wanted and not x.is_cuda and not INTERPRET:
        raise RuntimeError(
            "Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before the kernel "
            "modules are imported (the Triton interpreter)"
        )
    return wanted


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-int(a) // int(b))
