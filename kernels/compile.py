"""`torch.compile` of solver steps (bound solvers and dense-CRF solvers alike): when to compile,
one compiled wrapper per step function, and the batch dimension marked dynamic so that branch
and bound does not recompile per batch. (Here rather than in `bounds/` so that `crf/`, which
may not import `bounds/`, shares it.)

Each solver iteration is a pure `step(problem, state, ...) -> state` function over tensors
(NamedTuples of tensors); the Python loop around it keeps the budget checks, so the compiled
region has no data-dependent control flow and compiles once (Dynamo unrolls loops, so we
compile the step, never the loop). Python scalars that change between iterations (step sizes,
eta) are passed as 0-d tensors: a changing float would recompile once per value.

A process that bounds many different networks needs a graph per architecture: the recompile
limit is raised to `RECOMPILE_LIMIT` for these steps, and a step whose compile fails (any
Dynamo error) warns once and runs eagerly from then on: compiling is never a reason to fail.

`compile="auto"` compiles on CUDA, and on CPU only the steps whose measured CPU speed-up is
positive (`benchmarks/compile_bench.py`): Inductor's C++ code pays on elementwise-heavy steps,
not on matmul-bound ones, and a cold compile costs seconds.

A solver passes its deadline to `step_function`: a call that would compile runs eagerly when
the compile is predicted to end past it (`kernels.compile_cost`), so that a limit holds.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from kernels import compile_cost

CompileMode = bool | str

BACKEND: Any = "inductor"  # tests swap in a counting backend
RECOMPILE_LIMIT = 64  # graphs per step: one per network architecture (and spec count) seen
_COMPILED: dict[tuple[Callable, Any], Callable] = {}
_FAILED: set[Callable] = set()  # steps whose compile failed: eager for the rest of the process


def _compile_errors() -> tuple[type[BaseException], ...]:
    """Dynamo's exceptions that mean "run this step eagerly" (looked up when one is raised:
    touching `torch._dynamo` at import costs about 3 s)."""
    names = ("TorchDynamoException", "FailOnRecompileLimitHit")
    return tuple(getattr(torch._dynamo.exc, n) for n in names if hasattr(torch._dynamo.exc, n))


def check_mode(mode: CompileMode, error: type[Exception] = ValueError) -> CompileMode:
    """Validate a `compile=` option: True, False or "auto" (else raise `error`)."""
    if not (mode is True or mode is False or mode == "auto"):
        raise error(f"compile must be True, False or 'auto', got {mode!r}")
    return mode


def should_compile(
    mode: CompileMode, device: torch.device, cpu_default: bool = False,
    error: type[Exception] = ValueError,
) -> bool:  # fmt: skip
    """Resolve `compile=`: "auto" is on for CUDA and `cpu_default` (measured) on CPU."""
    check_mode(mode, error)
    if mode == "auto":
        return device.type == "cuda" or cpu_default
    return bool(mode)


def compiled(step: Callable) -> Callable:
    """The `torch.compile(step, fullgraph=True)` wrapper, created once per function (Dynamo's
    cache lives on the code object, so every caller shares the compiled graphs)."""
    key = (step, BACKEND)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(step, fullgraph=True, backend=BACKEND)
    return _COMPILED[key]


def mark_batch_dynamic(tree: Any) -> None:
    """Mark dimension 0 (the batch of domains) of every tensor in `tree` (tensors, nested
    tuples/lists/NamedTuples) dynamic, so that a new batch size does not recompile; sizes 0/1
    stay specialised (`maybe_mark_dynamic`). Pass only tensors whose dimension 0 is the batch."""
    for t in _tensors(tree):
        if t.dim() > 0:
            torch._dynamo.maybe_mark_dynamic(t, 0)


def _malformed(tree: Any) -> bool:
    """A NamedTuple (at any depth of tuples) with fewer items than fields: seen from compiled
    steps that used `_replace` on torch 2.11 with CUDA (the steps now call the constructor)."""
    if not isinstance(tree, tuple):
        return False
    fields = getattr(type(tree), "_fields", None)
    if fields is not None and tuple.__len__(tree) != len(fields):
        return True
    return any(_malformed(item) for item in tuple.__iter__(tree))


def _tensors(tree: Any):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            yield from _tensors(item)


def step_function(
    step: Callable, use_compiled: bool, dynamic_batch: bool = True, deadline: float | None = None
) -> Callable:
    """`step` itself, or its compiled wrapper (eager fallback on a failed compile); with
    `dynamic_batch` the returned state has its batch dimension (0) marked dynamic again
    (outputs of a compiled call carry no marks, and the next step would otherwise specialise
    on the batch size). `deadline` (`time.monotonic()`; None or inf: none): a call that would
    compile runs eagerly instead when the compile is predicted to end past it
    (`kernels.compile_cost`): a first compile takes seconds, and no limit may be passed."""
    if not use_compiled:
        return step
    return CompiledStep(step, dynamic_batch, deadline)


class CompiledStep:
    """A step run through its compiled wrapper, or eagerly: after a failed compile, and for
    a call that would compile with less time left before `deadline` than the compile is
    predicted to take (`eager_calls` counts those)."""

    def __init__(self, step: Callable, dynamic_batch: bool, deadline: float | None) -> None:
        self.step, self.dynamic_batch, self.deadline = step, dynamic_batch, deadline
        self.eager_calls = 0
        self._fn: Callable | None = None  # made at the first compiled call (0.9 s, measured
        # here for the first torch.compile of a process): not made for eager calls
        self._memo: dict[int, tuple] = {}  # signatures of the objects of this solver call
        self._device: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.step in _FAILED:
            return self.step(*args, **kwargs)
        rec = compile_cost.record(self.step, BACKEND)
        if not self._may_compile(rec, args, kwargs):
            self.eager_calls += 1
            return self.step(*args, **kwargs)
        if self._fn is None:
            self._fn = compiled(self.step)
        graphs, tick = compile_cost.graphs_compiled(), time.monotonic()
        try:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                out = self._fn(*args, **kwargs)
        except _compile_errors() as error:
            cause = (str(error).strip().splitlines() or [""])[0][:300]
            return self._fallback(f"{type(error).__name__}: {cause}", args, kwargs)
        if compile_cost.graphs_compiled() > graphs:
            signature = lambda exact: self._signature(args, kwargs, exact)  # noqa: E731
            compile_cost.note_compile(rec, signature, time.monotonic() - tick)
        if _malformed(out):
            return self._fallback("it returned a malformed NamedTuple", args, kwargs)
        if self.dynamic_batch:
            mark_batch_dynamic(out)
        return out

    def _may_compile(self, rec: compile_cost.StepRecord, args: tuple, kwargs: dict) -> bool:
        """Whether the compiled wrapper may be called: always without a deadline or with more
        time left than a compile is predicted to take; otherwise only for a signature this
        process has compiled (no compile then). Host clock only, no device sync."""
        if self.deadline is None:
            return True
        if self._device is None:
            self._device = compile_cost.device_type((args, kwargs)) or "cpu"
        left = self.deadline - time.monotonic()
        if left >= compile_cost.predicted_seconds(self.step, BACKEND, self._device):
            return True
        return self._signature(args, kwargs, rec.exact) in rec.ready

    def _signature(self, args: tuple, kwargs: dict, exact: bool):
        return compile_cost.call_signature(args, kwargs, exact, self._memo)

    def _fallback(self, reason: str, args: tuple, kwargs: dict) -> Any:
        _FAILED.add(self.step)
        warnings.warn(
            f"torch.compile of {self.step.__name__} failed ({reason}); running it eagerly from "
            "now on in this process",
            RuntimeWarning,
            stacklevel=3,
        )
        return self.step(*args, **kwargs)
