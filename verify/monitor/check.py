"""The fused checks of `verify.monitor` on the user's own module: the fx trace that shares
the module's weights, the pairing of its nodes with the bound graph's (confirmed by value),
the check calls inserted after each monitored node (the wrapped module: `wrapped`)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.nn.modules import module as _module_hooks

from bounds.errors import (
    UnsupportedOperationError,
    VerificationInputError,
)
from bounds.graph.graph import Graph
from bounds.ops import ReshapeOp
from verify.monitor.sums import SumCheck, SumRecorder, inplace_users, relu_call


class MonitorMismatchError(VerificationInputError):
    """A monitor applied to a network other than the one it certifies (graph or weights)."""


def shared_trace(net: nn.Module) -> fx.GraphModule:
    """An fx `GraphModule` computing `net.forward` that shares `net`'s submodules, parameters
    and buffers (a `GraphModule` is re-used as it is: its own graph, copied)."""
    if isinstance(net, fx.GraphModule):
        graph = fx.Graph()
        graph.output(graph.graph_copy(net.graph, {}))
    else:
        try:
            graph = fx.Tracer().trace(net)
        except Exception as exc:  # fx raises many types for untraceable code
            raise UnsupportedOperationError(
                "untraceable forward", type(net).__name__, f"torch.fx could not trace it ({exc})"
            ) from exc
    return fx.GraphModule(net, graph)


class _Capture(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        # a copy: a later in-place op (`nn.ReLU(inplace=True)`) must not change what we saw
        self.values[n.name] = value.clone() if isinstance(value, Tensor) else value
        return value


def matched_nodes(graph: Graph, net: nn.Module, probe: Tensor) -> list[str]:
    """Graph nodes (input and reshapes left out) that an fx node of `net` of the same name
    computes: the same shape and values on `probe` (`[N, *input_shape]`)."""
    capture = _Capture(shared_trace(net))
    with torch.no_grad():
        capture.run(probe)
        values = graph.forward(probe, all_values=True)
    tol = 1e-9 if probe.dtype == torch.float64 else 1e-4
    found = []
    for node in graph.nodes[1:]:
        mine = capture.values.get(node.name)
        if isinstance(node.op, ReshapeOp) or not isinstance(mine, Tensor):
            continue
        ref = values[node.name]
        if mine.shape == ref.shape and (mine - ref).abs().max() <= tol * (1 + ref.abs().max()):
            found.append(node.name)
    return found


@dataclass
class MonitorReport:
    """One checked forward pass: `flagged [batch]` (a value left its range), `first_node` (the
    first violating node per sample, None where not flagged), `node_flags [batch, nodes]` (with
    several regions and no region index: the value left every region's range), `nodes`, the
    network's `output`, and `values` (name -> raw value) when the wrap keeps them."""

    flagged: Tensor
    first_node: list[str | None]
    node_flags: Tensor
    nodes: tuple[str, ...]
    output: Tensor
    values: dict[str, Tensor] | None = field(default=None, repr=False)


def clean_report(batch: int, names: tuple[str, ...], output: Tensor,
                 values: dict[str, Tensor] | None = None) -> MonitorReport:  # fmt: skip
    """The report of a pass that flagged nothing (one allocation for its flags)."""
    zeros = torch.zeros(batch * (len(names) + 1), dtype=torch.bool, device=output.device)
    flagged, flags = zeros[:batch], zeros[batch:].view(batch, len(names))
    return MonitorReport(flagged, [None] * batch, flags, names, output, values)


def _first(flags: Tensor, names: tuple[str, ...]) -> list[str | None]:
    if not bool(flags.any()):
        return [None] * flags.shape[0]
    index = flags.to(torch.uint8).argmax(1).tolist()
    return [names[k] if f else None for k, f in zip(index, flags.any(1).tolist())]


def _clamp(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """`x` clamped to `[lo, hi]`; NaN becomes `lo` (torch.fmin/fmax are not vectorised)."""
    inf = float("inf")
    return torch.nan_to_num(x, nan=-inf, posinf=inf, neginf=-inf).clamp_(lo, hi)


def _excess(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Per sample `[batch]`: how far the farthest value of `x` lies outside `[lo, hi]` (<= 0:
    inside; NaN for a NaN value)."""
    rows = x.shape[0]
    above = (x - hi).reshape(rows, -1).amax(1)
    return torch.maximum(above, (lo - x).reshape(rows, -1).amax(1))


def _hooked(module: nn.Module) -> bool:
    """Whether calling `module` runs hooks (then it is called, not fused away)."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or _module_hooks._global_forward_hooks
        or _module_hooks._global_forward_pre_hooks
    )


def _flat(tensors: list[Tensor], shapes) -> Tensor:
    """`[R, *shape_k]` tensors (or `[*shape_k]`: `R` = none) as one `[R, total]` table."""
    return torch.cat([t.expand(t.shape[0], *s).reshape(t.shape[0], -1)
                      for t, s in zip(tensors, shapes)], 1)  # fmt: skip


class _Checker:
    """The per-node checks called from the generated code; `begin`/`end` bracket a forward.

    `check(x, k)` records node `k` (detect) and returns `x` or its clamp (clip);
    `check_relu(h, k, j)` does the same for a node whose only user is a ReLU and returns the
    ReLU's output, clamped to `[max(lo, 0), max(hi, 0)]` (for clip actions: one clamp in place
    of the ReLU when it runs no hooks; `relu(clamp(h)) = clamp(h, lo+, hi+)`). Detection with
    one range per feature (one region, or the hull) keeps each node's per-feature extremes
    over the batch in preallocated buffers and compares them all once in `end`; only then, if
    something failed, does it compute per-sample flags. With a region index per sample the
    bounds of all nodes are gathered once per forward for clipping; detection reduces each node
    to per-region extremes over the batch (`index_reduce`) and compares them with the regions'
    ranges once. Clamps propagate NaN (one op per
    node); a NaN output makes `MonitoredNet` rerun the forward with NaN-safe clamps.

    Checks a node cannot fail are skipped: a ReLU output (`relu_fed`) is checked against
    `[lo if lo > 0 else -inf, hi]` (`self.lower`, `self.upper`; the ranges as given are
    `clip_lower`, `clip_upper`), never below 0. With `through_relu` (`make_checker`) a node
    read only by a ReLU is checked as the ReLU sees it, against `[lo if lo > 0 else -inf,
    max(hi, 0)]`: a value below a lower end `lo <= 0` leaves the ReLU as `0 = relu(lo)`, the
    output of an in-range value, so it is not flagged. The test is the same on the value and
    on its ReLU (`lo > 0`: `h >= lo` iff `relu(h) >= lo`; `hi+ >= 0`: `h <= hi+` iff `relu(h)
    <= hi+`), so an in-place ReLU may overwrite the recorded value (no copy), and a node whose
    every lower end is skipped costs one reduction (its maximum) instead of two. Clip-only passes clamp in place where the
    network would overwrite the value anyway (an in-place ReLU) or where the node is a fresh
    tensor that only its check reads (`fresh`)."""

    def __init__(self, lower, upper, shapes, action: str, hazard, names, keep: bool,
                 relus, sums, relu_fed=None, fresh=None) -> None:  # fmt: skip
        count = len(names)
        self.names, self.hazard = names, hazard
        self.detect, self.clip, self.keep = action != "clip", action != "detect", keep
        self.relus, self.sums, self.safe = relus, sums, False
        self.inplace_relus: list[bool] = []  # per fused ReLU: the network's ReLU is in place
        self.fresh = list(fresh) if fresh is not None else [False] * count
        self.shapes = [tuple(s) for s in shapes]
        relu_fed = list(relu_fed) if relu_fed is not None else [False] * count
        inf = float("inf")
        self.lower = [torch.where(t > 0, t, -inf) if r else t for t, r in zip(lower, relu_fed)]
        self.upper = [t.clamp(min=0) if r else t for t, r in zip(upper, relu_fed)]
        self.need_min = [not bool(torch.isneginf(t).all()) for t in self.lower]
        self.clip_lower, self.clip_upper = lower, upper
        self.hull_lo = [t.amin(0) for t in lower]
        self.hull_hi = [t.amax(0) for t in upper]
        self.check_lo = [t.amin(0) for t in self.lower]
        self.check_hi = [t.amax(0) for t in self.upper]
        self.plus_lo = [t.clamp(min=0) for t in self.hull_lo]
        self.plus_hi = [t.clamp(min=0) for t in self.hull_hi]
        self.flat_lo = _flat([h[None] for h in self.check_lo], shapes)[0]
        self.flat_hi = _flat([h[None] for h in self.check_hi], shapes)[0]
        sizes = [int(torch.Size(s).numel()) for s in self.shapes]
        self.offsets = [sum(sizes[:k]) for k in range(len(sizes))] + [sum(sizes)]
        # the minima of nodes without a lower end to check stay 0 (never written)
        self.extremes = torch.zeros(2, self.flat_lo.numel(), dtype=self.flat_lo.dtype,
                                    device=self.flat_lo.device)  # fmt: skip
        self.mins, self.maxs = self.extremes
        infs = torch.full_like(self.flat_lo, inf)
        self.window_lo = torch.stack([self.flat_lo, -infs])  # the minima above lo, maxima any
        self.window_hi = torch.stack([infs, self.flat_hi])
        self.min_views = [self._view(self.mins, k) for k in range(len(names))]
        self.max_views = [self._view(self.maxs, k) for k in range(len(names))]
        self.regions = int(lower[0].shape[0])
        table_lo, table_hi = _flat(lower, shapes), _flat(upper, shapes)  # [R, total] each
        self.table = torch.cat([table_lo, table_hi], 1)  # gathered per sample for clipping
        table_lo, table_hi = _flat(self.lower, shapes), _flat(self.upper, shapes)  # detection
        # the regions' extremes over the batch: one flat buffer per side, node by node a
        # contiguous `[R, n_k]` block (scatter_reduce into strided views is slow); the bounds
        # laid out alike
        blocks = [self._view(t, k).reshape(self.regions, -1) for t in (table_lo, table_hi)
                  for k in range(len(names))]  # fmt: skip
        self.block_lo = torch.cat([b.reshape(-1) for b in blocks[:count]])
        self.block_hi = torch.cat([b.reshape(-1) for b in blocks[count:]])
        self.block_min, self.block_max = (
            torch.empty_like(self.block_lo),
            torch.empty_like(self.block_hi),
        )
        cuts = [self.regions * o for o in self.offsets]
        self.region_min = [self.block_min[cuts[k] : cuts[k + 1]].view(self.regions, -1)
                           for k in range(count)]  # fmt: skip
        self.region_max = [self.block_max[cuts[k] : cuts[k + 1]].view(self.regions, -1)
                           for k in range(count)]  # fmt: skip

    def _view(self, flat: Tensor, k: int) -> Tensor:
        return flat[..., self.offsets[k] : self.offsets[k + 1]].unflatten(-1, self.shapes[k])

    def begin(self, batch: int, region: Tensor | None) -> None:
        count = len(self.names)
        self.batch, self.region = batch, region
        self.mode = "shared" if self.regions == 1 or (region is None and not self.detect) else (
            "sample" if region is not None else "union")  # fmt: skip
        self.raw, self.inside = [None] * count, [None] * count
        self.values = {} if self.keep else None
        if self.mode == "sample":
            if self.safe:  # the rerun clamps to per-sample bounds
                gathered = self.table.index_select(0, region)
                total = self.offsets[-1]
                self.g_lo, self.g_hi = gathered[:, :total], gathered[:, total:]
            else:  # the first pass only records (clipping changes nothing if all is inside)
                self.block_min.fill_(float("inf"))
                self.block_max.fill_(-float("inf"))
        self.rerun, self.grad = False, torch.is_grad_enabled()
        self.single = batch == 1 and self.mode == "shared"  # the values are the extremes
        if self.detect and self.sums is not None:
            self.sums.begin(batch)

    def _bounds(self, k: int) -> tuple[Tensor, Tensor]:
        if self.mode == "sample":
            return self._view(self.g_lo, k), self._view(self.g_hi, k)
        return self.hull_lo[k], self.hull_hi[k]

    def _record(self, x: Tensor, k: int) -> None:
        """Detection of node `k`."""
        mode = self.mode
        if mode == "shared":
            flat = x.detach() if self.grad else x  # the buffers take no gradient
            if self.single:  # one sample: a copy is both extremes (and its raw value)
                self.min_views[k].copy_(flat[0])
                return
            if self.need_min[k]:
                torch.amin(flat, 0, out=self.min_views[k])
            torch.amax(flat, 0, out=self.max_views[k])
            self.raw[k] = x.clone() if self.hazard[k] else x
        elif mode == "sample":  # per-region extremes over the batch (NaN propagates)
            flat = (x.detach() if self.grad else x).reshape(x.shape[0], -1)
            index = self.region[:, None].expand_as(flat)
            if self.need_min[k]:
                self.region_min[k].scatter_reduce_(0, index, flat, "amin")
            self.region_max[k].scatter_reduce_(0, index, flat, "amax")
            self.raw[k] = x.clone() if self.hazard[k] else x
        else:
            low, high = self.lower[k][None], self.upper[k][None]
            both = (x[:, None] >= low) & (x[:, None] <= high)
            self.inside[k] = both.reshape(x.shape[0], self.regions, -1).all(2)

    def _recording(self) -> bool:
        return self.detect or (self.mode == "sample" and not self.safe)

    def check(self, x: Tensor, k: int) -> Tensor:
        if self._recording():
            self._record(x, k)
        if self.keep:
            self.values[self.names[k]] = x.clone() if self.hazard[k] else x
        if not self.clip or (self.mode == "sample" and not self.safe):
            return x
        lo, hi = self._bounds(k)
        if self.safe:
            return _clamp(x, lo, hi)
        if self.fresh[k] and not (self.detect or self.keep or self.grad):  # only we read x
            return x.clamp_(lo, hi)
        return torch.clamp(x, lo, hi)

    def check_relu(self, h: Tensor, k: int, j: int) -> Tensor:
        if self._recording():
            self._record(h, k)
        if self.keep:  # a copy where a ReLU (ours or the network's) would overwrite it
            kept = self.hazard[k] or self.inplace_relus[j]
            self.values[self.names[k]] = h.clone() if kept else h
        module = self.relus[j]
        if not self.clip or (self.mode == "sample" and not self.safe):
            return module(h)
        value = module(h) if _hooked(module) else h  # hooks (an injected fault) see the ReLU
        if self.mode == "sample":  # relu(clamp(v, lo, hi)) = clamp(v, lo+, hi+) = relu(v) clipped
            lo, hi = self._bounds(k)
            return (_clamp(value, lo, hi) if self.safe else torch.clamp(value, lo, hi)).relu_()
        lo, hi = self.plus_lo[k], self.plus_hi[k]
        if self.safe:
            return _clamp(value, lo, hi)
        if self.inplace_relus[j] and not (self.detect or self.keep or self.grad):  # as its ReLU
            return value.clamp_(lo, hi)
        return torch.clamp(value, lo, hi)

    def end(self, output: Tensor) -> MonitorReport:
        """The report of the pass; sets `rerun` when clipping needs a second, clamping pass
        (per-sample regions with a value outside its range; a NaN past the fast clamps).
        Releases the pass's values (they would hold the activations until the next pass)."""
        try:
            return self._end(output)
        finally:
            self.raw = self.inside = None

    def _end(self, output: Tensor) -> MonitorReport:
        names, sums = self.names, self.sums
        if self.clip and not self.safe:
            if self.mode == "sample":
                self.rerun = not self._regions_inside()
            else:
                self.rerun = bool(torch.isnan(output).any())
        if not self.detect:
            return self._clean(output)
        if self.mode == "union":
            return self._union_report(output)
        if self.mode == "sample":
            ranges_ok = not self.rerun if self.clip else self._regions_inside()
            if ranges_ok and (sums is None or sums.holds()):
                return self._clean(output)
            flags = self._sample_flags()
            if sums is not None:
                flags = self._add_sums(flags)
        else:
            ext = self.extremes  # NaN fails the comparison
            if self.single:
                ext, low, high = self.mins, self.flat_lo, self.flat_hi
            else:
                low, high = self.window_lo, self.window_hi
            ranges_ok = torch.equal(torch.clamp(ext, low, high), ext)
            if ranges_ok and (sums is None or sums.holds()):
                return self._clean(output)
            flags = self._shared_flags()
            if sums is not None:
                flags = self._add_sums(flags)
        flagged = flags.any(1)
        return MonitorReport(flagged, _first(flags, names), flags, names, output, self.values)

    def _clean(self, output: Tensor) -> MonitorReport:
        return clean_report(self.batch, self.names, output, self.values)

    def _add_sums(self, flags: Tensor) -> Tensor:
        """`flags [batch, nodes]` or-ed with the failed checksums, each at its node."""
        index = self.sums.node_index
        flags = flags.clone()
        flags[:, index] |= self.sums.flags()
        return flags

    def _regions_inside(self) -> bool:
        """Every region's extremes inside its ranges: `fl(min - lo) >= 0` exactly when
        `min >= lo` (NaN fails; regions without samples keep `+-inf`: inside)."""
        low = torch.sub(self.block_min, self.block_lo).amin()
        return bool(torch.minimum(low, torch.sub(self.block_hi, self.block_max).amin()) >= 0)

    def _sample_flags(self) -> Tensor:
        rows = []
        for k, x in enumerate(self.raw):
            lo = self.lower[k].index_select(0, self.region)
            hi = self.upper[k].index_select(0, self.region)
            rows.append(~(_excess(x, lo, hi) <= 0))
        return torch.stack(rows, 1)

    def _shared_flags(self) -> Tensor:
        if self.single:
            rows = [~(_excess(self.min_views[k][None], lo, hi) <= 0)
                    for k, (lo, hi) in enumerate(zip(self.check_lo, self.check_hi))]  # fmt: skip
            return torch.stack(rows, 1)
        rows = [
            ~(_excess(x, lo, hi) <= 0) for x, lo, hi in zip(self.raw, self.check_lo, self.check_hi)
        ]
        return torch.stack(rows, 1)

    def _union_report(self, output: Tensor) -> MonitorReport:
        inside = torch.stack(self.inside, 1)  # [batch, nodes, regions]
        joint = torch.cummin(inside.to(torch.uint8), 1).values.bool()  # consistent so far
        lost = ~joint.any(2)  # [batch, nodes]: no region contains every value up to the node
        flags = ~inside.any(2)
        if self.sums is not None:  # a failed checksum fails every region from its node on
            broken = self._add_sums(torch.zeros_like(flags))
            flags, lost = flags | broken, lost | (broken.cumsum(1) > 0)
        first = _first(lost, self.names)
        return MonitorReport(lost[:, -1], first, flags, self.names, output, self.values)


def _fusable_relu(node: fx.Node, gm: fx.GraphModule) -> fx.Node | None:
    """The ReLU that is the only user of `node` (an `nn.ReLU` module, in place or not, or a
    ReLU function or method, `sums.relu_call`), or None."""
    users = list(node.users)
    if len(users) != 1:
        return None
    return users[0] if relu_call(users[0], gm) is not None and users[0].args[0] is node else None


# fx nodes whose value is a tensor of their own (not a view of another node's)
_FRESH_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm1d,
                  nn.BatchNorm2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.MaxPool2d)  # fmt: skip
_FRESH_FUNCTIONS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.matmul,
                    torch.add, torch.sub, torch.mul, torch.matmul, torch.mean, torch.sum,
                    nn.functional.linear, nn.functional.conv2d, nn.functional.avg_pool2d,
                    nn.functional.adaptive_avg_pool2d, nn.functional.max_pool2d}  # fmt: skip
