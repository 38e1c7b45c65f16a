"""Verified activation monitors against silent data corruption (SDC).

`monitor(net, domain)` bounds every node of `net` over every input of `domain`, for every
*floating-point* evaluation of the network, and rounds the bounds outwards to the network's
dtype. A fault-free float inference on an input of the domain never leaves these ranges: a
check against them has no false positives, and clipping to them leaves fault-free outputs
bitwise unchanged.

Float model. Each affine op of the graph (`bounds.graph`; ReLUs are exact in floating point)
is evaluated as its exact value on the float inputs plus a rounding error `rho` with
`|rho| <= 2 (f + gamma_{n+3}) (|L| m_in + |b|)`: `n` the terms of its longest sum, `m_in` a
bound on the inputs' magnitudes, `gamma_k = k u / (1 - k u)` for the unit roundoff `u` of the
sums in any order (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Sec. 3.1),
`f` the rounding of the factors (TF32: `2^-10`; else 0); the factor 2 and the 3 extra
roundings cover constants the graph folded or rounded (`1/std`, BatchNorm). The errors are
bounded inputs of the network: IBP or CROWN (in float64) bound every node over the domain and
all of them, so they cancel where the weights make them cancel (`verify/monitor/ranges.py`). CROWN's own
float64 rounding is covered by `2 gamma_N` (float64) times each node's interval-arithmetic
magnitude (`crown_pad`). Assumptions: the module evaluates each graph op as written (BatchNorm
folded into the op before it is evaluated by the module in a few more roundings, covered
unless its constants cancel far below the activations' magnitudes), in IEEE float32/float64
(TF32 on CUDA is refused unless the monitor was built with `precision="tf32"`), with direct
or GEMM-based convolutions (the FFT and Winograd algorithms cuDNN may pick err more).

Fused checks on the user's module. `Monitor.wrap(net)` traces the *user's* module with torch.fx
into a `GraphModule` that shares its submodules, parameters and buffers (no copies: faults
injected into `net` afterwards reach it) and inserts a check call after each monitored node;
fx generates straight-line Python, so a check costs its tensor ops and no hook dispatch (the
fault injector's forward hooks on `net`'s submodules still run, before the check). Graph nodes
carry the fx node names; each pairing is confirmed by value on probe inputs. Detect mode writes
the per-feature min and max over the batch of each node into one preallocated buffer and
compares it with the ranges once, at the end of the forward (one clamp and one comparison, one
host sync on CUDA); only a failed comparison computes the per-sample flags. With a region index
per sample, the bounds of all nodes are gathered once per forward and each node reduces to the
per-sample minima of `x - lo` and `hi - x`. Clip mode clamps each node to its range; a node
whose only user is a ReLU is clamped to the ReLU's range `[max(lo, 0), max(hi, 0)]` after it,
in one op in place of the ReLU when the ReLU runs no hooks (`relu(clamp(h)) = clamp(h, lo+,
hi+)`; with hooks the ReLU module runs and its output is clamped). Clamps propagate NaN; a NaN
output reruns the forward with NaN-safe clamps (NaN becomes the lower end).

Cost. Each eager check is at least one pass over its node's values. By default the checks of
a large call (`FUSED_MIN_VALUES`) run fused into the passes the network makes anyway, where the
C kernel of `kernels/range_check.py` builds (`verify.monitor.fused`: a node read only by a ReLU
tested while the ReLU is written, a residual add with its operands' tests and its ReLU in one
pass; the same outputs and flags). `through_relu=True` checks a node read only by a ReLU as
the ReLU sees it (a value pushed below `lo <= 0` is then not flagged). Measured:
`benchmarks/sdc_campaign.py --production`, results/sdc_production.md.

Checksums. Detection also checks, for every monitored `nn.Linear` and `nn.Conv2d` node, the
checksum invariant `1^T y = (L^T 1)^T x + 1^T b` (`L^T 1`: `W^T 1`, or the transposed
convolution of an all-ones output; `b` repeated over the output) with a rigorous tolerance from
the sample's own `|x|` (`verify.monitor.sums`): proven for every input (no false positives by
construction), it catches corrupted weights and outputs of the layer and -- recomputing the
ReLU of the previous pre-activation -- corrupted activations between layers that stay inside
every range. `wrap(..., checksums=False)` leaves them out (the range checks alone); a number
keeps those whose work relative to their layer's (`SumCheck.cost`) is at most it, a list of
node names those nodes'. A layer followed by a BatchNorm (folded into it in the bound graph)
gets the checksum of the layer and the BatchNorm as its modules compute them, read after the
BatchNorm; a layer reading an average pooling of a ReLU (a ResNet's `fc`) gets the checksum
through the pooling, reading the ReLU's input (`verify.monitor.stages`).

Shapes of a domain. `verify.bounds` takes its boxes with a batch axis (`lower` of shape
`[batch, *input_shape]`, e.g. `[1, 64]`); a monitor's domain is one sample's box (`[*input_shape]`,
e.g. `(64,)`), or `[k, *input_shape]` for k regions. The per-sample shape is the network's
(`input_shape=`, else `net.input_shape` when the module declares it). When neither gives it, a box
with a leading axis of 1 (`[1, 64]`, as `verify.bounds` takes it) is read as one sample of the
rest (`(64,)`) when the network accepts only that shape, as one sample of the whole shape when it
accepts only that one, and refused with a `ShapeMismatchError` naming both when it accepts both
(pass `input_shape=`). A box of another shape than the network's is a `ShapeMismatchError`
naming the expected shape.

Embeddings and products. Embedding lookups (`F.embedding`, `nn.Embedding`, `table[ids]` of
`ids = x[..].long()`: the ids are float columns of the one input, and the domain's box on them
the allowed rows, `[0, rows - 1]` for all) are monitored at their exact per-dimension row
extremes (`bounds.ops.embedding`); a domain that lets an id leave its table is an
`IndexOutOfTableError` naming the lookup. Products of two activations (`x * y`, `x @ y`: a
DLRM's dot-product interaction) go through the McCormick relaxation, widened by the product's
one rounding (`verify.monitor.ranges`). `examples/dlrm_monitor.py` monitors a DLRM.

Limits. One input tensor; graph nodes that no fx node computes (helper nodes) are not
monitored; activations other than ReLU-like ones and products are refused. Replacing a submodule of `net`
after `wrap` is not seen by the wrapped module (`check` refuses it). A wrapped module runs one
forward at a time (not thread-safe).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from bounds.errors import (
    InvalidNetworkError,
    ShapeMismatchError,
    UnsupportedOperationError,
    VerificationInputError,
)
from bounds.graph.graph import Graph
from bounds.ops import ActivationOp
from bounds.types import Interval
from kernels.range_check import available as range_check_available
from verify.api import network_graph
from verify.monitor.check import (
    MonitorMismatchError,
    MonitorReport,
    make_checker,
    matched_nodes,
    shared_trace,
)
from verify.monitor.compiled import CompiledMonitoredNet, check_graph
from verify.monitor.domain import Ball, Box, implied_shape, regions_box
from verify.monitor.fused import FUSED_MIN_VALUES, fused_wrapper
from verify.monitor.ranges import certified_ranges, crown_pad, float_bounds
from verify.monitor.sums import SumCheck, sum_checks
from verify.monitor.wrapped import MonitoredNet

ACTIONS = ("detect", "clip", "both")
GRANULARITIES = ("neuron", "layer")
METHODS = ("crown", "ibp")
NODE_SETS = ("affine", "all")
# (relative rounding of each product's factors, unit roundoff of the sums) per arithmetic: TF32
# rounds both factors to 10 mantissa bits (2 * 2^-11) and accumulates in float32.
PRECISIONS = {"float32": (0.0, 2.0**-24), "float64": (0.0, 2.0**-53), "tf32": (2.0**-10, 2.0**-24)}


class MonitorOptionError(VerificationInputError):
    """An unknown action, granularity, method, precision or node set (names the value)."""


def _choice(value: str, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise MonitorOptionError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def check_eval(net: nn.Module) -> None:
    """Refuses a network any of whose modules is in training mode (names the first)."""
    if not isinstance(net, nn.Module):
        raise InvalidNetworkError(f"net must be a torch.nn.Module, got {type(net).__name__}")
    for name, sub in net.named_modules():
        if sub.training:
            where = name or type(net).__name__
            raise InvalidNetworkError(
                f"module {where!r} is in training mode: call net.eval() before building or "
                "applying a monitor"
            )


# --- bounds of the float evaluation ----------------------------------------------------------


# --- the network: fingerprint, trace, mapping -------------------------------------------------


def _digest(t: Tensor) -> str:
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + data).hexdigest()


def weight_digests(net: nn.Module) -> dict[str, str]:
    """sha256 of every parameter and buffer, by state_dict name."""
    return {k: _digest(v) for k, v in net.state_dict().items() if isinstance(v, Tensor)}


def structure_digest(graph: Graph) -> str:
    """sha256 of the graph's structure: node names, op types, inputs and shapes."""
    rows = [(n.name, type(n.op).__name__, n.inputs, n.shape) for n in graph.nodes]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def _probe(box: Interval, dtype: torch.dtype, count: int = 4) -> Tensor:
    rng = torch.Generator().manual_seed(0)
    lower, upper = box.lower[:1], box.upper[:1]
    inside = lower + (upper - lower) * torch.rand(count, *lower.shape[1:], dtype=lower.dtype,
                                                  generator=rng)  # fmt: skip
    return inside.to(dtype)


