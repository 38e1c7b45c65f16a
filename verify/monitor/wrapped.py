"""The user's network with the checks fused in (`MonitoredNet`): its fx trace run with the
checker of `verify.monitor.check`, the report of each call, and the per-sample regions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, fx, nn

from bounds.errors import InvalidRegionError, ShapeMismatchError
from verify.monitor.check import MonitorReport, _Checker


class MonitoredNet(nn.Module):
    """The user's network with the checks fused in. `forward(x, region=None)` returns the
    (clipped, for clip actions) output and sets `.report`; `run` returns both."""

    def __init__(self, gm: fx.GraphModule, checker: _Checker, names: Sequence[str],
                 input_shape: tuple[int, ...], dtype: torch.dtype) -> None:  # fmt: skip
        super().__init__()
        self.module = gm
        self._checker = checker
        self.nodes, self.input_shape, self.dtype = tuple(names), tuple(input_shape), dtype
        self.report: MonitorReport | None = None

    def _validate(self, x: Any) -> None:
        """A typed error for an input of another shape or dtype than the network's."""
        if not isinstance(x, Tensor) or tuple(x.shape[1:]) != self.input_shape:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ShapeMismatchError(f"x has shape {got}; the monitor expects "
                                     f"[batch, *{self.input_shape}]")  # fmt: skip
        if x.dtype != self.dtype:
            raise ShapeMismatchError(f"x is {x.dtype}; the network is {self.dtype}")

    def run(self, x: Tensor, region: Any = None) -> tuple[Tensor, MonitorReport]:
        self._validate(x)
        checker, index = self._checker, self._region(region, x)
        checker.begin(x.shape[0], index)
        y = self.module(x)
        report = checker.end(y)
        if checker.rerun:  # clipping needs a clamping pass: NaN-safe, per-sample bounds
            checker.safe = True
            try:
                checker.begin(x.shape[0], index)
                y = self.module(x)
            finally:
                checker.safe = False
            report.output = y
        return y, report

    def forward(self, x: Tensor, region: Any = None) -> Tensor:
        y, report = self.run(x, region)
        object.__setattr__(self, "report", report)  # a plain attribute: no Module.__setattr__
        return y

    def _region(self, region: Any, x: Tensor) -> Tensor | None:
        if region is None:
            return None
        count = self._checker.regions
        index = torch.as_tensor(region, device=x.device)
        if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise InvalidRegionError(f"region must hold integer indices, got {index.dtype}")
        index = index.long().expand(x.shape[0]) if index.dim() == 0 else index.long()
        if index.shape != (x.shape[0],):
            raise ShapeMismatchError(f"region has shape {tuple(index.shape)}; expected "
                                     f"[batch] = [{x.shape[0]}]")  # fmt: skip
        low, high = torch.aminmax(index) if index.numel() else (index.new_zeros(()),) * 2
        if int(low) < 0 or int(high) >= count:
            bad = ((index < 0) | (index >= count)).nonzero()
            i = int(bad[0, 0])
            raise InvalidRegionError(f"region[{i}] = {int(index[i])} is out of range: the "
                                     f"monitor has {count} regions")  # fmt: skip
        return index
