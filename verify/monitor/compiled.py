"""A compiled detection path for `verify.monitor`: `Monitor.wrap(net, "detect", compile=True)`.

The network's fx trace (sharing `net`'s submodules and parameters, as `verify.monitor.check`)
gets, after each monitored node, its per-sample range test `~(max(x - hi, lo - x) <= 0)` (NaN
fails; with per-sample regions the bounds are gathered by region index inside the graph) and,
for each checksum of `verify.monitor.sums`, the per-sample window test of the gap
`fl(1^T y) - fl(c^T x)` against `k1 fl(a^T |x|) + k0` (the ReLU recomputed from the
pre-activation); all pure tensor functions, no buffers and no host sync, so that
`torch.compile` (Inductor) fuses each node's test into one pass over its values. The gap is
evaluated as a sum and a separate dot product (any order, FMA or not): `gamma_N + u (1 +
gamma_N) <= gamma_{N+1}`, so the tolerance of `verify.monitor.sums` covers it. The flags are
the eager wrapper's: the same ranges and windows, so clean inputs of the domain are never
flagged (the range tests are exact comparisons; a checksum of a faulty layer near its window
may round to the other side in one path).

Where the compiled graph would not see what the eager one sees, the eager wrapper runs
instead: a submodule with hooks (the fault injector's activation faults; compiled code does
not re-check hooks), gradients enabled, several regions without a region index (the union
semantics). Compile time is paid on the first call (seconds; again for a new batch size, then
the batch dimension is dynamic). Measured on CPU at batch 256 (`benchmarks/sdc_campaign.py
--latency-only --compiled`, one run, overhead over the plain eager module, compiled vs eager
wrapper): mnist_fc 256x6 balls +6% vs +15%, 256x2 balls +12% vs +17%, digits MLP +101% vs
+121%; but 256x2 box +22% vs +15% and cifar_base +112% vs +68% (Inductor's CPU convolutions
are slower than the eager ones): opt in per network.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx, nn

from verify.monitor.check import MonitorReport, _first, _hooked
from verify.monitor.sums import SumCheck, SumRecorder
from verify.monitor.wrapped import MonitoredNet


def range_flags(value: Tensor, lo: Tensor, hi: Tensor, region: Tensor | None) -> Tensor:
    """Per sample `[batch]`: a value of `value` lies outside its range (NaN: outside). `lo`,
    `hi`: `[features]`, or `[regions, features]` gathered by `region`."""
    flat = value.flatten(1)
    if region is not None:
        lo, hi = lo[region], hi[region]
    return ~(torch.maximum((flat - hi).amax(1), (lo - flat).amax(1)) <= 0)


def sum_flags(y: Tensor, source: Tensor, weights: Tensor, low: float, high: float, k1: float,
              relu: bool, absolute: bool) -> Tensor:  # fmt: skip
    """Per sample `[batch]`: the checksum of `verify.monitor.sums` fails (NaN fails)."""
    x = (torch.relu(source) if relu else source).flatten(1)
    gap = y.flatten(1).sum(1) - (x * weights[0]).sum(1)
    total = ((x.abs() if absolute else x) * weights[1]).sum(1)
    return ~((gap >= low - k1 * total) & (gap <= high + k1 * total))


def check_graph(
    gm: fx.GraphModule,
    names: tuple[str, ...],
    ranges: list[tuple[Tensor, Tensor]],
    checks: list[SumCheck],
    like: Tensor,
    shared: bool,
) -> fx.GraphModule:
    """`gm` (a fresh shared trace) rewritten to return `(output, flags [batch, len(names)],
    flagged [batch], any [])`: per node its range test (ranges `[R, *shape]` each; `shared`:
    region 0's, no region index) or-ed with the checksum tests of `checks` at that node;
    `forward(x, region)`."""
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_after(placeholder):
        region = graph.placeholder("region", default_value=None)
    flags = []
    for k, (name, (lo, hi)) in enumerate(zip(names, ranges)):
        lo, hi = (t.to(like.device, like.dtype).reshape(t.shape[0], -1) for t in (lo, hi))
        gm.register_buffer(f"_monitor_lo{k}", (lo[0] if shared else lo).contiguous())
        gm.register_buffer(f"_monitor_hi{k}", (hi[0] if shared else hi).contiguous())
        node = by_name[name]
        with graph.inserting_before(node.next):
            args = (node, graph.get_attr(f"_monitor_lo{k}"), graph.get_attr(f"_monitor_hi{k}"),
                    None if shared else region)  # fmt: skip
            flags.append(graph.call_function(range_flags, args))
    output = next(n for n in graph.nodes if n.op == "output")
    if checks:
        recorder = SumRecorder(checks, like, list(range(len(checks))))
        for j, check in enumerate(checks):
            gm.register_buffer(f"_monitor_sum{j}", check.weights.to(like.device))
            layer = by_name[check.node]
            with graph.inserting_before(layer.next):  # before an in-place op may overwrite it
                args = (layer, by_name[check.source], graph.get_attr(f"_monitor_sum{j}"),
                        float(recorder.low[j]), float(recorder.high[j]),
                        float(recorder.k1[j]), check.relu, check.absolute)  # fmt: skip
                failed = graph.call_function(sum_flags, args)
            k = names.index(check.monitored)
            with graph.inserting_before(output):
                flags[k] = graph.call_function(torch.logical_or, (flags[k], failed))
    with graph.inserting_before(output):
        stacked = graph.call_function(torch.stack, (flags, 1))
        flagged = graph.call_function(torch.any, (stacked, 1))
        anything = graph.call_function(torch.any, (flagged,))
    output.args = ((output.args[0], stacked, flagged, anything),)
    graph.lint()
    gm.recompile()
    return gm


class CompiledMonitoredNet(nn.Module):
    """Detection through `torch.compile` of `check_graph`; `forward(x, region=None)` returns
    the output and sets `.report` (no raw values kept), as `MonitoredNet` does. `eager`: the
    eager wrapper, run where the compiled graph would not see the same network (module
    docstring); `.compiled_calls` counts the calls the compiled graph served."""

    def __init__(self, eager: MonitoredNet, gm: fx.GraphModule, regions: int) -> None:
        super().__init__()
        self.eager, self.module = eager, gm
        self.nodes, self.input_shape, self.dtype = eager.nodes, eager.input_shape, eager.dtype
        self._compiled = torch.compile(gm)
        self._regions = regions
        self._submodules = [m for m in gm.modules() if m is not gm]
        self.report: MonitorReport | None = None
        self.compiled_calls = 0

    def _eager_only(self, region: Any) -> bool:
        return (
            torch.is_grad_enabled()
            or (region is None and self._regions > 1)
            or any(_hooked(m) for m in self._submodules)
        )

    def run(self, x: Tensor, region: Any = None) -> tuple[Tensor, MonitorReport]:
        if self._eager_only(region):
            return self.eager.run(x, region)
        if not isinstance(x, Tensor) or tuple(x.shape[1:]) != self.input_shape:
            return self.eager.run(x, region)  # its typed error
        if x.dtype != self.dtype:
            return self.eager.run(x, region)
        index = self.eager._region(region, x) if self._regions > 1 else None
        y, flags, flagged, anything = self._compiled(x, index)
        self.compiled_calls += 1
        first = _first(flags, self.nodes) if bool(anything) else [None] * x.shape[0]
        return y, MonitorReport(flagged, first, flags, self.nodes, y)

    def forward(self, x: Tensor, region: Any = None) -> Tensor:
        y, report = self.run(x, region)
        object.__setattr__(self, "report", report)
        return y
