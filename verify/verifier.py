"""`verify.verify`: decide a VNN-LIB property by attack, then branch and bound (on a ReLU network
input and ReLU splitting as a portfolio, `verify.bab.portfolio`; input splitting otherwise;
certificate mode and Ray shards: one mode, `verify.bab.splitting_mode`).

Answers: "unsat" (the property holds: every region's domains were pruned by sound bounds),
"sat" (a counterexample validated by a float64 forward pass), "timeout" (the time limit came
first) or "unknown" (interrupted, a domain limit, or an unsupported specification).

The time limit holds for every stage (the attack, the root bounds and their intermediate-bound
optimisation, each bounding chunk, the float64 rechecks): each is given the deadline and checks
the host clock between iterations, chunks or layers, so an answer comes within a chunk of it.
"""

from __future__ import annotations

import copy
import math
import numbers
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from bounds.errors import InvalidLimitError, ShapeMismatchError
from bounds.graph.graph import build_graph
from verify.argmax_output import ArgOutput
from verify.argmax_output import indices as argmax_indices
from verify.argmax_output import rewrite as rewrite_argmax
from verify.attack import AttackConfig, find_counterexample, validate
from verify.bab import BabConfig, input_shape, solve_region, splitting_mode
from verify.bab.common import RegionOutcome
from verify.bab.input.certify import CertifyingBab, Recorder, certificate_config
from verify.bab.relu.certify import (
    CertifyingReluBab,
    ReluRecorder,
    chain_layers,
    relu_certificate_config,
)
from verify.certificate.store import CertificateWriter, sha256_file
from verify.distributed.shards import ShardedSolver
from verify.errors import CertificateUnsupportedError
from verify.input_rows import strip_inputs, with_input_rows
from verify.io.onnx_loader import load_onnx
from verify.io.vnnlib_common import ParseDeadlineError
from verify.io.vnnlib_load import load_vnnlib
from verify.product import Product, is_several, product_network
from verify.property import Region, VnnlibProperty
from verify.result import VerificationResult
from verify.screen import screen


def _load(net: nn.Module | str | os.PathLike | Sequence, spec,
          deadline: float | None = None) -> tuple[nn.Module, VnnlibProperty]:  # fmt: skip
    """The network (a property over several networks: the product of one model or path per
    declared network, `verify.product`) and the property (read by `deadline`, else
    `ParseDeadlineError`)."""
    if isinstance(spec, (str, os.PathLike)):
        spec = load_vnnlib(spec, deadline=deadline)
    if not isinstance(spec, VnnlibProperty):
        raise TypeError(f"spec must be a VnnlibProperty or a path, got {type(spec).__name__}")
    if is_several(net) or (spec.networks and not isinstance(net, Product)):
        nets = list(net) if is_several(net) else [net]
        nets = [load_onnx(n) if isinstance(n, (str, os.PathLike)) else n for n in nets]
        return product_network(nets, spec), spec
    if isinstance(net, (str, os.PathLike)):
        net = load_onnx(net)
    arg = getattr(net, "argmax_output", None)
    if isinstance(arg, ArgOutput):  # a final ArgMax: the property restated on its logits
        spec = rewrite_argmax(spec, arg)
    return net, spec


