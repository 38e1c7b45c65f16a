"""The answer of `verify.verify`: `VerificationResult` (a status among `STATUSES`, the
counterexample when "sat", the wall time and the search's counters). Below both the verifier
and `verify.distributed`, which report the same statuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

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
