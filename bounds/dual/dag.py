"""The network as Lagrangian decomposition sees it, on any DAG of BoundOps (Bunel, De Palma et
al., UAI 2020, Sec. 3, generalised from chains).

The input of every nonlinear node is duplicated: an A copy (its value as an affine function of
the network's input and of the nonlinear nodes' outputs) and a B copy (the relaxation's input).
One `Edge` per (nonlinear node, input slot) carries the dualised constraint `xhA = xhB`.
The subproblems ("sources") are the input box (source 0) and each nonlinear node (source
`j + 1` for `acts[j]`, over all its inputs' B copies and its output). Each source feeds, through
the affine subgraph, some targets: the A copies of edges and the network's output. Each
(source, target) `Pair` is the target's share `L_ts z_s` of the source's value `z_s`, so
`xhA_t = sum over its pairs` (one pair per target on a chain). A subproblem's linear
coefficient on its output is the vjp, through its affine region, of the coefficients of its
targets (`-rho` of an edge, `c` of the output): residual Add, Concat and Split need nothing
special.

Constants: a node's offset `op(0, ..., 0)` is carried by one source (its owner, the first that
reaches it), which applies the op's full `forward`; the others apply its linear part (`linear`
for unary ops, `forward - offset` for the rest), so the shares of a target sum to its value.
On a chain every node has one source, and each source's pass is the chain form's block.

Tensors carry `[batch, specs, *shape]`; the ops see `[batch * specs, *shape]` going forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bounds.errors import UnsupportedOperationError
from bounds.graph.graph import Graph, Node
from bounds.ops import ActivationOp, UnaryAffineOp


@dataclass(frozen=True)
class Edge:
    """Input `slot` of nonlinear node `acts[act]`, duplicated: `pre` names the node whose value
    the A copy is (the node whose interval bounds the B copy)."""

    act: int
    slot: int
    pre: str


@dataclass(frozen=True)
class Pair:
    """Source `source`'s share of target `target` (an edge index, or `n_edges` for the
    network's output), read at node `node`."""

    source: int
    target: int
    node: str


@dataclass(frozen=True)
class Step:
    """One affine node of a source's region: `live[i]` whether input i carries the source's
    share (else it is zero for this source); `owned`: the source carries the node's offset;
    `zero_shapes[i]`: the per-sample shape of input i (to fill the inputs that are not live);
    `offset`: `op(0, ..., 0)` `[1, *shape]` for the non-owners of a multi-input op (None when
    it is zero or not needed)."""

    node: Node
    live: tuple[bool, ...]
    owned: bool
    zero_shapes: tuple[tuple[int, ...], ...]
    offset: Tensor | None


@dataclass(frozen=True)
class Source:
    """A subproblem: the node whose value it chooses (`name`, per-sample `shape`), its edges
    (the B copies it holds; none for the input), the affine nodes its value reaches before any
    nonlinearity (`region`, topological, pruned to those that reach a target), its pairs
    (indices into `Decomposition.pairs`) and their targets. `chain`: the region's ops when they
    are a path of unary ops ending at the one pair's node (a chain's block: applied in turn,
    as the chain form did), else None."""

    name: str
    shape: tuple[int, ...]
    edges: tuple[int, ...]
    region: tuple[Step, ...]
    pairs: tuple[int, ...]
    targets: tuple[int, ...]
    chain: tuple[UnaryAffineOp, ...] | None

    @property
    def simple(self) -> bool:
        """One share and at most one edge (every block of a chain)."""
        return len(self.pairs) == 1 and len(self.edges) <= 1


