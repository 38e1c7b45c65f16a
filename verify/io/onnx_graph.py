"""The structure of an ONNX graph (used by `verify.io.onnx_loader`, before any node is
translated): at least one output, every name defined once and read only once defined, and the
nodes in topological order (sorted when the file lists them out of order; a cycle is named)."""

from __future__ import annotations

import heapq

import onnx

from bounds.errors import InvalidNetworkError
from verify.errors import SpecificationError
from verify.io.onnx_checks import node_label


def describe(node: onnx.NodeProto) -> str:
    """`node 'name' (OpType)`, as errors name a node."""
    return f"node {node_label(node)!r} ({node.op_type})"


def check_structure(graph: onnx.GraphProto, path: str) -> None:
    """At least one output; every node input is defined once; no cycle. Sorts the nodes
    topologically (in place) when they are listed out of order."""
    if not graph.output:
        raise SpecificationError("expected at least one graph output, found 0", path)
    given = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    producer: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for name in filter(None, node.output):
            if name in given or name in producer:
                other = describe(producer[name]) if name in producer else "an input/initializer"
                raise InvalidNetworkError(
                    f"{path}: {describe(node)} writes {name!r}, already defined by {other}"
                )
            producer[name] = node
    for node in graph.node:
        for name in filter(None, node.input):
            if name not in given and name not in producer:
                raise InvalidNetworkError(
                    f"{path}: {describe(node)} reads {name!r}, which no node, initializer or "
                    "graph input defines"
                )
    for output in (o.name for o in graph.output):
        if output not in given and output not in producer:
            raise SpecificationError(f"the graph output {output!r} is defined by no node", path)
    order = _topological_order(list(graph.node), producer, path)
    if [id(n) for n in order] != [id(n) for n in graph.node]:
        copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in order]
        del graph.node[:]
        graph.node.extend(copies)


def _topological_order(
    nodes: list[onnx.NodeProto], producer: dict[str, onnx.NodeProto], path: str
) -> list[onnx.NodeProto]:
    """Kahn's algorithm, keeping the file's order among ready nodes; names a cycle if any."""
    index = {id(n): k for k, n in enumerate(nodes)}
    deps = [{index[id(producer[i])] for i in n.input if i in producer} for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    waiting = [len(ds) for ds in deps]
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        raise InvalidNetworkError(f"{path}: the graph has a cycle: {_cycle(nodes, deps, order)}")
    return [nodes[k] for k in order]


def _cycle(nodes: list[onnx.NodeProto], deps: list[set[int]], done: list[int]) -> str:
    """'a (Relu) -> b (Relu) -> a (Relu)': walk back along unfinished dependencies."""
    left = set(range(len(nodes))) - set(done)
    walk = [min(left)]
    while True:
        nxt = min(d for d in deps[walk[-1]] if d in left)
        if nxt in walk:
            loop = [*walk[walk.index(nxt) :], nxt][::-1]
            return " -> ".join(f"{node_label(nodes[k])!r} ({nodes[k].op_type})" for k in loop)
        walk.append(nxt)
