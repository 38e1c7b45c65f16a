"""`verify.bounds`: sound bounds on a network's outputs (or linear functions of them).

Shapes. `bounds` takes its region with a batch axis: `x`, `lower` and `upper` of shape
`[batch, *input_shape]` (e.g. `[1, 64]` for one input of a network taking `(64,)`; a tensor of
exactly the network's `input_shape` is read as a batch of one). `verify.monitor` takes one
sample's box instead (`(64,)`, or `[k, 64]` for k regions) and accepts `[1, 64]` where that is
unambiguous (see `verify.monitor.api`); a shape that fits neither is a `ShapeMismatchError`
naming the expected `[batch, *input_shape]`.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import fields, replace
from typing import Any

import torch
from torch import nn

from bounds.compile import CompileMode, check_mode
from bounds.errors import (
    InvalidLimitError,
    InvalidNetworkError,
    InvalidRegionError,
    ShapeMismatchError,
)
from bounds.graph.graph import Graph, build_graph
from bounds.registry import get_method
from bounds.types import Bounds, Budget, Interval
from verify.region import as_tensor, input_box, output_spec


def network_graph(net: nn.Module | Graph, input_shape: tuple[int, ...]) -> Graph:
    """The BoundOp graph of `net` for inputs `[batch, *input_shape]`.

    Built anew on every call: a cache keyed on the module would have to capture everything that
    decides its function (structure, attributes, hooks, parameters, buffers, training flags, even
    globals its `forward` reads), and a stale entry is an unsound bound. Measured on ACAS Xu,
    mnist_fc 256x6 and OVAL cifar_base (`python benchmarks/graph_build.py`): a build takes
    0.6-2.0 ms against 5.9-8.1 ms for one CROWN bound, and hashing the weights for a key alone
    would take 0.1-1.7 ms of it, so a cache does not pay. Callers that bound one network many
    times (branch and bound) build the `Graph` once and pass it: a `Graph` is immutable.

    Args:
        net: a `torch.nn.Module` (eval mode; not modified) or a `Graph` (returned as it is).
        input_shape: one input's shape, without the batch axis.

    Returns:
        The immutable `Graph`, holding copies of the weights.

    Raises:
        ShapeMismatchError: a `Graph` built for another input shape.
        TypeError: `net` is neither a module nor a graph.
        InvalidNetworkError: a module whose output depends on its training flag.
        UnsupportedOperationError: an operation outside the supported set (named with its
            node).
    """
    if isinstance(net, Graph):
        if net.input.shape != tuple(input_shape):
            raise ShapeMismatchError(f"graph input {net.input.shape} != region {input_shape}")
        return net
    if not isinstance(net, nn.Module):
        raise TypeError(f"net must be a torch.nn.Module or a Graph, got {type(net).__name__}")
    return build_graph(net, tuple(input_shape))


def _dtype(net: nn.Module | Graph) -> torch.dtype:
    """The dtype of the network's first floating-point parameter or buffer (or constant)."""
    if isinstance(net, nn.Module):
        tensors = [*net.parameters(), *net.buffers()]
    elif isinstance(net, Graph):
        tensors = [t for n in net.nodes[1:] for t in n.op.constants()]
    else:  # not a network: `network_graph` raises the clear error
        tensors = []
    floats = [t for t in tensors if t.is_floating_point()]
    return floats[0].dtype if floats else torch.get_default_dtype()


