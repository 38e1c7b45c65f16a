"""The fused checks of `verify.monitor` on the user's own module: the fx trace that shares
the module's weights, the pairing of its nodes with the bound graph's (confirmed by value),
the check calls inserted after each monitored node, and the wrapped module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn

from bounds.errors import (
    InvalidRegionError,
    ShapeMismatchError,
    UnsupportedOperationError,
    VerificationInputError,
)
from bounds.graph import Graph
from bounds.ops import ReshapeOp


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
        self.values[n.name] = value
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


class _Checker:
    """The per-node check called from the generated code: `check(x, k)` records (detect) and
    returns `x` or its clamped value (clip). `begin`/`end` bracket one forward pass."""

    def __init__(self, lower, upper, shapes, action: str, hazard, names, keep: bool) -> None:
        self.lower, self.upper, self.names, self.hazard = lower, upper, names, hazard
        self.detect, self.clip, self.keep = action != "clip", action != "detect", keep
        self.hull_lo = [t.amin(0) for t in lower]
        self.hull_hi = [t.amax(0) for t in upper]
        self.flat_lo = torch.cat([h.expand(s).reshape(-1) for h, s in zip(self.hull_lo, shapes)])
        self.flat_hi = torch.cat([h.expand(s).reshape(-1) for h, s in zip(self.hull_hi, shapes)])
        self.regions = int(lower[0].shape[0])

    def begin(self, batch: int, region: Tensor | None) -> None:
        count = len(self.names)
        self.batch, self.region = batch, region
        self.mode = "shared" if self.regions == 1 or (region is None and not self.detect) else (
            "sample" if region is not None else "union")  # fmt: skip
        self.mins, self.maxs, self.raw = [None] * count, [None] * count, [None] * count
        self.inside, self.excess = [None] * count, [None] * count
        self.values = {} if self.keep else None

    def check(self, x: Tensor, k: int) -> Tensor:
        mode = self.mode
        if mode == "shared":
            lo, hi = self.hull_lo[k], self.hull_hi[k]
            if self.detect:  # per-feature extremes over the batch; compared in `end`
                if x.shape[0] == 1:
                    self.mins[k] = self.maxs[k] = x.reshape(-1)
                elif x.dim() == 2:
                    self.mins[k], self.maxs[k] = x.amin(0), x.amax(0)
                else:
                    self.mins[k], self.maxs[k] = x.amin(0).reshape(-1), x.amax(0).reshape(-1)
                self.raw[k] = x.clone() if self.hazard[k] else x
        elif mode == "sample":
            lo = self.lower[k].index_select(0, self.region)
            hi = self.upper[k].index_select(0, self.region)
            if self.detect:
                self.excess[k] = _excess(x, lo, hi)
        else:
            lo, hi = self.hull_lo[k], self.hull_hi[k]
            if self.detect:
                low, high = self.lower[k][None], self.upper[k][None]
                both = (x[:, None] >= low) & (x[:, None] <= high)
                self.inside[k] = both.reshape(x.shape[0], self.regions, -1).all(2)
        if self.keep:
            self.values[self.names[k]] = x.clone() if self.hazard[k] else x
        return _clamp(x, lo, hi) if self.clip else x

    def end(self, output: Tensor) -> MonitorReport:
        batch, names = self.batch, self.names
        if self.detect and self.mode == "union":
            return self._union_report(output)
        if self.detect and self.mode == "sample":
            flags = ~(torch.stack(self.excess, 1) <= 0)  # NaN: flagged
        elif self.detect and not self._shared_ok():
            flags = self._shared_flags()
        else:
            flags = torch.zeros(batch, len(names), dtype=torch.bool, device=output.device)
            flagged = torch.zeros(batch, dtype=torch.bool, device=output.device)
            return MonitorReport(flagged, [None] * batch, flags, names, output, self.values)
        flagged = flags.any(1)
        return MonitorReport(flagged, _first(flags, names), flags, names, output, self.values)

    def _shared_ok(self) -> bool:
        """Every node's extremes over the batch inside its range (NaN fails: not ok)."""
        low = torch.cat(self.mins).ge(self.flat_lo).all()
        return bool(low.logical_and_(torch.cat(self.maxs).le(self.flat_hi).all()))

    def _shared_flags(self) -> Tensor:
        rows = [
            ~(_excess(x, lo, hi) <= 0) for x, lo, hi in zip(self.raw, self.hull_lo, self.hull_hi)
        ]
        return torch.stack(rows, 1)

    def _union_report(self, output: Tensor) -> MonitorReport:
        inside = torch.stack(self.inside, 1)  # [batch, nodes, regions]
        joint = torch.cummin(inside.to(torch.uint8), 1).values.bool()  # consistent so far
        lost = ~joint.any(2)  # [batch, nodes]: no region contains every value up to the node
        first = _first(lost, self.names)
        flags = ~inside.any(2)
        return MonitorReport(lost[:, -1], first, flags, self.names, output, self.values)