_FRESH_METHODS = {"add", "sub", "mul", "matmul", "mean", "sum"}


def _fresh(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether `node` computes a new tensor (a layer or arithmetic, not a view or a reshape)
    that nothing but its one user reads (then its check may clamp it in place)."""
    if len(node.users) != 1:
        return False
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)) in _FRESH_MODULES
    if node.op == "call_function":
        return node.target in _FRESH_FUNCTIONS
    return node.op == "call_method" and node.target in _FRESH_METHODS


def make_checker(gm: fx.GraphModule, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 ranges: Sequence[tuple[Tensor, Tensor]], action: str, like: Tensor, keep: bool,
                 sums: Sequence[SumCheck] = (), through_relu: bool = False) -> _Checker:  # fmt: skip
    """Inserts a check after each fx node of `names` (node shapes `shapes`, ranges
    `[R, *shape]` or `[R, 1, ...]` each) into `gm`, and the checksum records of `sums`
    (`SumCheck`s of nodes among `names`; detect actions only). ReLU outputs, and with
    `through_relu` the nodes read only by a ReLU, are checked as the ReLU sees them
    (`_Checker`). A node read by an in-place ReLU is copied for detection unless
    `through_relu` (clipping alone needs no copy)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise MonitorMismatchError(f"the network computes no node {missing[0]!r}")
    lower = [r[0].to(like.device, like.dtype) for r in ranges]
    upper = [r[1].to(like.device, like.dtype) for r in ranges]
    fused = [_fusable_relu(by_name[n], gm) for n in names]
    overwritten = through_relu or (action == "clip" and not keep)  # no raw values needed
    hazard = [inplace_users(by_name[n], gm, allowed=relu if overwritten else None)
              for n, relu in zip(names, fused)]  # fmt: skip
    relu_fed = [(through_relu and relu is not None) or relu_call(by_name[n], gm) is not None
                for n, relu in zip(names, fused)]  # fmt: skip
    fresh = [_fresh(by_name[n], gm) and not hazard[k] for k, n in enumerate(names)]
    sums = list(sums) if action != "clip" else []
    recorder = SumRecorder(sums, like, [names.index(c.monitored) for c in sums]) if sums else None
    relus: list[nn.Module] = []
    checker = _Checker(lower, upper, shapes, action, hazard, tuple(names), keep, relus, recorder,
                       relu_fed, fresh)  # fmt: skip
    for k, name in enumerate(names):
        node = by_name[name]
        relu = _fusable_relu(node, gm)
        if relu is not None and not hazard[k]:
            module = gm.get_submodule(relu.target) if relu.op == "call_module" else None
            relus.append(module if module is not None else nn.ReLU())
            checker.inplace_relus.append(bool(relu_call(relu, gm)))
            with gm.graph.inserting_after(relu):
                new = gm.graph.call_function(checker.check_relu, (node, k, len(relus) - 1))
            relu.replace_all_uses_with(new)
            gm.graph.erase_node(relu)
            by_name[relu.name] = new
            continue
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(checker.check, (node, k))
        node.replace_all_uses_with(new, delete_user_cb=lambda user, new=new: user is not new)
    for j, check in enumerate(sums):
        node, source = by_name[check.node], by_name[check.source]
        # right after the layer, before anything (an in-place ReLU fused into its check) may
        # overwrite its output
        with gm.graph.inserting_after(node):
            gm.graph.call_function(recorder.record, (node, source, j))
    gm.graph.lint()
    gm.recompile()
    return checker