def check_timeout(timeout: Any) -> float:
    """`timeout` as float seconds; `InvalidLimitError` unless a finite number > 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidLimitError(f"timeout must be a number of seconds, got {timeout!r}")
    seconds = float(timeout)
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidLimitError(f"timeout must be finite and > 0 seconds, got {timeout!r}")
    return seconds


def check_sizes(net: nn.Module, spec: VnnlibProperty) -> None:
    """`ShapeMismatchError` (naming the spec file and both sizes) unless the network takes the
    spec's number of inputs and gives its number of outputs (one forward pass at the first
    region's lower corner when the net does not declare its shapes)."""
    n_in, n_out = spec.n_inputs, spec.n_outputs
    for k, region in enumerate(spec.regions):
        if len(region.lower) != n_in:
            raise ShapeMismatchError(
                f"{spec.path}: region {k} has {len(region.lower)} inputs, the header {n_in}"
            )
        for poly in region.unsafe:
            if poly.A.shape[1] != n_out:
                raise ShapeMismatchError(
                    f"{spec.path}: region {k} constrains {poly.A.shape[1]} outputs, not {n_out}"
                )
    shape = getattr(net, "input_shape", None)
    if shape is not None and math.prod(shape) != n_in:
        raise ShapeMismatchError(
            f"{spec.path} has {n_in} inputs but the network takes {math.prod(shape)} "
            f"(input shape {tuple(shape)})"
        )
    declared = getattr(net, "output_shape", None)
    if declared is not None:
        got = math.prod(declared)
    else:
        param = next(net.parameters(), None)
        dtype = param.dtype if param is not None else torch.get_default_dtype()
        device = param.device if param is not None else None
        x = torch.zeros(1, *(shape or (n_in,)), dtype=dtype, device=device)
        try:
            with torch.no_grad():
                got = net(x).numel()
        except (RuntimeError, ValueError, IndexError, TypeError) as error:
            raise ShapeMismatchError(
                f"{spec.path} has {n_in} inputs but the network rejects inputs of shape "
                f"{tuple(x.shape[1:])}: {error}"
            ) from error
    if got != n_out:
        raise ShapeMismatchError(f"{spec.path} has {n_out} outputs but the network gives {got}")


def check_workers(workers: Any) -> int:
    """`workers` as an int; `InvalidLimitError` unless an integer >= 1."""
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise InvalidLimitError(f"workers must be an integer >= 1, got {workers!r}")
    return int(workers)


def region_solver(workers: int, ray_address: str | None) -> Callable[..., RegionOutcome]:
    """`solve_region` for one worker and no cluster address (today's path, no Ray); else the
    sharded solver with the same signature (which imports Ray, and connects, only then)."""
    if workers == 1 and ray_address is None:
        return solve_region
    return ShardedSolver(workers, ray_address)


def _attack_all(net, regions: list[Region], config: AttackConfig, seed: int, deadline: float):
    """A validated `(x, y)` from a PGD attack on any of the regions, or None (also once the
    deadline has passed)."""
    for region in regions:
        if time.monotonic() >= deadline:
            return None
        x = find_counterexample(net, region, config=config, seed=seed, deadline=deadline)
        if x is not None:
            return validate(net, region, x)
    return None


def evaluation_mode(net: nn.Module) -> nn.Module:
    """`net` when no submodule is in training mode, else an eval-mode deep copy: verification
    is of the inference network, and the caller's module (and its flags) is never changed."""
    if any(m.training for m in net.modules()):
        return copy.deepcopy(net).eval()
    return net