def _budget(budget: Budget | int | float | None) -> Budget | None:
    """`budget` as a `Budget`: an int is iterations, a float seconds (validated up front)."""
    if budget is None or isinstance(budget, Budget):
        return budget
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise InvalidLimitError(
            f"budget must be a Budget, an int (iterations) or a float (seconds), got {budget!r}"
        )
    if isinstance(budget, numbers.Integral):
        return Budget(iterations=int(budget))
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
    names = {n.name for n in graph.nodes[1:]}
    for name, value in node_bounds.items():
        if name not in names:
            known = ", ".join(repr(n) for n in graph.pre_activation_names())
            raise ShapeMismatchError(
                f"node_bounds names unknown node {name!r} (pre-activation nodes: {known})"
            )
        if isinstance(value, Interval):
            lower, upper = value.lower, value.upper
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            lower, upper = value
        else:
            raise InvalidRegionError(
                f"node_bounds[{name!r}] must be an Interval or a (lower, upper) pair"
            )
        shape = (batch, *graph[name].shape)
        pair = []
        for side, v in (("lower", lower), ("upper", upper)):
            t = as_tensor(v, f"node_bounds[{name!r}].{side}", dtype, device, allow_inf=True)
            if torch.isnan(t).any():
                raise InvalidRegionError(f"node_bounds[{name!r}].{side} contains NaN")
            try:
                pair.append(t.expand(shape))
            except RuntimeError as exc:
                raise ShapeMismatchError(
                    f"node_bounds[{name!r}].{side} has shape {tuple(t.shape)}; node {name!r} "
                    f"needs [batch, *shape] = {list(shape)}"
                ) from exc
        bad = (pair[0] > pair[1]).nonzero()
        if bad.numel():
            idx = tuple(bad[0].tolist())
            raise InvalidRegionError(
                f"node_bounds of {name!r} are empty (lower > upper) at index {idx}"
            )
        out[name] = Interval(*pair)
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
    exact: bool = True,
    **options: Any,
) -> Bounds:
    """Sound lower/upper bounds on `C @ net(x')` for every `x'` in the input region.

    The region is the L-inf ball of radius `eps` around `x`, clipped to `domain` if given, or
    the box `lower <= x' <= upper`. The bounds hold in exact arithmetic on the stored weights
    although computed in floating point (`exact=True`, the default; see `bounds.rounding`).

    Args:
        net: a `torch.nn.Module` in eval mode (traced by torch.fx) or a `Graph` from
            `network_graph`; it is not modified.
        eps: the ball's radius: a float, or a tensor broadcastable to `x` (`[batch,
            *input_shape]`).
        x: the ball's centre, `[batch, *input_shape]`; a tensor of exactly the network's
            `input_shape` is a batch of one.
        lower: the box's lower corner, `[batch, *input_shape]` (with `upper`, instead of `x`).
        upper: the box's upper corner, the shape of `lower`.
        C: `[batch, n_specs, n_outputs]` or `[n_specs, n_outputs]`: bound the rows of
            `C @ y` (`y` the flattened outputs); default: the outputs themselves.
        domain: `(low, high)` clipping the ball (e.g. `(0, 1)` for pixels).
        input_shape: the network's input shape without the batch axis, where the module
            does not declare `input_shape` and `x` / `lower` do not show it.
        method: one of `bounds.available_methods()`, e.g. ibp, crown, alpha-crown, prox,
            active-set, lp, milp.
        budget: `Budget(iterations=, seconds=)`, an int (iterations) or a float (seconds), for
            iterative methods; the seconds count from the call.
        node_bounds: extra bounds valid on the region, `{node name: Interval or (lower,
            upper)}` with `[batch, *node_shape]` tensors (e.g. ReLU splits of branch-and-bound
            domains: `lower = 0` for active neurons, `upper = 0` for inactive ones); every
            method intersects them in. Node names: the keys of `Bounds.intermediate`.
        config: the method's frozen config dataclass (instead of keyword options).
        compile: torch.compile the iterative methods' steps (True / False / "auto": on CUDA;
            see `bounds.compile`); ignored by the one-pass methods (ibp, crown, lp, milp).
        exact: the bounds hold in floating point (the default). `exact=False` gives ibp,
            crown and alpha-crown a faster path in the network's dtype without the backward
            passes' rounding accounted for: NOT sound in floating point (branch and bound
            searches with it and rechecks every closing bound with `exact=True`).
        **options: the method's options as keywords (e.g. `iterations=50, lr=0.05`).

    Returns:
        `Bounds(lower, upper, intermediate, stats)`: `lower` and `upper` `[batch, n_specs]`;
        `intermediate` maps each pre-activation node's name to its `Interval`
        (`[batch, *node_shape]`); `stats` the method, iterations, seconds and trajectory.

    Raises:
        InvalidRegionError: NaN/Inf or empty boxes, a negative `eps`, a point outside
            `domain`, bad `node_bounds` (the argument and index named).
        ShapeMismatchError: a region, `eps` or `C` whose shape does not fit the network.
        InvalidLimitError: a budget that is not a finite number > 0.
        InvalidNetworkError: a module whose output depends on its training flag, float16 /
            meta weights, or bounds that are not finite.
        UnsupportedOperationError: an operation or activation outside the supported set
            (named with its node).
        ValueError: an unknown method or option.
    """
    start = time.perf_counter()
    limits = _budget(budget)
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
    if limits is not None and limits.seconds is not None:  # the seconds count from the call
        left = limits.seconds - (time.perf_counter() - start)
        limits = Budget(limits.iterations, max(left, 1e-6))
    with torch.no_grad():
        low, up, intervals, stats = chosen.run(graph, box, spec, cfg, limits, given, exact)
    if not (torch.isfinite(low).all() and torch.isfinite(up).all()):
        raise InvalidNetworkError("bounds are not finite: check the weights' magnitudes")
    pre = {name: intervals[name] for name in graph.pre_activation_names()}
    stats = {"method": method, **stats, "seconds": time.perf_counter() - start}
    return Bounds(low, up, pre, stats)