def _inplace_users(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether a user of `node` may modify its value in place (then detect keeps a copy)."""
    for user in node.users:
        if user.op == "call_module" and getattr(gm.get_submodule(user.target), "inplace", False):
            return True
        name = user.target if isinstance(user.target, str) else getattr(user.target, "__name__", "")
        if user.kwargs.get("inplace") or (name.endswith("_") and not name.endswith("__")):
            return True
    return False


def make_checker(gm: fx.GraphModule, names, shapes, ranges, action: str, like: Tensor, keep: bool):
    """Inserts a check after each fx node of `names` (node shapes `shapes`, ranges
    `[R, *shape]` or `[R, 1, ...]` each) into `gm`."""
    by_name = {n.name: n for n in gm.graph.nodes}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise MonitorMismatchError(f"the network computes no node {missing[0]!r}")
    lower = [r[0].to(like.device, like.dtype) for r in ranges]
    upper = [r[1].to(like.device, like.dtype) for r in ranges]
    hazard = [_inplace_users(by_name[n], gm) for n in names]
    checker = _Checker(lower, upper, shapes, action, hazard, tuple(names), keep)
    for k, name in enumerate(names):
        node = by_name[name]
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(checker.check, (node, k))
        node.replace_all_uses_with(new, delete_user_cb=lambda user, new=new: user is not new)
    gm.graph.lint()
    gm.recompile()
    return checker


class MonitoredNet(nn.Module):
    """The user's network with the checks fused in. `forward(x, region=None)` returns the
    (clipped, for clip actions) output and sets `.report`; `run` returns both."""

    def __init__(self, gm: fx.GraphModule, checker: _Checker, names, input_shape, dtype) -> None:
        super().__init__()
        self.module = gm
        self._checker = checker
        self.nodes, self.input_shape, self.dtype = tuple(names), tuple(input_shape), dtype
        self.report: MonitorReport | None = None

    def run(self, x: Tensor, region: Any = None) -> tuple[Tensor, MonitorReport]:
        if not isinstance(x, Tensor) or tuple(x.shape[1:]) != self.input_shape:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ShapeMismatchError(f"x has shape {got}; the monitor expects "
                                     f"[batch, *{self.input_shape}]")  # fmt: skip
        if x.dtype != self.dtype:
            raise ShapeMismatchError(f"x is {x.dtype}; the network is {self.dtype}")
        self._checker.begin(x.shape[0], self._region(region, x))
        y = self.module(x)
        return y, self._checker.end(y)

    def forward(self, x: Tensor, region: Any = None) -> Tensor:
        y, self.report = self.run(x, region)
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
        bad = ((index < 0) | (index >= count)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise InvalidRegionError(f"region[{i}] = {int(index[i])} is out of range: the "
                                     f"monitor has {count} regions")  # fmt: skip
        return index