def verify(
    net: nn.Module | str | os.PathLike,
    spec: VnnlibProperty | str | os.PathLike,
    *,
    timeout: float = 60.0,
    method: str | None = None,
    config: BabConfig | None = None,
    splitting: str | None = None,
    seed: int = 0,
    workers: int = 1,
    ray_address: str | None = None,
    certificate: str | os.PathLike | None = None,
    hashes: tuple[str, str] | None = None,
) -> VerificationResult:
    """Decide `spec` on `net` within `timeout` seconds (the budget starts at the call).

    An attack, then branch and bound on each region of the property: `unsat` when no input of
    any region reaches an unsafe polytope, `sat` with a counterexample checked in float64 on the
    CPU, else `unknown` or `timeout`. The network runs in its own dtype and device; a module
    in training mode is verified as an eval-mode copy (the caller's flags are left alone).

    `workers` > 1 (or a Ray cluster's `ray_address`) shards each region's branch and bound over
    that many Ray actors (`verify.distributed.shards`; the same answers as one worker, within
    the same time limit). It uses this process's Ray connection, or starts a local cluster of
    `workers` CPUs and keeps it for later calls; starting the cluster (seconds) comes before
    the time limit's clock, the workers' start (seconds too, the first time) within it, while
    this process searches.

    Certificate mode (`certificate=`, one worker) splits as `splitting_mode` says: inputs, with
    the configuration's methods (CROWN, and alpha-CROWN on its output slopes from
    `strong_depth` on: `verify.bab.input.certify.certificate_config`), or ReLUs, bounded by
    alpha-beta-CROWN on CROWN's root intermediate bounds, without root tightening nor hard
    bounder (`verify.bab.relu.certify.relu_certificate_config`).

    Args:
        net: an ONNX path (`.onnx` / `.onnx.gz`), a `torch.nn.Module` taking `[batch,
            *input_shape]`, or a list of them for a property over several networks (their
            product, `verify.product`).
        spec: a VNN-LIB path (1.0 or 2.0) or a loaded `VnnlibProperty`; its regions' boxes are
            `[n_inputs]` (the flattened input) and its polytopes' rows `[m, n_outputs]`.
        timeout: seconds, a finite number > 0.
        method: the bound method for every domain of input splitting (`config.method` is
            replaced by it, and `config.fast_method` turned off; the rest of `config` defaults
            to `BabConfig()`); None: `config`'s (by default CROWN, or the `forward` method
            where it is at least 1.5 times as fast on the region's box); ReLU splitting bounds its
            domains by alpha-beta-CROWN.
        config: the branch-and-bound settings (`BabConfig`, with `ReluSplitConfig` for ReLU
            splitting).
        splitting: "auto", "input" or "relu" (replaces `config.splitting` when given; "auto":
            on a ReLU network both as a portfolio, `verify.bab.portfolio`).
        seed: the attack's random seed.
        workers: an integer >= 1: Ray workers (extra `[distributed]`) when > 1.
        ray_address: join this Ray cluster (e.g. "auto") instead of starting a local one.
        certificate: a path where an "unsat" or "sat" answer's proof certificate is written
            (`verify.certificate`; other answers leave a file without manifest).
        hashes: `(network_sha256, property_sha256)`, needed with `certificate` when `net` and
            `spec` are not paths (for paths, the files' own hashes).

    Returns:
        A `VerificationResult`: `status` ("unsat", "sat", "unknown" or "timeout"),
        `counterexample` (`[n_inputs]` float64, or None) and `results_text()`, the VNN-COMP
        results file.

    Raises:
        InvalidLimitError: a timeout that is not a finite number > 0, or `workers` < 1.
        ShapeMismatchError: the property's numbers of inputs or outputs are not the
            network's.
        SpecificationError: an unreadable or malformed ONNX or VNN-LIB file (named with its
            line).
        UnsupportedOperationError: an operation outside the supported set (named with its
            node).
        CertificateUnsupportedError: a certificate asked of several workers or of a setting
            that cannot write one.
        RayUnavailableError: `workers` > 1 without Ray installed.
        ClusterError: the Ray cluster cannot be reached.

    Every error is raised before any search.
    """
    seconds = check_timeout(timeout)
    config = config or BabConfig()
    if method is not None:
        config = replace(config, method=method, fast_method=None)
    if splitting is not None:
        config = replace(config, splitting=splitting)
    if certificate is not None:
        if check_workers(workers) != 1 or ray_address is not None:
            raise CertificateUnsupportedError("certificates are written by one worker only")
        return _verify_certified(net, spec, certificate, hashes, seconds, config, seed)
    solve = region_solver(check_workers(workers), ray_address)  # may start Ray: before the clock
    return _run(net, spec, solve, seconds, config, seed)


def _run(net, spec, solve: Callable[..., RegionOutcome], seconds: float, config: BabConfig,
         seed: int, screened: bool = True) -> VerificationResult:  # fmt: skip
    """The attack, then `solve` on each region, within `seconds` (`verify`). `screened`: a
    property of several regions first drops those one batched float64 CROWN bound proves
    (`verify.screen`; not in certificate mode, where every region needs its leaves)."""
    start = time.monotonic()
    deadline = start + seconds
    stats: dict[str, Any] = {"regions": []}
    status, found = "unknown", None
    try:
        net, spec = _load(net, spec, deadline)
        arg = getattr(net, "argmax_output", None)
        net = evaluation_mode(net)
        check_sizes(net, spec)
        n_outputs = spec.n_outputs
        net, spec = with_input_rows(net, spec)
        regions = list(spec.regions)
        if screened and len(regions) > 1:
            regions = screen(build_graph(net, input_shape(net, regions[0])), regions, deadline)
            stats["screened"] = len(spec.regions) - len(regions)
        found = _attack_all(net, regions, config.attack, seed, deadline)
        status = "sat" if found is not None else "unsat"
        for region in regions if found is None else ():
            if time.monotonic() >= deadline:
                status = "timeout"
                break
            outcome = solve(net, region, deadline, config, seed)
            stats["regions"].append(outcome.stats)
            if outcome.status != "unsat":
                status, found = outcome.status, outcome.counterexample
                break
        if spec.n_outputs != n_outputs:
            found = strip_inputs(found, n_outputs)
        if found is not None and isinstance(arg, ArgOutput):  # report the indices
            found = (found[0], argmax_indices(found[1], arg))
    except KeyboardInterrupt:
        status, found = "unknown", None
        stats["interrupted"] = True
    except ParseDeadlineError:  # the property took longer to read than the time limit
        status, found = "timeout", None
    except NotImplementedError as error:
        status, found = "unknown", None
        stats["error"] = str(error)
    return VerificationResult(status, found, time.monotonic() - start, stats)


