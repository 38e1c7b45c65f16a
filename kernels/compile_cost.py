"""Whether a compiled step's call would compile, and how long a compile takes: so that a step
is never compiled when the compile is predicted to end past the caller's deadline (it runs
eagerly instead, `kernels.compile.step_function`). A first compile is seconds to tens of
seconds (Dynamo's trace, Inductor's code generation and build); on the H200 branch and bound
with 30 s limits ended 1-15 s late, the time in first compiles of the alpha/beta-CROWN steps.

Predicted seconds of a step's compile: this process's own measurement once it has compiled the
step (the longest seen), else a prior per device type (`COMPILE_PRIOR_S`, the measurements
named there), plus `STARTUP_PRIOR_S` while the process has compiled nothing (Inductor's
imports and the first `torch.compile` wrapper). A compile can still take longer than predicted
(a larger network than the measured ones): the priors are the largest measured figures.

Whether a call compiles: Dynamo compiles when no cached graph's guards accept the arguments.
`call_signature` is a conservative stand-in for those guards (every tensor's dtype, device,
shape, contiguity and requires_grad, every Python scalar's value, the structure of the objects
around them, grad mode and the kernel backend mode); the batch dimension counts only as 0, 1
or more where it is marked dynamic (`mark_batch_dynamic`), as Dynamo treats it, until the step
compiles again for a signature it had compiled (it specialised on the batch size: exact sizes
from then on). A signature is recorded when a call compiled (Dynamo's graph counter moved), so
an unrecorded one may still be cached: it then runs eagerly near a deadline, never the reverse
(`torch._dynamo.reset()` forgets graphs but not these records: tests swap in a new backend).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels import backend as kernel_backend

# Seconds of a step's first compile (the first call of its compiled wrapper: Dynamo, Inductor,
# one step), by device type and `step_key`; unlisted steps take the device's largest figure.
COMPILE_PRIOR_S: dict[str, dict[str, float]] = {
    # H200, torch 2.11 (benchmarks/results/gpu_check_h200*.txt, `compile_s` of the steps part,
    # cifar_wide-shaped net, 1,024 domains x 9 specs; the largest of 3 runs: 3.0 / 5.0 / 10.9 s,
    # 8.1 / 9.3 / 10.5 s, 14.0 / 17.1 / 17.3 s).
    "cuda": {
        "bounds.dual.proximal.sweep_step": 10.9,
        "bounds.dual.supergradient.ascent_step": 10.5,
        "bounds.methods.alpha_crown.alpha_step": 17.3,
        # the dense-CRF steps: gpu_check_h200_2026-12-04.txt, `first_s` of the compiled mode
        # (512 x 512, 21 labels; one run, after the process's other compiles)
        "crf.solvers.meanfield.step": 1.3,
        "crf.solvers.qp_frank_wolfe.fw_step": 2.1,
        "crf.solvers.dc_neg.dc_step": 2.0,
        "crf.solvers.lp_proximal.dual_pass": 9.3,
        "crf.solvers.lp_proximal.primal_step": 0.4,
    },
    # benchmarks/results/compile_bench.txt (`cold_s`, one thread, empty Inductor cache; the
    # larger of ACAS Xu and mnist_fc).
    "cpu": {
        "bounds.dual.proximal.sweep_step": 21.2,
        "bounds.dual.proximal.anchor_step": 15.5,
        "bounds.dual.supergradient.ascent_step": 15.6,
        "bounds.methods.alpha_crown.alpha_step": 35.6,
        # the dense-CRF steps (256 x 256, 21 labels)
        "crf.solvers.meanfield.step": 9.8,
        "crf.solvers.qp_frank_wolfe.fw_step": 8.2,
        "crf.solvers.dc_neg.dc_step": 7.9,
        "crf.solvers.lp_proximal.dual_pass": 20.9,
        "crf.solvers.lp_proximal.primal_step": 4.1,
    },
}
# The first compile of a process also imports Inductor: compile_bench.txt's `startup_s` (12.0 s
# on the CPU machine; host work, so taken for CUDA machines too, where it has no measurement).
STARTUP_PRIOR_S = 12.0
# ... and Dynamo itself when nothing has imported it yet (`import verify` no longer does):
# `python -X importtime -c "import torch._dynamo"` here, 3.1 s.
DYNAMO_IMPORT_S = 3.1


@dataclass
class StepRecord:
    """What this process knows of one step's compiles under one backend: the signatures it
    compiled, the longest compile measured, and whether batch sizes count exactly."""

    ready: set[Hashable] = field(default_factory=set)
    measured_s: float | None = None
    exact: bool = False


_RECORDS: dict[tuple[str, Hashable], StepRecord] = {}


def step_key(step: Callable) -> str:
    """`module.qualname` of a step function (the key of `COMPILE_PRIOR_S`)."""
    return f"{step.__module__}.{step.__qualname__}"


def record(step: Callable, backend: Hashable) -> StepRecord:
    """The step's record under `backend` (created empty)."""
    return _RECORDS.setdefault((step_key(step), backend), StepRecord())


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process (its `unique_graphs` counter; 0 while Dynamo
    is not loaded: importing it costs about 3 s, which `import verify` no longer pays)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else utils.counters["stats"]["unique_graphs"]


