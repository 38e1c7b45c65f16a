"""The checks of `verify.monitor` fused into the passes the network makes anyway
(`wrap(..., fused=...)`, the default where the C kernel builds).

The eager checker (`verify.monitor.check`) pays one or two extra passes over every monitored
activation (its per-feature minimum and maximum over the batch), and a clamp where it clips: on a
CPU whose activations do not fit in cache each pass costs about what the ReLU after it costs.
Here every check is one call of `kernels.range_check`, which reads each value once:

- a monitored node read only by a ReLU (`nn.ReLU`, in place or not, `F.relu`, `x.relu_()`)
  gets the ReLU replaced by one pass that tests the node's values against their detection
  range and writes the ReLU's output -- `relu(v)`, or for clipping the clamp to
  `[max(lo, 0), max(hi, 0)]` (`relu(clamp(v, lo, hi))`, one clamp) -- in place where the
  network's ReLU works in place or the node is a fresh tensor that only the ReLU reads;
- any other monitored node gets a read-only test (detection) or one clamp (clipping; in place
  where only the check reads the fresh tensor).

The detection ranges are the eager checker's (`_Checker.lower`, `.upper`: a ReLU output's lower
end `lo <= 0` is not tested, nor, with `through_relu`, that of a node only a ReLU reads), the
clamps its clamps (one range per region with a region index per sample, else their hull), so
flags and outputs are the eager wrapper's: the same comparisons, and writes that are a
selection of input values (no rounding). The kernel writes per sample and node one flag byte,
`[nodes, batch]`; the forward ends with one reduction over them (one host sync), and only a
failure builds the per-node report. With both actions ("both") the flags of the nodes after
a clamped value are those of the clipped forward (what the network computed), where the eager
wrapper reports its first, unclipped pass (NaN propagated, or with a region index no clamps);
the per-sample flags and the first flagged node are the same. Checksums (`verify.monitor.sums`) are recorded as in the
eager wrapper, right after their layer.

The eager wrapper serves the calls this one would not see alike: gradients (the kernel writes
outside autograd), several regions without a region index (detection's union semantics), and
a fused-away ReLU module with hooks (an injected fault on it must run).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.nn.modules import module as _module_hooks

from kernels.range_check import AddCheck, RangeCheck, Side
from verify.monitor.check import (
    MonitorReport,
    _Checker,
    _first,
    _fresh,
    _fusable_relu,
    _hooked,
    clean_report,
)
from verify.monitor.sums import SumCheck, SumRecorder, relu_call
from verify.monitor.wrapped import MonitoredNet


def _table(t: Tensor, shape: Sequence[int]) -> Tensor:
    """`[R, *shape]` (or broadcastable to it) as a contiguous `[R, n]` table."""
    return t.expand(t.shape[0], *shape).reshape(t.shape[0], -1).contiguous()


class FusedChecker:
    """The per-pass state of a fused forward and the calls its generated code makes: `check(x,
    k, fresh)` for node `k`, `relu(h, k, inplace)` for node `k` and the ReLU that alone reads
    it; `begin`/`end` bracket the forward (module docstring). The bounds are `eager`'s."""

    def __init__(self, eager: _Checker, sums: SumRecorder | None) -> None:
        self.names, self.detect, self.clip = eager.names, eager.detect, eager.clip
        self.regions, self.sums = eager.regions, sums
        shapes = eager.shapes
        self.det_lo = [_table(t, s) if need else None
                       for t, s, need in zip(eager.lower, shapes, eager.need_min)]  # fmt: skip
        self.det_hi = [_table(t, s) for t, s in zip(eager.upper, shapes)]
        hull = [(_table(lo[None], s), _table(hi[None], s))
                for lo, hi, s in zip(eager.hull_lo, eager.hull_hi, shapes)]  # fmt: skip
        table = hull if self.regions == 1 else [
            (_table(lo, s), _table(hi, s))
            for lo, hi, s in zip(eager.clip_lower, eager.clip_upper, shapes)]  # fmt: skip
        # (by region, for a ReLU) -> the clamps; a ReLU's are `[max(lo, 0), max(hi, 0)]`
        self.clamps = {} if not self.clip else {
            (by_region, relu): [(lo.clamp(min=0), hi.clamp(min=0)) if relu else (lo, hi)
                                for lo, hi in (table if by_region else hull)]
            for by_region in {False, self.regions > 1} for relu in (False, True)}  # fmt: skip
        inf = float("inf")
        self.det_pair = [(lo if lo is not None else torch.full_like(hi, -inf), hi)
                         for lo, hi in zip(self.det_lo, self.det_hi)]  # fmt: skip
        self._flags: dict[int, tuple[Tensor, list[Tensor]]] = {}
        self._kernels: dict[tuple, RangeCheck | AddCheck] = {}  # prepared once per call site
        self.flags: Tensor | None = None
        self.rows: list[Tensor] = []  # the flags' row of each node
        self.region: Tensor | None = None
        self.batch = 0

    def begin(self, batch: int, region: Tensor | None) -> None:
        self.batch = batch
        self.region = region.contiguous() if region is not None and self.regions > 1 else None
        if self.detect:
            if batch not in self._flags:  # one buffer per batch size (the last one kept)
                flags = torch.ones(len(self.names), batch, dtype=torch.uint8,
                                   device=self.det_hi[0].device)  # fmt: skip
                self._flags = {batch: (flags, list(flags))}
            self.flags, self.rows = self._flags[batch]
            if self.sums is not None:
                self.sums.begin(batch)

    def _call(self, x: Tensor, k: int, write: str, out: Tensor | None, relu: bool) -> None:
        key = (k, write, self.region is not None, relu)
        kernel = self._kernels.get(key)
        if kernel is None:
            clamp = self.clamps[key[2], relu][k] if write == "clamp" else (None, None)
            detect = (self.det_lo[k], self.det_hi[k]) if self.detect else (None, None)
            kernel = self._kernels[key] = RangeCheck(*detect, *clamp, write)
        kernel(x, self.rows[k] if self.detect else None, out, self.region)

    def check(self, x: Tensor, k: int, fresh: bool) -> Tensor:
        if not self.clip:
            self._call(x, k, "none", None, False)
            return x
        out = x if fresh else torch.empty_like(x)
        self._call(x, k, "clamp", out, False)
        return out

    def relu(self, h: Tensor, k: int, inplace: bool) -> Tensor:
        out = h if inplace else torch.empty_like(h)
        self._call(h, k, "clamp" if self.clip else "relu", out, True)
        return out

    def _side(self, k: int, relu: bool, by_region: bool) -> Side:
        if k < 0:
            return Side()
        clamp = self.clamps[by_region, relu][k] if self.clip else None
        return Side(self.det_pair[k] if self.detect else None, clamp)

    def add(self, a: Tensor, b: Tensor, ka: int, kb: int, k: int, relu: bool,
            into: int) -> Tensor:  # fmt: skip
        """`a + b` (node `k`; the operands nodes `ka`, `kb`, or -1 where not monitored here),
        then its ReLU where `relu`, checked in one pass; written into `a` (`into` 0), `b` (1)
        or a new tensor (-1). Operands of other shapes (broadcasting) take the checks one by
        one."""
        if not (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
                and a.dtype == b.dtype):  # fmt: skip
            a = self.check(a, ka, False) if ka >= 0 else a
            b = self.check(b, kb, False) if kb >= 0 else b
            return self.relu(a + b, k, True) if relu else self.check(a + b, k, True)
        out = a if into == 0 else (b if into == 1 else torch.empty_like(a))
        key = (ka, kb, k, relu, self.region is not None)
        kernel = self._kernels.get(key)
        if kernel is None:
            sides = tuple(
                self._side(i, r, key[4]) for i, r in ((ka, False), (kb, False), (k, relu))
            )
            kernel = self._kernels[key] = AddCheck(sides, relu)
        rows = self.rows
        flags = tuple(rows[i] if self.detect and i >= 0 else None for i in (ka, kb, k))
        return kernel(a, b, out, flags, self.region)

    def end(self, output: Tensor) -> MonitorReport:
        """The report of the pass: one reduction over the flags (and the checksums' test)."""
        names, sums = self.names, self.sums
        if not self.detect:
            return clean_report(self.batch, names, output)
        if not bool(self.flags.any()) and (sums is None or sums.holds()):
            return clean_report(self.batch, names, output)
        flags = self.flags.T.bool()  # a copy: the buffer is the next pass's
        if sums is not None:
            flags[:, sums.node_index] |= sums.flags()
        return MonitorReport(flags.any(1), _first(flags, names), flags, names, output)


