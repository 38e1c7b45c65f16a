"""The bound methods of input splitting, called through the registry (`bounds.registry`) on the
graph the search already has: `bounds` (one method on a batch of boxes), `method_config` (a
method's options as its frozen config, built once when the search is configured) and the float64
rechecks of closing bounds (`Recheck`, by method: `RECHECKS`, chosen once at configuration)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from torch import Tensor, nn

from bounds.errors import InvalidNetworkError
from bounds.graph.graph import Graph
from bounds.methods.alpha_crown import AlphaCrownConfig, alpha_crown
from bounds.methods.crown import crown, crown_intervals
from bounds.registry import Method, get_method
from bounds.types import Bounds, Budget, Interval
from verify.api import network_graph
from verify.attack import UnsafeSpec, min_max
from verify.bab.branchers import Registry
from verify.region import output_spec


def method_config(method: Method, options: dict[str, Any]) -> Any:
    """`options` as `method`'s frozen config (`compile` "auto" unless given, as `verify.bounds`
    does)."""
    known = {f.name for f in fields(method.config_type)}
    if "compile" in known and "compile" not in options:
        options = {**options, "compile": "auto"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(
            f"unknown options for {method.name}: {sorted(unknown)}; known: {sorted(known)}"
        )
    return method.config_type(**options)


def bounds(
    net: Graph | nn.Module, *, lower: Tensor, upper: Tensor, C: Tensor, method: Method | str,
    exact: bool = True, budget: Budget | None = None, config: Any = None,
) -> Bounds:  # fmt: skip
    """Bounds of `C y` (`C [m, n_out]` shared by the boxes, or `[N, m, n_out]`) on the boxes
    `lower`, `upper [N, *input_shape]` by `method` (a registered `Method`; a name is looked up)
    with `config` (default: the method's defaults), directly on the graph (a module is built
    into one), without the public API's checks: the search's boxes and specs are in shape."""
    chosen = get_method(method) if isinstance(method, str) else method
    graph = network_graph(net, tuple(lower.shape[1:])) if isinstance(net, nn.Module) else net
    cfg = method_config(chosen, {}) if config is None else config
    box = Interval(lower, upper)
    n_out = int(torch.Size(graph.output.shape).numel())
    spec = output_spec(C, lower.shape[0], n_out, lower.dtype, lower.device)
    with torch.no_grad():
        low, up, intervals, stats = chosen.run(graph, box, spec, cfg, budget, None, exact)
    if not (torch.isfinite(low).all() and torch.isfinite(up).all()):
        raise InvalidNetworkError("bounds are not finite: check the weights' magnitudes")
    pre = {name: intervals[name] for name in graph.pre_activation_names()}
    return Bounds(low, up, pre, {"method": chosen.name, **stats})


class Recheck:
    """The float64 recheck of a method's closing bounds (`verify.bab.common.Float64Check`):
    `lower64(graph, box, C, slopes)` lower bounds of `C y` `[K, m]` on the float64 `box`, with
    the same relaxation as the search's bound. Default: the method itself, exactly."""

    def __init__(self, method: Method, config: Any, spec: UnsafeSpec, tol: Tensor) -> None:
        self.method, self.config, self.spec, self.tol = method, config, spec, tol

    def lower64(self, graph: Graph, box: Interval, C: Tensor, slopes: dict[str, Tensor]) -> Tensor:
        return bounds(graph, lower=box.lower, upper=box.upper, C=C, method=self.method,
                      config=self.config).lower  # fmt: skip


RECHECKS: Registry[type[Recheck]] = Registry("recheck")


@RECHECKS.register("crown")
class CrownRecheck(Recheck):
    """Float64 CROWN lower bounds `[K, m]` on the boxes; for the boxes it leaves open, also
    with every neuron bounded by CROWN (a box's float32 bound depended a little on its batch,
    see `crown_intervals`), keeping the better (both are valid)."""

    def lower64(self, graph: Graph, box: Interval, C: Tensor, slopes: dict[str, Tensor]) -> Tensor:
        spec = self.spec
        lower = crown(graph, box, C)[0]
        margin = min_max(lower - spec.b - self.tol, spec.owner, spec.n_polytopes)
        again = (margin <= 0).nonzero().flatten()
        if len(again):
            sub = Interval(box.lower[again], box.upper[again])
            lower[again] = torch.maximum(lower[again], crown(graph, sub, C[again], None, True)[0])
        return lower


@RECHECKS.register("alpha-crown")
class AlphaCrownRecheck(Recheck):
    """alpha-CROWN's certificate: one float64 pass at the slopes that gave the bound (the
    method itself when it reported none)."""

    def lower64(self, graph: Graph, box: Interval, C: Tensor, slopes: dict[str, Tensor]) -> Tensor:
        if not slopes:
            return super().lower64(graph, box, C, slopes)
        config = AlphaCrownConfig(iterations=0, optimize_intermediate=False, compile=False)
        base = crown_intervals(graph, box, every_neuron=True)
        return alpha_crown(graph, box, C, config, intervals=base, init_slopes=slopes)[0]


def recheck_of(method: Method, config: Any, spec: UnsafeSpec, tol: Tensor) -> Recheck:
    """The recheck registered for `method` (`RECHECKS`), else the default `Recheck`."""
    cls = RECHECKS.get(method.name) if method.name in RECHECKS.names() else Recheck
    return cls(method, config, spec, tol)
