"""``torch.compile`` of the CRF solver steps: when to compile, one compiled wrapper per step.

Each solver iteration is a pure function of the model and tensors (``step(model, *state) ->
state``); the Python loop around it keeps the budget checks, early stopping and rounding, so the
compiled region has no data-dependent control flow (Dynamo unrolls loops, so we compile the
step, never the loop). Scalars that change between iterations (the proximal LP's momentum) are
passed as 0-d tensors: a changing Python float would recompile once per value. Inside compiled
code the lattice filtering runs the index-based splat / blur / slice of
:mod:`kernels.lattice_filter` (Triton on CUDA, torch references that Inductor compiles on CPU).

``compile="auto"`` compiles on CUDA; on CPU only the steps whose solver config says so
(``cpu_compile_default``). The first call of a compiled step pays the compile, a new image size
recompiles once (the sizes then go dynamic), and a call on the same shapes reuses it. On CPU
(``benchmarks/results/compile_bench.txt``, 256 x 256, 21 labels, one thread) the compiled steps
are faster per step (1.1-2.2x), but a step's compile (0.2-1 s on a warm Inductor cache, 4-21 s
cold, plus 12-26 s of imports at a process's first compile on the measuring machine) is not
repaid within one default solver call (only the QP's 100 iterations repay a warm-cache compile,
and not with the imports), so every ``cpu_compile_default`` is False: "auto" never makes a
default CPU call slower. Pass ``compile=True`` for long runs or many calls on same-sized images.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from crf.errors import ConfigError
from kernels.compile import CompileMode, compiled
from kernels.compile import check_mode as _check_mode
from kernels.compile import should_compile as _should_compile
from kernels.compile import step_function as _step_function

__all__ = ["CompileMode", "check_mode", "compiled", "should_compile", "step_function"]


def check_mode(mode: CompileMode) -> CompileMode:
    """Validate a ``compile=`` option: True, False or "auto" (else ConfigError)."""
    return _check_mode(mode, ConfigError)


def should_compile(mode: CompileMode, device: torch.device, cpu_default: bool = False) -> bool:
    """Resolve ``compile=``: "auto" is on for CUDA and ``cpu_default`` (measured) elsewhere."""
    return _should_compile(mode, device, cpu_default, ConfigError)


def step_function(step: Callable, use_compiled: bool, deadline: float | None = None) -> Callable:
    """``step`` itself or its compiled wrapper (shared cache and eager fallback on a failed
    compile: :func:`kernels.compile.step_function`; CRF states have no batch dimension). A
    call that would compile runs eagerly when the compile is predicted to end past
    ``deadline`` (``time.monotonic()``; the solver's seconds budget)."""
    return _step_function(step, use_compiled, dynamic_batch=False, deadline=deadline)