@dataclass(frozen=True)
class Decomposition:
    """`graph` decomposed: `acts[j]` (nonlinear nodes, topological) with `act_edges[j]` (their
    edges), `sources[0]` the input and `sources[j + 1]` node `acts[j]`, `pairs` ordered by
    source then target, `target_pairs[t]` the pairs of target t (edges, then the output)."""

    graph: Graph
    acts: tuple[Node, ...]
    edges: tuple[Edge, ...]
    act_edges: tuple[tuple[int, ...], ...]
    sources: tuple[Source, ...]
    pairs: tuple[Pair, ...]
    target_pairs: tuple[tuple[int, ...], ...]
    n_edges: int  # the output's target index
    only_share: tuple[int, ...]  # per target: its pair when it has one, else -1

    @property
    def relaxations(self) -> tuple:
        """The relaxation of each nonlinear node."""
        return tuple(a.op.relaxation for a in self.acts)

    @property
    def pre_names(self) -> tuple[str, ...]:
        """The node duplicated by each edge."""
        return tuple(e.pre for e in self.edges)

    def truncated(self, name: str) -> Decomposition:
        """The decomposition of the subnetwork whose output is node `name` (its ancestors)."""
        keep = self.graph.ancestors(name)
        return decompose(Graph(tuple(n for n in self.graph.nodes if n.name in keep)))

    def to(self, dtype: torch.dtype, device: torch.device | str) -> Decomposition:
        return decompose(self.graph.to(dtype, device))


def _check(graph: Graph) -> None:
    for node in graph.nodes[1:]:
        if not node.inputs:
            raise UnsupportedOperationError(
                type(node.op).__name__, node.name, "a node without inputs (a free constant)"
            )
        if not isinstance(node.op, ActivationOp) and not node.op.is_affine:
            raise UnsupportedOperationError(
                type(node.op).__name__, node.name,
                "Lagrangian decomposition needs affine ops between the nonlinear nodes",
            )  # fmt: skip


def _reach(graph: Graph, start: str, sources: set[str]) -> list[Node]:
    """Affine nodes reachable from `start` without passing through a source, topological."""
    seen, region = {start}, []
    for node in graph.nodes[1:]:
        if node.name not in sources and any(i in seen for i in node.inputs):
            seen.add(node.name)
            region.append(node)
    return region


def _prune(region: list[Node], start: str, targets: set[str]) -> list[Node]:
    """The nodes of `region` on a path from `start` to a target."""
    inside = {n.name for n in region} | {start}
    needed = set(targets)
    for node in reversed(region):
        if node.name in needed:
            needed.update(i for i in node.inputs if i in inside)
    return [n for n in region if n.name in needed]


def _offset(node: Node, graph: Graph) -> Tensor | None:
    """`op(0, ..., 0)` `[1, *shape]` for a multi-input affine op, None when zero."""
    consts = node.op.constants()
    dtype = consts[0].dtype if consts else torch.float64
    device = consts[0].device if consts else "cpu"
    zeros = [torch.zeros(1, *graph[i].shape, dtype=dtype, device=device) for i in node.inputs]
    out = node.op.forward(*zeros)
    return None if not bool((out != 0).any()) else out


def decompose(graph: Graph) -> Decomposition:
    """The decomposition of `graph` (see the module docstring). UnsupportedOperationError for a
    node that is neither affine nor a relaxed nonlinearity."""
    _check(graph)
    acts = tuple(graph.activations())
    edges = tuple(Edge(j, i, name) for j, a in enumerate(acts) for i, name in enumerate(a.inputs))
    act_edges = tuple(
        tuple(e for e, edge in enumerate(edges) if edge.act == j) for j in range(len(acts))
    )
    target_nodes = [e.pre for e in edges] + [graph.output.name]
    names = [graph.input.name] + [a.name for a in acts]
    owners: dict[str, int] = {}
    plans = []
    for s, name in enumerate(names):
        reach = _reach(graph, name, set(names))
        inside = {n.name for n in reach} | {name}
        targets = [t for t, node in enumerate(target_nodes) if node in inside]
        region = _prune(reach, name, {target_nodes[t] for t in targets})
        for node in region:
            owners.setdefault(node.name, s)
        plans.append((name, region, targets))
    pairs, sources = [], []
    for s, (name, region, targets) in enumerate(plans):
        steps = _steps(graph, name, region, owners, s)
        first = len(pairs)
        pairs += [Pair(s, t, target_nodes[t]) for t in targets]
        own = act_edges[s - 1] if s else ()
        chain = _chain(name, steps, [target_nodes[t] for t in targets])
        sources.append(
            Source(name, graph[name].shape, own, steps, tuple(range(first, len(pairs))),
                   tuple(targets), chain)
        )  # fmt: skip
    target_pairs = tuple(
        tuple(k for k, p in enumerate(pairs) if p.target == t) for t in range(len(target_nodes))
    )
    for t, found in enumerate(target_pairs):
        if not found:  # cannot happen for a graph whose nodes all have inputs
            raise UnsupportedOperationError("unreachable node", target_nodes[t])
    only = tuple(ks[0] if len(ks) == 1 else -1 for ks in target_pairs)
    return Decomposition(
        graph, acts, edges, act_edges, tuple(sources), tuple(pairs), target_pairs, len(edges), only
    )


