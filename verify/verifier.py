"""`verify.verify`: decide a VNN-LIB property by attack, then branch and bound (input splitting
for few inputs, ReLU splitting otherwise; see `verify.bab.splitting_mode`).

Answers: "unsat" (the property holds: every region's domains were pruned by sound bounds),
"sat" (a counterexample validated by a float64 forward pass), "timeout" (the time limit came
first) or "unknown" (interrupted, a domain limit, or an unsupported specification).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor, nn

from verify.attack import AttackConfig, find_counterexample, validate
from verify.bab import BabConfig, solve_region
from verify.onnx_loader import load_onnx
from verify.vnnlib import VnnlibProperty, load_vnnlib

STATUSES = ("unsat", "sat", "unknown", "timeout")


@dataclass(frozen=True)
class VerificationResult:
    """status: one of `STATUSES`; counterexample: `(x [n_in], y [n_out])` float64 when "sat";
    seconds: wall time; stats: per-region branch-and-bound counters."""

    status: str
    counterexample: tuple[Tensor, Tensor] | None = None
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if (self.status == "sat") != (self.counterexample is not None):
            raise ValueError("a counterexample is given exactly when the status is 'sat'")

    def results_text(self) -> str:
        """The VNN-COMP results file: the status, and for "sat" the assignment
        `((X_0 v)\\n (X_1 v)\\n ... (Y_0 v)\\n ...)`."""
        if self.counterexample is None:
            return f"{self.status}\n"
        x, y = self.counterexample
        pairs = [f"(X_{i} {float(v)!r})" for i, v in enumerate(x.reshape(-1).tolist())]
        pairs += [f"(Y_{i} {float(v)!r})" for i, v in enumerate(y.reshape(-1).tolist())]
        return "sat\n(" + "\n ".join(pairs) + ")\n"


def _load(net: nn.Module | str | os.PathLike, spec) -> tuple[nn.Module, VnnlibProperty]:
    if isinstance(net, (str, os.PathLike)):
        net = load_onnx(net)
    if isinstance(spec, (str, os.PathLike)):
        spec = load_vnnlib(spec)
    if not isinstance(spec, VnnlibProperty):
        raise TypeError(f"spec must be a VnnlibProperty or a path, got {type(spec).__name__}")
    return net, spec


def _attack_all(net, spec: VnnlibProperty, config: AttackConfig, seed: int):
    """A validated `(x, y)` from a PGD attack on any region, or None."""
    for region in spec.regions:
        x = find_counterexample(net, region, config=config, seed=seed)
        if x is not None:
            return validate(net, region, x)
    return None


def verify(
    net: nn.Module | str | os.PathLike,
    spec: VnnlibProperty | str | os.PathLike,
    *,
    timeout: float = 60.0,
    method: str = "crown",
    config: BabConfig | None = None,
    splitting: str | None = None,
    seed: int = 0,
) -> VerificationResult:
    """Decide `spec` on `net` within `timeout` seconds (the budget starts at the call).

    `method`: the bound method for every domain of input splitting (`config.method` is
    replaced by it; the rest of `config` defaults to `BabConfig()`); ReLU splitting bounds its
    domains by alpha-beta-CROWN. `splitting`: "auto", "input" or "relu" (replaces
    `config.splitting` when given). The network runs in its own dtype and device;
    counterexamples are checked in float64 on the CPU.
    """
    start = time.monotonic()
    deadline = start + timeout
    config = replace(config or BabConfig(), method=method)
    if splitting is not None:
        config = replace(config, splitting=splitting)
    stats: dict[str, Any] = {"regions": []}
    status, found = "unknown", None
    try:
        net, spec = _load(net, spec)
        net.eval()
        found = _attack_all(net, spec, config.attack, seed)
        status = "sat" if found is not None else "unsat"
        for region in spec.regions if found is None else ():
            outcome = solve_region(net, region, deadline, config, seed)
            stats["regions"].append(outcome.stats)
            if outcome.status != "unsat":
                status, found = outcome.status, outcome.counterexample
                break
    except KeyboardInterrupt:
        status, found = "unknown", None
        stats["interrupted"] = True
    except NotImplementedError as error:
        status, found = "unknown", None
        stats["error"] = str(error)
    return VerificationResult(status, found, time.monotonic() - start, stats)
