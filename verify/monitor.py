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
all of them, so they cancel where the weights make them cancel (`_Rounded`). CROWN's own
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
carry the fx node names; each pairing is confirmed by value on probe inputs. Detect mode takes
the per-feature min and max over the batch of each node and compares them all with the ranges
once, at the end of the forward (one host sync on CUDA); only a failed comparison computes the
per-sample flags. Clip mode clamps each node to its range (NaN becomes the lower end).

Limits. One input tensor; graph nodes that no fx node computes (helper nodes) are not
monitored; activations other than ReLU-like ones are refused. Replacing a submodule of `net`
after `wrap` is not seen by the wrapped module (`check` refuses it). A wrapped module runs one
forward at a time (not thread-safe).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx, nn

from bounds.errors import (
    InvalidNetworkError,
    InvalidRegionError,
    ShapeMismatchError,
    UnsupportedOperationError,
    VerificationInputError,
)
from bounds.graph import Graph, Node
from bounds.methods.crown import crown
from bounds.ops import ActivationOp, ConvOp, LinearOp, ReshapeOp, SumOp
from bounds.types import Interval
from verify.api import network_graph
from verify.bab_common import rounded_down, rounded_up
from verify.region import input_box

ACTIONS = ("detect", "clip", "both")
GRANULARITIES = ("neuron", "layer")
METHODS = ("crown", "ibp")
NODE_SETS = ("affine", "all")
# (relative rounding of each product's factors, unit roundoff of the sums) per arithmetic: TF32
# rounds both factors to 10 mantissa bits (2 * 2^-11) and accumulates in float32.
PRECISIONS = {"float32": (0.0, 2.0**-24), "float64": (0.0, 2.0**-53), "tf32": (2.0**-10, 2.0**-24)}
FLOAT64_UNIT = 2.0**-53


class MonitorMismatchError(VerificationInputError):
    """A monitor applied to a network other than the one it certifies (graph or weights)."""


class MonitorOptionError(VerificationInputError):
    """An unknown action, granularity, method, precision or node set (names the value)."""


@dataclass(frozen=True)
class Box:
    """The input box `lower <= x <= upper` (`[*input_shape]`, or `[k, *input_shape]`: k boxes)."""

    lower: Any
    upper: Any


@dataclass(frozen=True)
class Ball:
    """The L-inf ball(s) of radius `eps` around `center` (`[*input_shape]` or `[k, ...]`),
    intersected with the box `within = (low, high)` when given (e.g. the pixel range)."""

    center: Any
    eps: Any
    within: tuple[float, float] | None = None


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


def regions_box(domain: Any, input_shape: tuple[int, ...] | None) -> Interval:
    """The domain as `R` boxes `[R, *input_shape]` (float64). `domain`: a `Box`, a `Ball`, an
    `Interval`, a `(lower, upper)` pair, or a list of them (region `i` of the list first)."""
    items = list(domain) if isinstance(domain, list) else [domain]
    if not items:
        raise InvalidRegionError("the domain is an empty list of regions")
    lowers, uppers = [], []
    for i, item in enumerate(items):
        where = f"domain[{i}]" if isinstance(domain, list) else "domain"
        try:
            box = _one_region(item, input_shape)
        except VerificationInputError as err:
            raise type(err)(f"{where}: {err}") from err
        if input_shape is None:
            input_shape = tuple(box.lower.shape[1:])
        lowers.append(box.lower)
        uppers.append(box.upper)
    return Interval(torch.cat(lowers), torch.cat(uppers))


def _one_region(item: Any, shape: tuple[int, ...] | None) -> Interval:
    kw = dict(input_shape=shape, dtype=torch.float64, device=None, domain=None)
    if isinstance(item, Ball):
        kw["domain"] = item.within
        return input_box(eps=item.eps, x=item.center, lower=None, upper=None, **kw)
    if isinstance(item, Interval):
        item = Box(item.lower, item.upper)
    elif isinstance(item, tuple) and len(item) == 2:
        item = Box(*item)
    if not isinstance(item, Box):
        raise InvalidRegionError(
            f"a region must be a Box, a Ball, an Interval or a (lower, upper) pair; got "
            f"{type(item).__name__}"
        )
    if shape is None:  # one box of the network's per-sample shape
        kw["input_shape"] = tuple(torch.as_tensor(item.lower).shape)
    return input_box(eps=None, x=None, lower=item.lower, upper=item.upper, **kw)


# --- bounds of the float evaluation ----------------------------------------------------------


def _gamma(n: int, unit: float) -> float:
    if n * unit >= 0.5:
        raise UnsupportedOperationError("float error model", "", f"{n} terms exceed 1/(2u)")
    return n * unit / (1 - n * unit)