def fuse_checks(gm: fx.GraphModule, names: Sequence[str], checker: FusedChecker,
                sums: Sequence[SumCheck]) -> list[nn.Module]:  # fmt: skip
    """Inserts `checker`'s calls into `gm` (a fresh shared trace) for the nodes `names` and
    the checksum records of `sums` (detection); returns the ReLU modules fused away."""
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    relus: list[nn.Module] = []
    done = _fuse_adds(gm, names, checker, by_name, relus)
    fed: dict[str, fx.Node] = {}  # a node -> its fused ReLU's output (clamped, for clipping)
    for k, name in enumerate(names):
        if name in done:
            continue
        node = by_name[name]
        relu = _fusable_relu(node, gm)
        fresh = _fresh(node, gm)
        if relu is not None:
            if relu.op == "call_module":
                relus.append(gm.get_submodule(relu.target))
            inplace = bool(relu_call(relu, gm)) or fresh  # as the network would, or only ours
            with graph.inserting_after(relu):
                new = graph.call_function(checker.relu, (node, k, inplace))
            relu.replace_all_uses_with(new)
            graph.erase_node(relu)
            by_name[relu.name] = fed[name] = new
            continue
        with graph.inserting_after(node):
            new = graph.call_function(checker.check, (node, k, fresh))
        node.replace_all_uses_with(new, delete_user_cb=lambda user, new=new: user is not new)
    for j, check in enumerate(sums):
        # right after the layer, before a fused in-place ReLU or clamp overwrites it; a
        # checksum that recomputes a ReLU reads the fused ReLU's output, what its layer read
        source = fed.get(check.source) if check.relu else None
        with graph.inserting_after(by_name[check.node]):
            graph.call_function(checker.sums.record, (by_name[check.node],
                                                      source or by_name[check.source], j))  # fmt: skip
    graph.lint()
    gm.recompile()
    return relus