# --- the fused checks ----------------------------------------------------------------------------


# --- the monitor ---------------------------------------------------------------------------------


class Monitor:
    """Certified ranges of the nodes of one network over a domain of `regions` boxes.

    `ranges[name] = (lower, upper)`, each `[regions, *shape]` (`[regions, 1, ...]` for layer
    granularity) in the network's dtype; `bounds[name]`: the float64 intervals of every node's
    float value (`float_bounds`, before `crown_pad` and the outward rounding); `nodes`: the
    monitorable nodes in topological order; `affine`: those that are not activation outputs
    (the default set checked); `box`: the regions `[regions, *input_shape]` (float64)."""

    def __init__(
        self,
        net: nn.Module,
        graph: Graph,
        box: Interval,
        bounds: dict[str, Interval],
        ranges: dict[str, tuple[Tensor, Tensor]],
        nodes: Sequence[str],
        affine: Sequence[str],
        input_shape: tuple[int, ...],
        unit: tuple[float, float],
        sums: dict[str, SumCheck],
    ) -> None:
        self.graph, self.box, self.bounds, self.ranges = graph, box, bounds, ranges
        self.sums = sums  # node name -> SumCheck (verify.monitor.sums)
        self.unit = unit  # the unit roundoff of the inferences the ranges certify
        self.nodes, self.affine = tuple(nodes), tuple(affine)
        self.input_shape = tuple(input_shape)
        self.regions = int(box.lower.shape[0])
        self._structure = structure_digest(graph)
        self._weights = weight_digests(net)
        self._admitted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._admitted[net] = _module_ids(net)
        self._wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def select(self, nodes: str | Sequence[str]) -> tuple[str, ...]:
        """The node names of a node set ("affine", "all") or an explicit list (validated)."""
        if isinstance(nodes, str):
            return self.affine if _choice(nodes, NODE_SETS, "nodes") == "affine" else self.nodes
        unknown = [n for n in nodes if n not in self.nodes]
        if unknown:
            raise MonitorOptionError(f"unknown monitored node {unknown[0]!r}; known: "
                                     f"{', '.join(self.nodes)}")  # fmt: skip
        return tuple(n for n in self.nodes if n in set(nodes))

    def admit(self, net: nn.Module) -> None:
        """Accepts `net` if it is the network the monitor certifies: the one it was built on or
        one with the same graph and weights when first seen (weights may change afterwards:
        those are the faults we detect). Raises MonitorMismatchError otherwise."""
        check_eval(net)
        if net in self._admitted:
            if self._admitted[net] != _module_ids(net):
                raise MonitorMismatchError("the network's submodules were replaced since the "
                                           "monitor accepted it: build a new monitor")  # fmt: skip
            return
        try:
            graph = network_graph(net, self.input_shape)
        except VerificationInputError as err:
            raise MonitorMismatchError(
                f"this monitor was built for another network: {err}"
            ) from err
        if structure_digest(graph) != self._structure:
            raise MonitorMismatchError(
                "this monitor was built for another network: the graphs differ (node names, "
                "operations or shapes)"
            )
        mine = weight_digests(net)
        for name in [*mine, *(k for k in self._weights if k not in mine)]:
            if mine.get(name) != self._weights.get(name):
                raise MonitorMismatchError(
                    f"this monitor was built for another network: tensor {name!r} differs from "
                    "the certified weights (faults are detected on the network the monitor "
                    "was built on, or on a copy taken before the faults)"
                )
        self._admitted[net] = _module_ids(net)

    def wrap(
        self,
        net: nn.Module,
        action: str = "detect",
        *,
        nodes: str | Sequence[str] = "affine",
        ranges: dict[str, tuple[Any, Any]] | None = None,
        keep_values: bool = False,
        checksums: bool | float | Sequence[str] = True,
        compile: bool = False,
        through_relu: bool = False,
        fused: bool | None = None,
    ) -> MonitoredNet | CompiledMonitoredNet:
        """A module running `net` (its own submodules and weights) with the checks fused in.

        Args:
            net: the network the monitor certifies (or a copy taken before any fault).
            action: "detect" (per-sample, per-node flags in `.report`), "clip" (each node
                clamped to its range) or "both".
            nodes: "affine" (pre-activations, the output and any other affine node), "all"
                (activation outputs too) or a list of names.
            ranges: replace the certified ranges (baselines only: unverified ranges,
                broadcastable to `[*node_shape]`).
            keep_values: the report keeps the raw value of every checked node.
            checksums: detection also checks the checksum invariant of every checked linear
                layer (`verify.monitor.sums`; a failure flags the layer's node); a number `c`:
                only the checksums whose cost relative to their layer (`SumCheck.cost`) is at
                most `c`; a list of node names: the checksums of those nodes.
            compile: detection through `torch.compile` (`verify.monitor.compiled`; "detect"
                only, no kept values; the eager wrapper serves the calls the compiled graph
                would not see alike).
            through_relu: a node read only by a ReLU is checked as the ReLU sees it (a value
                below a lower end `lo <= 0` is not flagged: the ReLU maps it to the output of
                the in-range `lo`), one reduction instead of two and no copy before an
                in-place ReLU (`verify.monitor.check._Checker`).
            fused: each check fused into the pass the network makes anyway
                (`verify.monitor.fused`: a monitored node read by a ReLU is tested while the
                ReLU is written, one pass; the same flags and outputs); None (default): on
                CPU where `kernels.range_check` builds, without kept values, for calls of at
                least `FUSED_MIN_VALUES` values a node; False: the eager checks.

        Returns:
            A module taking `[batch, *input_shape]` like `net`; its `.report` after each call
            has `flagged` `[batch]` and `first_node` per sample.

        Raises:
            MonitorOptionError: an unknown action or node, `compile=True` with clipping or
                kept values, or `fused=True` with kept values.
            MonitorMismatchError: `net` is not the network the monitor was built on.
        """
        _choice(action, ACTIONS, "action")
        if compile and (action != "detect" or keep_values):
            raise MonitorOptionError("compile=True supports action='detect' without keep_values")
        if fused and keep_values:
            raise MonitorOptionError("fused=True keeps no values: use keep_values=False")
        names = self.select(nodes)
        self.admit(net)
        like = next(iter([*net.parameters(), *net.buffers()]), torch.zeros(()))
        _check_tf32(like, self.unit)
        if ranges is None:
            chosen = [self.ranges[n] for n in names]
        else:
            chosen = [_given_range(ranges, n, self.graph[n].shape, like) for n in names]
        gm = shared_trace(net)
        shapes = [self.graph[n].shape for n in names]
        _check_checksum_names(checksums, self.sums)
        sums = [self.sums[n] for n in names if n in self.sums and _chosen(self.sums[n], checksums)]
        checker = make_checker(gm, names, shapes, chosen, action, like, keep_values, sums,
                               through_relu)  # fmt: skip
        eager = MonitoredNet(gm, checker, names, self.input_shape, like.dtype)
        if not compile:
            auto = fused is None and range_check_available() and like.device.type == "cpu"
            if not (fused or (auto and not keep_values)):
                return eager
            return fused_wrapper(eager, shared_trace(net), sums, like, FUSED_MIN_VALUES * auto)
        shared = all(r[0].shape[0] == 1 for r in chosen)
        graph = check_graph(shared_trace(net), names, chosen, sums, like, shared)
        return CompiledMonitoredNet(eager, graph, 1 if shared else self.regions)

    def check(
        self, net: nn.Module, x: Tensor, *, region: Any = None, nodes: str = "affine"
    ) -> MonitorReport:
        """Runs `net` on `x` with detection (the wrapper is built once per network).

        Args:
            net: the network the monitor certifies (faults injected into it are detected).
            x: the inputs, `[batch, *input_shape]`.
            region: the region index of each sample (`[batch]` ints), or None (a sample passes
                if some region contains all its values).
            nodes: "affine", "all" or a list of node names (see `wrap`).

        Returns:
            The `MonitorReport`: `flagged` `[batch]` bools, `first_node` (the first node out
            of range per sample, or None) and `output`.

        Raises:
            MonitorMismatchError: `net` is not the network the monitor was built on.
            MonitorOptionError: an unknown node.
        """
        self.admit(net)
        key = (tuple(self.select(nodes)),)
        cache = self._wrapped.setdefault(net, {})
        if key not in cache:
            cache[key] = self.wrap(net, "detect", nodes=nodes)
        with torch.no_grad():
            return cache[key].run(x, region)[1]