def _abs_apply(op, vectors: list[Tensor]) -> Tensor:
    """`|L| v` of an affine op (for several inputs: the sum over them), via its interval."""
    return op.interval(*(Interval(-v, v) for v in vectors)).radius


def _magnitude(iv: Interval) -> Tensor:
    return torch.maximum(iv.lower.abs(), iv.upper.abs())


def _terms(op, inputs: list[Tensor]) -> int:
    """Terms of the longest sum an op computes (an upper bound: the inputs' size otherwise)."""
    if isinstance(op, LinearOp):
        return int(op.weight.shape[1])
    if isinstance(op, ConvOp):
        return int(op.weight[0].numel())
    if isinstance(op, SumOp):
        return len(inputs)
    return sum(int(v[0].numel()) for v in inputs)


class _Rounded:
    """An affine op evaluated in floating point: its exact value on the (float) inputs plus a
    rounding error `rho`, `|rho| <= radius = 2 gamma_{n+3} (|L| m_in + |b|)`. `interval` sets
    `radius` from the inputs' intervals (so the nodes must be visited in topological order, as
    IBP and CROWN do) and widens by it; `bias_term` adds `min_rho A . rho = -|A| . radius`."""

    def __init__(self, op, unit: tuple[float, float]) -> None:
        self.op, self.unit, self.radius = op, unit, None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.op, name)

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.op.forward(*inputs)

    def interval(self, *inputs: Interval) -> Interval:
        mags = [_magnitude(iv) for iv in inputs]
        zero = self.op.forward(*(torch.zeros_like(m) for m in mags)).abs()
        size = _abs_apply(self.op, mags) + zero
        factors, sums = self.unit
        self.radius = 2 * (factors + _gamma(_terms(self.op, mags) + 3, sums)) * size
        iv = self.op.interval(*inputs)
        return Interval(iv.lower - self.radius, iv.upper + self.radius)

    def vjp(self, A: Tensor) -> tuple[Tensor, ...]:
        return self.op.vjp(A)

    def bias_term(self, A: Tensor) -> Tensor:
        return self.op.bias_term(A) - (A.abs() * self.radius.unsqueeze(1)).flatten(2).sum(-1)


def _check_activation(node) -> None:
    """ReLU-like only: pieces with slopes in {0, 1} and no intercepts are exact in float."""
    pieces = getattr(node.op.relaxation, "pieces", None)
    if (
        len(node.inputs) != 1
        or not pieces
        or not all(p.slope in (0.0, 1.0) and p.intercept == 0.0 for p in pieces)
    ):
        raise UnsupportedOperationError(
            type(node.op.relaxation).__name__, node.name,
            "monitors support ReLU-like activations only (exact in floating point)",
        )  # fmt: skip


def rounded_graph(graph: Graph, unit: tuple[float, float]) -> Graph:
    """`graph` with every affine op but reshapes replaced by its `_Rounded` version."""
    nodes = [graph.input]
    for node in graph.nodes[1:]:
        op = node.op
        if isinstance(op, ActivationOp):
            _check_activation(node)
        elif not op.is_affine:
            raise UnsupportedOperationError(type(op).__name__, node.name, "not affine")
        elif not isinstance(op, ReshapeOp):
            op = _Rounded(op, unit)
        nodes.append(Node(node.name, op, node.inputs, node.shape))
    return Graph(tuple(nodes))


def float_bounds(graph: Graph, box: Interval, method: str, unit) -> dict[str, Interval]:
    """Intervals `[R, *shape]` of every node that contain its value in every float evaluation
    (`unit`: a `PRECISIONS` entry) on the boxes: IBP or CROWN on the rounded graph (float64)."""
    rounded = rounded_graph(graph, unit)
    if method == "ibp":
        return rounded.interval(box)
    n_out = int(torch.Size(graph.output.shape).numel())
    eye = torch.eye(n_out, dtype=box.lower.dtype).expand(box.lower.shape[0], n_out, n_out)
    lower, upper, intervals = crown(rounded, box, eye)
    out = graph.output.name
    shape = intervals[out].lower.shape
    refined = Interval(lower.reshape(shape), upper.reshape(shape))
    return {**intervals, out: intervals[out].intersect(refined)}


def crown_pad(graph: Graph, box: Interval) -> dict[str, Tensor]:
    """Per node `[R, *shape]`: a bound on the float64 rounding of its bound computation,
    `2 gamma_N` (float64; `N`: the terms of all ops and the input) times its interval-
    arithmetic magnitude, which bounds every term of a backward pass to it (products of
    `|W|`, slopes in [0, 1], intercepts at most the magnitudes)."""
    chain = {graph.input.name: _magnitude(box)}
    total = int(box.lower[0].numel())
    for node in graph.nodes[1:]:
        mags = [chain[i] for i in node.inputs]
        if isinstance(node.op, ActivationOp):
            chain[node.name] = mags[0]
            continue
        zero = node.op.forward(*(torch.zeros_like(m) for m in mags)).abs()
        chain[node.name] = _abs_apply(node.op, mags) + zero
        total += _terms(node.op, mags)
    pad = 2 * _gamma(total, FLOAT64_UNIT)
    return {name: pad * value for name, value in chain.items()}