_ADDS = (operator.add, operator.iadd, torch.add)


def _fuse_adds(gm: fx.GraphModule, names: Sequence[str], checker: FusedChecker,
               by_name: dict[str, fx.Node], relus: list[nn.Module]) -> set[str]:  # fmt: skip
    """Replaces each monitored residual add `a + b` (with the ReLU that alone reads it, and
    the checks of the monitored operands that only it reads) by one `checker.add` call, in
    place into an operand that only the add reads (or that `+=` overwrites); returns the
    names whose checks it took."""
    graph, done = gm.graph, set()
    for k, name in enumerate(names):
        node = by_name[name]
        if not (node.op == "call_function" and node.target in _ADDS and not node.kwargs
                and len(node.args) == 2 and all(isinstance(a, fx.Node) for a in node.args)
                and node.args[0] is not node.args[1]):  # fmt: skip
            continue
        a, b = node.args
        ka, kb = (names.index(v.name) if v.name in names and len(v.users) == 1 else -1
                  for v in (a, b))  # fmt: skip
        into = 0 if node.target is operator.iadd or _fresh(a, gm) else (1 if _fresh(b, gm) else -1)
        relu = _fusable_relu(node, gm)
        with graph.inserting_after(node):
            new = graph.call_function(checker.add, (a, b, ka, kb, k, relu is not None, into))
        if relu is not None:
            if relu.op == "call_module":
                relus.append(gm.get_submodule(relu.target))
            relu.replace_all_uses_with(new)
            graph.erase_node(relu)
            by_name[relu.name] = new
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        by_name[name] = new
        done |= {name} | {names[i] for i in (ka, kb) if i >= 0}
    return done