def predicted_seconds(step: Callable, backend: Hashable, device_type: str) -> float:
    """Seconds a compile of `step` is predicted to take now (module docstring)."""
    measured = record(step, backend).measured_s
    if measured is not None:
        return measured
    priors = COMPILE_PRIOR_S.get(device_type, COMPILE_PRIOR_S["cpu"])
    prior = priors.get(step_key(step), max(priors.values()))
    startup = 0.0 if graphs_compiled() else STARTUP_PRIOR_S
    return prior + startup + (0.0 if "torch._dynamo" in sys.modules else DYNAMO_IMPORT_S)


def note_compile(rec: StepRecord, signature: Callable[[bool], Hashable], seconds: float) -> None:
    """Record a call that compiled: its signature (`signature(exact)`), and its seconds. A
    signature already recorded means the step specialised beyond it: exact sizes from now."""
    key = signature(rec.exact)
    if key in rec.ready and not rec.exact:
        rec.exact = True
        key = signature(True)
    rec.ready.add(key)
    rec.measured_s = seconds if rec.measured_s is None else max(rec.measured_s, seconds)


def device_type(tree: Any) -> str | None:
    """The device type of the first tensor in nested tuples / lists / dicts (None if none)."""
    if isinstance(tree, torch.Tensor):
        return tree.device.type
    if isinstance(tree, dict):
        tree = tuple(tree.values())
    if isinstance(tree, (tuple, list)):
        for item in tree:
            found = device_type(item)
            if found is not None:
                return found
    return None


_SCALARS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)


def call_signature(args: tuple, kwargs: dict, exact: bool, memo: dict[int, tuple]) -> Hashable:
    """The stand-in for Dynamo's guards (module docstring). `memo` keeps the signatures of
    the non-container objects seen (id -> (object, signature)): the caller's problem and graph,
    fixed while one solver call runs, are walked once."""
    state = (torch.is_grad_enabled(), kernel_backend.backend_mode())
    items = tuple(sorted(kwargs.items()))
    return state, _signature(args, exact, memo), _signature(items, exact, memo)


def _signature(x: Any, exact: bool, memo: dict[int, tuple]) -> Hashable:
    if isinstance(x, torch.Tensor):
        return _tensor_signature(x, exact)
    if isinstance(x, _SCALARS):
        return type(x), x
    if isinstance(x, (tuple, list)):
        return type(x), tuple(_signature(item, exact, memo) for item in x)
    if isinstance(x, dict):
        return dict, tuple((_signature(k, exact, memo), _signature(v, exact, memo)) for k, v in x.items())  # fmt: skip
    seen = memo.get(id(x))
    if seen is not None and seen[0] is x:
        return seen[1]
    memo[id(x)] = (x, ("cycle", type(x)))  # an object reached again while it is walked
    signature = type(x), _object_signature(x, exact, memo)
    memo[id(x)] = (x, signature)
    return signature


def _object_signature(x: Any, exact: bool, memo: dict[int, tuple]) -> Hashable:
    """A dataclass by its fields, another object by its attributes, a function by its name."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        values = tuple((f.name, getattr(x, f.name)) for f in dataclasses.fields(x))
    elif callable(x) and hasattr(x, "__qualname__"):
        return getattr(x, "__module__", None), x.__qualname__
    elif hasattr(x, "__dict__"):
        values = tuple(sorted(vars(x).items()))
    else:
        return ()
    return tuple((name, _signature(value, exact, memo)) for name, value in values)


def _tensor_signature(t: torch.Tensor, exact: bool) -> Hashable:
    """Dtype, device, requires_grad, contiguity and shape; dimension 0 as 0, 1 or "many" where
    it is marked dynamic (`torch._dynamo.maybe_mark_dynamic` keeps the marks in this attribute;
    without it, exact sizes)."""
    shape: tuple = tuple(t.shape)
    dynamic = getattr(t, "_dynamo_weak_dynamic_indices", ())
    if not exact and shape and 0 in dynamic and shape[0] > 1:
        shape = ("many", *shape[1:])
    return t.dtype, t.device, t.requires_grad, t.is_contiguous(), shape