def _chosen(check: SumCheck, checksums: bool | float | Sequence[str]) -> bool:
    """Whether `wrap(..., checksums=...)` keeps `check`: all, none, those of cost at most a
    number, or those of the named nodes."""
    if isinstance(checksums, bool):
        return checksums
    if isinstance(checksums, (int, float)):
        return check.cost <= checksums
    if isinstance(checksums, str) or not isinstance(checksums, Sequence):
        raise MonitorOptionError(f"checksums must be a bool, a number or a list of node names; "
                                 f"got {checksums!r}")  # fmt: skip
    return check.monitored in checksums


def _check_checksum_names(checksums: Any, sums: dict[str, SumCheck]) -> None:
    """A list of node names for `checksums` names nodes that have one."""
    if isinstance(checksums, (bool, int, float, str)) or not isinstance(checksums, Sequence):
        return
    unknown = [n for n in checksums if n not in sums]
    if unknown:
        raise MonitorOptionError(f"checksums: node {unknown[0]!r} has no checksum; nodes with "
                                 f"one: {', '.join(sums) or 'none'}")  # fmt: skip


def _given_range(ranges, name: str, shape, like: Tensor) -> tuple[Tensor, Tensor]:
    if name not in ranges:
        raise MonitorOptionError(f"ranges has no entry for monitored node {name!r}")
    low, high = (torch.as_tensor(v, dtype=like.dtype) for v in ranges[name])
    try:
        return (torch.broadcast_to(low, shape)[None], torch.broadcast_to(high, shape)[None])
    except RuntimeError as err:
        raise ShapeMismatchError(f"ranges[{name!r}] does not broadcast to {shape}") from err


