"""`torch.compile` of the bound solvers' steps: see `kernels.compile` (shared with `crf/`)."""

from kernels.compile import (
    CompileMode,
    check_mode,
    compiled,
    mark_batch_dynamic,
    should_compile,
    step_function,
)

__all__ = [
    "CompileMode",
    "check_mode",
    "compiled",
    "mark_batch_dynamic",
    "should_compile",
    "step_function",
]