def _steps(graph: Graph, name: str, region: list[Node], owners: dict[str, int], s: int):
    live_names = {n.name for n in region} | {name}
    steps = []
    for node in region:
        live = tuple(i in live_names for i in node.inputs)
        owned = owners[node.name] == s
        simple = isinstance(node.op, UnaryAffineOp) or (owned and all(live))
        offset = None if simple or owned else _offset(node, graph)
        shapes = tuple(graph[i].shape for i in node.inputs)
        steps.append(Step(node, live, owned, shapes, offset))
    return tuple(steps)


def _chain(name: str, steps: tuple[Step, ...], targets: list[str]):
    """The ops of a region that is a path of owned unary ops ending at its only target."""
    if len(targets) != 1 or targets[0] != (steps[-1].node.name if steps else name):
        return None
    previous = name
    for step in steps:
        if not (isinstance(step.node.op, UnaryAffineOp) and step.owned):
            return None
        if step.node.inputs != (previous,):
            return None
        previous = step.node.name
    return tuple(step.node.op for step in steps)


def _apply(step: Step, parts: list[Tensor | None]) -> Tensor:
    """The source's share of `step.node` from its inputs' shares (None: not live)."""
    op = step.node.op
    if isinstance(op, UnaryAffineOp):
        return op.forward(parts[0]) if step.owned else op.linear(parts[0])
    like = next(p for p in parts if p is not None)
    full = [
        p if p is not None else like.new_zeros(like.shape[0], *shape)
        for p, shape in zip(parts, step.zero_shapes)
    ]
    out = op.forward(*full)
    if not step.owned and step.offset is not None:
        out = out - step.offset.to(out.dtype)
    return out


def push_forward(net: Decomposition, s: int, value: Tensor) -> tuple[Tensor, ...]:
    """Source s's shares of its targets for its value `[B, S, *shape]`, one per pair of
    `net.sources[s].pairs`, each `[B, S, *target_shape]` (the owner's include the offsets)."""
    source = net.sources[s]
    lead = value.shape[:2]
    flat = value.reshape(lead[0] * lead[1], *value.shape[2:])
    if source.chain is not None:
        for op in source.chain:
            flat = op.forward(flat)
        return (flat.reshape(*lead, *flat.shape[1:]),)
    values = {source.name: flat}
    for step in source.region:
        parts = [values[i] if ok else None for i, ok in zip(step.node.inputs, step.live)]
        values[step.node.name] = _apply(step, parts)
    out = []
    for k in source.pairs:
        flat = values[net.pairs[k].node]
        out.append(flat.reshape(*lead, *flat.shape[1:]))
    return tuple(out)


def pull_back(net: Decomposition, s: int, coeffs: tuple[Tensor, ...]) -> Tensor | None:
    """The functional on source s's value (`[B, S, *shape]`) of `sum_k coeffs[k] . share_k`,
    `coeffs[k]` on pair `net.sources[s].pairs[k]`'s node: the vjp through the source's region
    (biases excluded). None when the source has no pairs."""
    source = net.sources[s]
    if source.chain is not None:
        (A,) = coeffs
        lead = A.shape[:2]
        flat = A.reshape(lead[0] * lead[1], *A.shape[2:])
        for op in reversed(source.chain):
            flat = op.adjoint(flat)
        return flat.reshape(*lead, *source.shape)
    pending: dict[str, Tensor] = {}
    for k, coeff in zip(source.pairs, coeffs):
        node = net.pairs[k].node
        pending[node] = pending[node] + coeff if node in pending else coeff
    for step in reversed(source.region):
        A = pending.pop(step.node.name)
        for name, part, ok in zip(step.node.inputs, step.node.op.vjp(A), step.live):
            if ok:
                pending[name] = pending[name] + part if name in pending else part
    return pending.get(source.name)