def _check_tf32(like: Tensor, unit: tuple[float, float]) -> None:
    """On CUDA with TF32 matmuls or convolutions allowed, float32 ranges are not sound."""
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
    if like.is_cuda and like.dtype == torch.float32 and tf32 and unit != PRECISIONS["tf32"]:
        raise MonitorOptionError(
            "TF32 is enabled on CUDA (torch.backends.cuda.matmul.allow_tf32 / "
            "torch.backends.cudnn.allow_tf32): disable it, or build the monitor with "
            'precision="tf32"'
        )


def _module_ids(net: nn.Module) -> tuple:
    return tuple((name, id(m)) for name, m in net.named_modules())


def monitor(
    net: nn.Module,
    domain: Any,
    *,
    method: str = "crown",
    granularity: str = "neuron",
    input_shape: tuple[int, ...] | None = None,
    precision: str | None = None,
) -> Monitor:
    """A `Monitor` of `net` (eval mode) over `domain`: the certified range of every node.

    Each box is one sample's (`[*input_shape]`; `[k, *input_shape]`: k regions), where
    `verify.bounds` takes a batch axis; a `[1, *input_shape]` box is accepted as one sample (see
    "Shapes of a domain" in the module docstring).

    Args:
        net: the `torch.nn.Module` to guard, in eval mode (not modified; faults injected into
            it later are what the monitor detects).
        domain: a `Box(lower, upper)`, a `Ball(center, eps, within)`, a `(lower, upper)` pair
            or `Interval`, or a list of them (one region each, e.g. per class).
        method: "crown" or "ibp": how the nodes are bounded (in float64).
        granularity: "neuron" (a range per neuron) or "layer" (one per node).
        input_shape: one sample's shape, where the module does not declare `input_shape`.
        precision: the arithmetic of the inferences to certify ("float32", "float64",
            "tf32"; default: the network's dtype).

    Returns:
        The `Monitor`: `ranges[node] = (lower, upper)`, each `[regions, *node_shape]` in the
        network's dtype; `wrap(net, action)` and `check(net, x)` run the network with the
        checks fused in.

    Raises:
        MonitorOptionError: an unknown method, granularity or precision, or a precision
            finer than the network's.
        ShapeMismatchError: a domain whose shape is not the network's, or is ambiguous (pass
            `input_shape=`).
        InvalidRegionError: NaN/Inf or empty boxes.
        InvalidNetworkError: a network in training mode.
        UnsupportedOperationError: an operation outside the supported set, or no node that
            could be monitored.
    """
    _choice(method, METHODS, "method")
    _choice(granularity, GRANULARITIES, "granularity")
    check_eval(net)
    shape = input_shape or getattr(net, "input_shape", None) or implied_shape(net, domain)
    box = regions_box(domain, None if shape is None else tuple(shape))
    shape = tuple(box.lower.shape[1:])
    graph = network_graph(net, shape)
    dtype = next((t.dtype for t in net.parameters() if t.is_floating_point()), torch.float32)
    native = str(dtype).split(".")[-1]
    unit = PRECISIONS[_choice(precision or native, tuple(PRECISIONS), "precision")]
    if unit[1] < PRECISIONS[native][1]:
        raise MonitorOptionError(f"precision {precision!r} is finer than the {native} network's "
                                 "arithmetic: its ranges would not hold")  # fmt: skip
    g64 = graph.to(torch.float64)
    with torch.no_grad():
        bounds = float_bounds(g64, box, method, unit)
        pads = crown_pad(g64, box)
    nodes = matched_nodes(graph, net, _probe(box, dtype))
    if not nodes:
        raise UnsupportedOperationError("monitor", type(net).__name__, "no node could be mapped")
    affine = [n for n in nodes if not isinstance(graph[n].op, ActivationOp)]
    ranges = certified_ranges({n: bounds[n] for n in nodes}, {n: pads[n] for n in nodes},
                              dtype, granularity == "layer")  # fmt: skip
    sums = {}
    if unit[0] == 0.0:  # rounded factors (TF32) are outside the checksums' error model
        sums = sum_checks(net, shared_trace(net), graph, affine, bounds, unit[1])
    return Monitor(net, graph, box, bounds, ranges, nodes, affine, shape, unit, sums)


__all__ = [
    "Ball",
    "Box",
    "CompiledMonitoredNet",
    "Monitor",
    "MonitorMismatchError",
    "MonitorOptionError",
    "MonitorReport",
    "MonitoredNet",
    "monitor",
]