# Values per monitored node and call (batch x the nodes' mean size) from which a call runs
# fused: below it the eager checks' few torch ops cost less than a kernel call's Python and
# ctypes (about 14 us a check). sdc_production.md (fused / eager, clip): digits MLP at batch
# 256 (64 values a node and sample: 16,384) +113% / +69%, ResNet-18 and VGG-11 at batch 1
# (about 30,000 and 15,000) +6-10% / +5%; mnist 256x6 at batch 256 (65,536) +18% / +44%,
# ResNet-18 at batch 256 +1.7% / +7.7%.
FUSED_MIN_VALUES = 1 << 15


class FusedMonitoredNet(MonitoredNet):
    """`MonitoredNet` whose calls run the fused trace (`.fused`) where it sees what the eager
    one (`.module`) sees and, by default, pays (`FUSED_MIN_VALUES`; module docstring);
    `.fused_calls` counts them."""

    def __init__(self, eager: MonitoredNet, gm: fx.GraphModule, checker: FusedChecker,
                 relus: list[nn.Module], min_values: float = 0) -> None:  # fmt: skip
        super().__init__(eager.module, eager._checker, eager.nodes, eager.input_shape,
                         eager.dtype)  # fmt: skip
        object.__setattr__(self, "fused", gm)  # not a submodule: it shares `.module`'s weights
        self._fused_checker, self._relus = checker, relus
        self._params = list(gm.parameters())
        shapes = eager._checker.shapes
        self._values = sum(math.prod(s) for s in shapes) / max(1, len(shapes))
        self._min_values = min_values
        self.fused_calls = 0

    def _eager_only(self, x: Any, region: Any) -> bool:
        grad = torch.is_grad_enabled() and (
            (isinstance(x, Tensor) and x.requires_grad)
            or any(p.requires_grad for p in self._params)
        )
        union = region is None and self._fused_checker.detect and self._checker.regions > 1
        hooks = _module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks
        small = isinstance(x, Tensor) and x.shape[0] * self._values < self._min_values
        return grad or union or small or bool(hooks) or any(_hooked(m) for m in self._relus)

    def run(self, x: Tensor, region: Any = None) -> tuple[Tensor, MonitorReport]:
        if self._eager_only(x, region):
            return super().run(x, region)
        self._validate(x)
        checker = self._fused_checker
        checker.begin(x.shape[0], self._region(region, x))
        y = self.fused(x)
        self.fused_calls += 1
        return y, checker.end(y)


def fused_wrapper(eager: MonitoredNet, gm: fx.GraphModule, sums: Sequence[SumCheck],
                  like: Tensor, min_values: float = 0) -> FusedMonitoredNet:  # fmt: skip
    """`eager` (its nodes, ranges, action) as a `FusedMonitoredNet` over `gm`, a fresh shared
    trace of the same network; `sums`: the checksums `eager` records (detection); calls with
    fewer than `min_values` values a node go to `eager` (`FUSED_MIN_VALUES`)."""
    names = eager.nodes
    sums = list(sums) if eager._checker.detect else []
    recorder = SumRecorder(sums, like, [names.index(c.monitored) for c in sums]) if sums else None
    checker = FusedChecker(eager._checker, recorder)
    relus = fuse_checks(gm, names, checker, sums)
    return FusedMonitoredNet(eager, gm, checker, relus, min_values)