def certified_ranges(
    bounds: dict[str, Interval], pads: dict[str, Tensor], dtype: torch.dtype, layer: bool
) -> dict[str, tuple[Tensor, Tensor]]:
    """`[lower - pad, upper + pad]` rounded outwards to `dtype`; `layer`: one range per node
    and region (the extremes over its elements), shape `[R, 1, ..., 1]`."""
    ranges = {}
    for name, pad in pads.items():
        low, high = bounds[name].lower - pad, bounds[name].upper + pad
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise InvalidNetworkError(f"the bounds of node {name!r} are not finite")
        if layer:
            dims = tuple(range(1, low.dim()))
            low, high = low.amin(dims, keepdim=True), high.amax(dims, keepdim=True)
        ranges[name] = (rounded_down(low, dtype), rounded_up(high, dtype))
    return ranges


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


def _probe(box: Interval, dtype: torch.dtype, count: int = 4) -> Tensor:
    rng = torch.Generator().manual_seed(0)
    lower, upper = box.lower[:1], box.upper[:1]
    inside = lower + (upper - lower) * torch.rand(count, *lower.shape[1:], dtype=lower.dtype,
                                                  generator=rng)  # fmt: skip
    return inside.to(dtype)


# --- the fused checks ----------------------------------------------------------------------------


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


# --- the monitor ---------------------------------------------------------------------------------


class Monitor:
    """Certified ranges of the nodes of one network over a domain of `regions` boxes.

    `ranges[name] = (lower, upper)`, each `[regions, *shape]` (`[regions, 1, ...]` for layer
    granularity) in the network's dtype; `bounds[name]`: the float64 intervals of every node's
    float value (`float_bounds`, before `crown_pad` and the outward rounding); `nodes`: the
    monitorable nodes in topological order; `affine`: those that are not activation outputs
    (the default set checked); `box`: the regions `[regions, *input_shape]` (float64)."""

    def __init__(self, net, graph, box, bounds, ranges, nodes, affine, input_shape, unit) -> None:
        self.graph, self.box, self.bounds, self.ranges = graph, box, bounds, ranges
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
    ) -> MonitoredNet:
        """A module running `net` (its own submodules and weights) with the checks fused in.

        `action`: "detect" (per-sample, per-node flags in `.report`), "clip" (each node
        clamped to its range) or "both". `nodes`: "affine" (pre-activations, the output and
        any other affine node), "all" (activation outputs too) or a list of names. `ranges`:
        replace the certified ranges (baselines only: unverified ranges, broadcastable to
        `[*shape]`). `keep_values`: the report keeps the raw value of every checked node."""
        _choice(action, ACTIONS, "action")
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
        checker = make_checker(gm, names, shapes, chosen, action, like, keep_values)
        return MonitoredNet(gm, checker, names, self.input_shape, like.dtype)

    def check(
        self, net: nn.Module, x: Tensor, *, region: Any = None, nodes: str = "affine"
    ) -> MonitorReport:
        """Runs `net` on `x` (`[batch, *input_shape]`) with detection; `region`: the region
        index of each sample (`[batch]` ints), or None (a sample passes if some region contains
        all its values). Returns the report (`flagged [batch]`, `first_node`, `output`)."""
        self.admit(net)
        key = (tuple(self.select(nodes)),)
        cache = self._wrapped.setdefault(net, {})
        if key not in cache:
            cache[key] = self.wrap(net, "detect", nodes=nodes)
        with torch.no_grad():
            return cache[key].run(x, region)[1]


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
    """A `Monitor` of `net` (eval mode) over `domain`: a `Box`, a `Ball`, a `(lower, upper)`
    pair or `Interval`, or a list of them (one region each, e.g. per class). `method`: "crown"
    or "ibp"; `granularity`: "neuron" (a range per neuron) or "layer" (one per node);
    `precision`: the arithmetic of the inferences to certify ("float32", "float64", "tf32";
    default: the network's dtype). Raises typed errors for a bad domain or network."""
    _choice(method, METHODS, "method")
    _choice(granularity, GRANULARITIES, "granularity")
    check_eval(net)
    shape = input_shape or getattr(net, "input_shape", None)
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
    return Monitor(net, graph, box, bounds, ranges, nodes, affine, shape, unit)


__all__ = [
    "Ball",
    "Box",
    "Monitor",
    "MonitorMismatchError",
    "MonitorOptionError",
    "MonitorReport",
    "MonitoredNet",
    "monitor",
]
