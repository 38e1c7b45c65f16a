"""`verify.bounds`: sound bounds on a network's outputs (or linear functions of them)."""

from __future__ import annotations

import time
import weakref
from dataclasses import fields, replace
from typing import Any

import torch
from torch import nn

from bounds.compile import CompileMode, check_mode
from bounds.errors import InvalidNetworkError, InvalidRegionError, ShapeMismatchError
from bounds.graph import Graph, build_graph
from bounds.registry import get_method
from bounds.types import Bounds, Budget, Interval
from verify.region import input_box, output_spec

_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state_key(net: nn.Module) -> tuple:
    tensors = list(net.parameters()) + list(net.buffers())
    return tuple((t.data_ptr(), t._version) for t in tensors)


def network_graph(net: nn.Module | Graph, input_shape: tuple[int, ...]) -> Graph:
    """The BoundOp graph of `net` for inputs `[batch, *input_shape]` (cached per module state)."""
    if isinstance(net, Graph):
        if net.input.shape != tuple(input_shape):
            raise ShapeMismatchError(f"graph input {net.input.shape} != region {input_shape}")
        return net
    if not isinstance(net, nn.Module):
        raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
    key = (tuple(input_shape), _state_key(net))
    cached = _GRAPHS.get(net)
    if cached is not None and cached[0] == key:
        return cached[1]
    graph = build_graph(net, tuple(input_shape))
    _GRAPHS[net] = (key, graph)
    return graph


def _dtype(net: nn.Module | Graph) -> torch.dtype:
    tensors = list(net.parameters()) if isinstance(net, nn.Module) else []
    if not tensors and isinstance(net, Graph):
        tensors = [t for n in net.nodes[1:] for t in n.op.constants()]
    return tensors[0].dtype if tensors else torch.get_default_dtype()


def _budget(budget: Budget | int | float | None) -> Budget | None:
    if budget is None or isinstance(budget, Budget):
        return budget
    if isinstance(budget, bool):
        raise TypeError("budget must be a Budget, an int (iterations) or a float (seconds)")
    if isinstance(budget, int):
        return Budget(iterations=budget)
    return Budget(seconds=float(budget))


def _config(method, config: Any, options: dict[str, Any], compile_mode: CompileMode):
    check_mode(compile_mode)
    known = {f.name for f in fields(method.config_type)}
    if config is not None and options:
        raise TypeError("give either config= or keyword options, not both")
    if config is not None:
        if not isinstance(config, method.config_type):
            raise TypeError(f"{method.name} takes a {method.config_type.__name__} config")
        if "compile" in known and compile_mode != "auto":
            config = replace(config, compile=compile_mode)
        return config
    if "compile" in known and "compile" not in options:
        options = {**options, "compile": compile_mode}
    unknown = set(options) - known
    if unknown:
        raise TypeError(
            f"unknown options for {method.name}: {sorted(unknown)}; known: {sorted(known)}"
        )
    return method.config_type(**options)


def _node_bounds(graph: Graph, node_bounds, box: Interval) -> dict[str, Interval] | None:
    """Validated `node_bounds`: known node names, `[batch, *shape]` tensors, lower <= upper."""
    if not node_bounds:
        return None
    out = {}
    batch, dtype, device = box.lower.shape[0], box.lower.dtype, box.lower.device
    for name, value in node_bounds.items():
        if name not in {n.name for n in graph.nodes[1:]}:
            raise ShapeMismatchError(f"node_bounds names unknown node {name!r}")
        lower, upper = (value.lower, value.upper) if isinstance(value, Interval) else value
        shape = (batch, *graph[name].shape)
        lower = torch.as_tensor(lower, dtype=dtype, device=device).expand(shape)
        upper = torch.as_tensor(upper, dtype=dtype, device=device).expand(shape)
        if (lower > upper).any():
            raise InvalidRegionError(f"node_bounds of {name!r} are empty (lower > upper)")
        out[name] = Interval(lower, upper)
    return out


def bounds(
    net: nn.Module | Graph,
    eps: float | Any = None,
    *,
    x: Any = None,
    lower: Any = None,
    upper: Any = None,
    C: Any = None,
    domain: tuple[float, float] | None = None,
    input_shape: tuple[int, ...] | None = None,
    method: str = "alpha-crown",
    budget: Budget | int | float | None = None,
    node_bounds: dict[str, Any] | None = None,
    config: Any = None,
    compile: CompileMode = "auto",
    **options: Any,
) -> Bounds:
    """Sound lower/upper bounds on `C @ net(x')` for every `x'` in the input region.

    Region: the L-inf ball of radius `eps` around `x` (`[batch, *input_shape]`, or one input of
    the network's `input_shape`), clipped to `domain` if given; or the box `lower`/`upper`.
    `C`: `[batch, n_specs, n_out]` or `[n_specs, n_out]`; default: the outputs themselves.
    `method`: one of `bounds.registry.available_methods()` (ibp, crown, alpha-crown, lp, milp).
    `budget`: `Budget(iterations=, seconds=)`, an int (iterations) or a float (seconds), for
    iterative methods. Method options as keywords (e.g. `iterations=50, lr=0.05`) or `config=`.
    `node_bounds`: extra bounds valid on the region, `{node name: Interval or (lower, upper)}`
    with `[batch, *shape]` tensors (e.g. ReLU splits of branch-and-bound domains: `lower = 0`
    for active neurons, `upper = 0` for inactive ones); every method intersects them in.
    `compile`: torch.compile the iterative methods' steps (True / False / "auto": on CUDA; see
    `bounds.compile`); ignored by the one-pass methods (ibp, crown, lp, milp).

    Returns `Bounds(lower [B, S], upper [B, S], intermediate, stats)`; `intermediate` maps each
    pre-activation node's name to its `Interval`.
    """
    start = time.perf_counter()
    chosen = get_method(method)
    cfg = _config(chosen, config, options, compile)
    shape_hint = input_shape or getattr(net, "input_shape", None)
    dtype = _dtype(net)
    ref = x if x is not None else lower
    device = ref.device if isinstance(ref, torch.Tensor) else None
    box = input_box(eps=eps, x=x, lower=lower, upper=upper, domain=domain,
                    input_shape=shape_hint, dtype=dtype, device=device)  # fmt: skip
    graph = network_graph(net, tuple(box.lower.shape[1:]))
    if device is not None and device.type != "cpu":
        graph = graph.to(dtype, device)
    n_out = int(torch.Size(graph.output.shape).numel())
    spec = output_spec(C, box.lower.shape[0], n_out, dtype, box.lower.device)
    given = _node_bounds(graph, node_bounds, box)
    with torch.no_grad():
        low, up, intervals, stats = chosen.run(graph, box, spec, cfg, _budget(budget), given)
    if not (torch.isfinite(low).all() and torch.isfinite(up).all()):
        raise InvalidNetworkError("bounds are not finite: check the weights' magnitudes")
    pre = {name: intervals[name] for name in graph.pre_activation_names()}
    stats = {"method": method, **stats, "seconds": time.perf_counter() - start}
    return Bounds(low, up, pre, stats)