def _verify_certified(
    net: nn.Module | str | os.PathLike, spec: VnnlibProperty | str | os.PathLike,
    path: str | os.PathLike, hashes: tuple[str, str] | None, seconds: float, config: BabConfig,
    seed: int,
) -> VerificationResult:  # fmt: skip
    """`verify` writing a certificate to `path` (its docstring)."""
    if hashes is None:
        if not isinstance(net, (str, os.PathLike)) or not isinstance(spec, (str, os.PathLike)):
            raise TypeError("certificate: give the network and property as paths, or hashes")
        hashes = (sha256_file(net), sha256_file(spec))
    net, loaded = _load(net, spec)
    if any(p.A_x is not None for r in loaded.regions for p in r.unsafe):
        raise CertificateUnsupportedError("certificates of properties with input rows (A_x)")
    if isinstance(getattr(net, "argmax_output", None), ArgOutput):
        raise CertificateUnsupportedError("certificates of networks ending in ArgMax / ArgMin")
    net = evaluation_mode(net)
    check_sizes(net, loaded)
    writer = CertificateWriter(path, *hashes)
    mode, config, solve = _certified_solver(net, loaded, writer, config)
    result = _run(net, loaded, solve, seconds, config, seed, screened=False)
    if result.status == "sat" and result.counterexample is not None:
        x = result.counterexample[0].detach().double().cpu().numpy().reshape(-1)
        k = next((k for k, r in enumerate(loaded.regions)
                  if ((r.lower <= x) & (x <= r.upper)).all()), None)  # fmt: skip
        if k is not None:  # else no point is stored: the checker answers "invalid"
            writer.append({"sat_x": x, "sat_region": np.array(k)})
    if result.status in ("sat", "unsat"):
        writer.finish(result.status, len(loaded.regions), {"splitting": mode})
    return result


def _certified_solver(
    net: nn.Module, loaded: VnnlibProperty, writer: CertificateWriter, config: BabConfig
) -> tuple[str, BabConfig, Callable[..., RegionOutcome]]:
    """The splitting mode of the property (`splitting_mode` of its first region), the config of
    certificate mode and the region solver recording into `writer`: input splitting by CROWN
    (`verify.bab.input.certify`) or ReLU splitting (`verify.bab.relu.certify`)."""
    index = {id(r): k for k, r in enumerate(loaded.regions)}
    if not loaded.regions:
        return "input", certificate_config(config), solve_region
    graph = build_graph(net, input_shape(net, loaded.regions[0]))
    mode = splitting_mode(net, loaded.regions[0], config, graph)
    if mode == "input":
        config = certificate_config(config)

        def solve(net_: nn.Module, region: Region, deadline: float, config_: BabConfig,
                  seed_: int) -> RegionOutcome:  # fmt: skip
            recorder = Recorder(writer, index[id(region)], region, config_.combine_rows)
            return CertifyingBab(net_, region, config_, seed_, graph, recorder).run(deadline)

        return mode, config, solve
    layers = chain_layers(graph)
    config = relu_certificate_config(config)

    def solve_relu(net_: nn.Module, region: Region, deadline: float, config_: BabConfig,
                   seed_: int) -> RegionOutcome:  # fmt: skip
        recorder = ReluRecorder(writer, index[id(region)], region, layers)
        return CertifyingReluBab(net_, region, config_, seed_, graph, recorder).run(deadline)

    return mode, config, solve_relu
