"""Network graph: an `nn.Module` (traced with torch.fx) becomes an ordered DAG of BoundOps.

`build_graph(module, input_shape)` interprets the fx graph on an example batch of two inputs
(two, so a reshape that mixes the batch dimension is caught), folds constant sub-expressions,
and maps each supported call to a BoundOp (see `bounds/graph/fx_handlers.py`). The result is checked
against the module on random inputs: a conversion that changes the function raises instead of
giving a silently wrong bound.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor, fx, nn

from bounds.errors import (
    InvalidNetworkError,
    ShapeMismatchError,
    UnsupportedOperationError,
    at_node,
)
from bounds.graph.fx_handlers import INPUT, interpret
from bounds.ops import ActivationOp, BoundOp, UnaryAffineOp
from bounds.types import Interval

EXAMPLE_BATCH = 2


@dataclass(frozen=True)
class Node:
    """One operator: `op` applied to the named `inputs`; `shape` excludes the batch dimension."""

    name: str
    op: BoundOp | None
    inputs: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Graph:
    """Nodes in topological order; `nodes[0]` is the input, `nodes[-1]` the output."""

    nodes: tuple[Node, ...]

    @property
    def input(self) -> Node:
        return self.nodes[0]

    @property
    def output(self) -> Node:
        return self.nodes[-1]

    def __getitem__(self, name: str) -> Node:
        return self._index[name]

    @cached_property
    def float64(self) -> Graph:
        """This graph with its constants in float64 (itself when they already are), on their
        device: where float32 networks' bounds are computed (`bounds.rounding`). Cached on the
        graph, which we own."""
        consts = [t for n in self.nodes[1:] for t in n.op.constants()]
        if all(t.dtype == torch.float64 for t in consts):
            return self
        return self.to(torch.float64, consts[0].device)

    @cached_property
    def cones(self) -> dict[bytes, dict[str, Tensor]]:
        """`bounds.graph.cone.spec_cone`'s cache: per set of outputs, each node's cone."""
        return {}

    @cached_property
    def _index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def activations(self) -> Iterator[Node]:
        """The nonlinear nodes, in topological order."""
        return (n for n in self.nodes if isinstance(n.op, ActivationOp))

    def consumers(self, name: str) -> tuple[Node, ...]:
        """The nodes that take `name` as an input, in topological order."""
        return self._consumers.get(name, ())

    @cached_property
    def _consumers(self) -> dict[str, tuple[Node, ...]]:
        found: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.inputs):
                found.setdefault(name, []).append(node)
        return {name: tuple(nodes) for name, nodes in found.items()}

    def pre_activation_names(self) -> list[str]:
        """Names of the nodes that feed an activation (whose bounds the relaxations need)."""
        return list(dict.fromkeys(name for n in self.activations() for name in n.inputs))

    def split_pairs(self) -> list[tuple[str, str]]:
        """`(activation, pre-activation)` node names in topological order, for splitting at 0:
        every activation must be exact on each side of `xh = 0` (`Relaxation.split_at_zero`,
        ReLU-like); UnsupportedOperationError naming the first that is not."""
        pairs = []
        for node in self.activations():
            if not node.op.relaxation.split_at_zero:
                raise UnsupportedOperationError(
                    node.op.relaxation.name, node.name, "splitting at 0 does not make it exact"
                )
            pairs.append((node.name, node.inputs[0]))
        return pairs

    def bias_of(self, name: str, like: Tensor) -> Tensor:
        """The bias the node `name` adds, broadcast to its shape and flattened `[numel]` in
        `like`'s dtype and device (zeros where its op is not a single-input affine op with a
        bias)."""
        node = self[name]
        bias = node.op.bias_vector() if isinstance(node.op, UnaryAffineOp) else None
        n = int(torch.Size(node.shape).numel())
        if bias is None:
            return like.new_zeros(n)
        return torch.broadcast_to(bias.to(like), node.shape).reshape(-1)

    def side_slopes(self, name: str, like: Tensor) -> tuple[Tensor, Tensor]:
        """`([numel], [numel])`: the activation node `name`'s slope below 0 and above 0 per
        neuron, `f(0) - f(-1)` and `f(1) - f(0)` (exact for the `split_at_zero` activations:
        linear on each side of 0; per-channel slopes included)."""
        node = self[name]
        f, ones = node.op.relaxation.forward, like.new_ones(1, *node.shape)
        zero = f(0 * ones)
        return (zero - f(-ones)).reshape(-1), (f(ones) - zero).reshape(-1)

    def forward(self, x: Tensor, *, all_values: bool = False) -> Tensor | dict[str, Tensor]:
        """Evaluate the network on `x` (`[batch, *input_shape]`)."""
        values: dict[str, Tensor] = {INPUT: x}
        for node in self.nodes[1:]:
            values[node.name] = node.op.forward(*(values[i] for i in node.inputs))
        return values if all_values else values[self.output.name]

    def interval(
        self, box: Interval, given: dict[str, Interval] | None = None
    ) -> dict[str, Interval]:
        """Interval bound propagation (IBP) through every node; `given` intervals (valid on the
        region, e.g. ReLU splits) are intersected in where present."""
        out: dict[str, Interval] = {INPUT: box}
        for node in self.nodes[1:]:
            iv = node_interval(node, [out[i] for i in node.inputs])
            out[node.name] = iv.intersect(given[node.name]) if given and node.name in given else iv
        return out

    def to(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> Graph:
        """A copy with every constant in `dtype` on `device`."""
        nodes = tuple(
            Node(n.name, None if n.op is None else n.op.to(dtype, device), n.inputs, n.shape)
            for n in self.nodes
        )
        return Graph(nodes)

    def ancestors(self, name: str) -> set[str]:
        """Names of `name` and every node it depends on."""
        index, seen, stack = self._index, set(), [name]
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(index[current].inputs)
        return seen


def node_interval(node: Node, inputs: list[Interval]) -> Interval:
    """The node's interval; a relaxation's domain error names the node."""
    if isinstance(node.op, ActivationOp):
        return at_node(node.op.relaxation.name, node.name, node.op.interval, *inputs)
    return node.op.interval(*inputs)


def _trace(module: nn.Module) -> fx.GraphModule:
    if isinstance(module, fx.GraphModule):
        return module
    try:
        return fx.symbolic_trace(module)
    except Exception as exc:  # fx raises many types for untraceable code
        raise UnsupportedOperationError(
            "untraceable forward", type(module).__name__, f"torch.fx could not trace it ({exc})"
        ) from exc


def _on_cpu(module: nn.Module) -> nn.Module:
    """`module`, or a CPU copy of it when any parameter or buffer lives on another device."""
    tensors = list(module.parameters()) + list(module.buffers())
    if all(t.device.type == "cpu" for t in tensors):
        return module
    return copy.deepcopy(module).cpu()


def _module_dtype(module: nn.Module) -> torch.dtype:
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.get_default_dtype()


def _check_constants(nodes: tuple[Node, ...]) -> None:
    for node in nodes[1:]:
        for tensor in node.op.constants():
            if not torch.isfinite(tensor).all():
                raise InvalidNetworkError(f"NaN or Inf in the constants of node {node.name!r}")


def _largest_finite(value) -> float:
    """The largest finite magnitude in `value` (0 for anything else)."""
    if not (isinstance(value, Tensor) and value.is_floating_point() and value.numel()):
        return 0.0
    finite = value[torch.isfinite(value)]
    return float(finite.abs().max()) if finite.numel() else 0.0


class _Largest(fx.Interpreter):
    """Runs a traced module and records the largest finite magnitude of any value it computes."""

    largest = 0.0

    def run_node(self, n: fx.Node):
        value = super().run_node(n)
        self.largest = max(self.largest, _largest_finite(value))
        return value


def _check_equivalence(
    graph: Graph, module: fx.GraphModule, example: Tensor, rng: torch.Generator
) -> None:
    """The converted graph must compute what the module computes (a safety net). Two float
    evaluations of one function that order or fold their operations differently differ by
    rounding errors that scale with the largest *intermediate* values, not with the output
    (`(h + 1e8) - 1e8` loses `h` to rounding in one and keeps it in the other), so the
    tolerance is relative to the largest value of any node."""
    with torch.no_grad():
        noise = torch.randn(example.shape, dtype=example.dtype, generator=rng)
        run = _Largest(module)
        try:
            probe = torch.cat([example, noise * 3])
            expected = run.run(probe)
        except (IndexError, RuntimeError):  # e.g. embedding ids out of their table: the
            # module accepted the example, so probe inside its range [-1, 1) again
            run = _Largest(module)
            probe = torch.cat([example, noise.clamp(-0.99, 0.99)])
            expected = run.run(probe)
        values = graph.forward(probe, all_values=True)
        got = values[graph.output.name]
    if not isinstance(expected, Tensor) or expected.shape != got.shape:
        raise InvalidNetworkError(f"conversion changed the output shape: {got.shape}")
    largest = max(_largest_finite(v) for v in values.values())
    scale = 1.0 + max(float(expected.abs().max()), largest, run.largest)
    tol = 1e-4 if expected.dtype != torch.float64 else 1e-9
    if float((expected - got).abs().max()) > tol * scale:
        raise InvalidNetworkError("internal error: the converted graph disagrees with the module")


def build_graph(module: nn.Module, input_shape: tuple[int, ...]) -> Graph:
    """Convert `module` (inputs `[batch, *input_shape]`) into a `Graph` of BoundOps.

    Raises UnsupportedOperationError naming the operation and node for anything we cannot
    bound, InvalidNetworkError for NaN/Inf or non-constant weights. The graph's constants are
    on the CPU whatever the module's device (callers move the graph to their inputs' device).
    """
    check_module(module)
    module = _on_cpu(module)
    gm = _trace(module)
    dtype = _module_dtype(module)
    # A generator of our own: building a graph must not move the caller's random state.
    rng = torch.Generator().manual_seed(0)
    example = torch.rand(EXAMPLE_BATCH, *input_shape, dtype=dtype, generator=rng) * 2 - 1
    with torch.no_grad():
        try:
            module(example)
        except Exception as exc:  # any failure here means the input shape is wrong
            raise ShapeMismatchError(
                f"the network rejects inputs of shape [batch, *{tuple(input_shape)}]: {exc}"
            ) from exc
        specs = interpret(gm, example)
    graph = Graph(tuple(Node(*spec) for spec in specs))
    _check_constants(graph.nodes)
    _check_equivalence(graph, gm, example, rng)
    return graph


SUPPORTED_DTYPES = (torch.float32, torch.float64)
_TRAINING_DEPENDENT = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.dropout._DropoutNd,
    nn.AlphaDropout,
)


def check_module(module: nn.Module) -> None:
    """Refuses, before the module is ever run (a training-mode run would update BatchNorm's
    running statistics, i.e. mutate the caller's model): submodules whose output depends on the
    training flag while it is set, parameters or buffers that are not float32/float64 (half
    precision nets: bounds in float16 would not be sound to the digits we report; convert with
    `net.float()`), and tensors on the meta device (no values)."""
    for name, sub in module.named_modules():
        if sub.training and isinstance(sub, _TRAINING_DEPENDENT):
            where = name or type(module).__name__
            raise InvalidNetworkError(
                f"{type(sub).__name__} {where!r} is in training mode: call net.eval() first"
            )
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    for name, tensor in tensors:
        if tensor.is_meta:
            raise InvalidNetworkError(f"{name!r} is on the meta device: the network has no weights")
        if tensor.is_floating_point() and tensor.dtype not in SUPPORTED_DTYPES:
            raise InvalidNetworkError(
                f"{name!r} is {tensor.dtype}: only float32 and float64 networks are supported "
                "(convert with net.float() or net.double())"
            )
        if tensor.is_complex():
            raise InvalidNetworkError(f"{name!r} is complex ({tensor.dtype})")
