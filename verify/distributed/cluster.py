"""The Ray connection: lazy import with a clear error, a local cluster of N worker CPUs or an
existing cluster by address, and the shutdown of what this process started.

`connect` reuses a connection this process already has (`ray.is_initialized()`, e.g. a test's
cluster or a user's `ray.init`); otherwise it starts a local cluster (`address=None`) or joins
one. `shutdown` ends the cluster only when `connect` started or joined it, after the callbacks
registered with `on_shutdown` (the cached shard pools) have released their actors.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable
from types import ModuleType

from bounds.errors import VerificationInputError

INSTALL_HINT = "pip install 'ldverify[distributed]' (that is, ray>=2.40)"
OBJECT_STORE_BYTES = 1 << 30  # plenty for shipped domains; Ray spills to disk beyond it
# Ray runs its workers at niceness 15 by default, so that they yield to every other process:
# here they are the computation (the driver mostly waits), and on a shared machine niceness 15
# starved them (measured: half the CPU share of a serial run's process). A local cluster this
# module starts runs them at the driver's niceness; a joined cluster keeps its own setting.
LOCAL_CONFIG = {"worker_niceness": 0}

_state: dict = {"started": False}
_cleanups: list[Callable[[], None]] = []


class RayUnavailableError(VerificationInputError):
    """Ray is needed (more than one worker, or a cluster address) but cannot be imported."""


class ClusterError(VerificationInputError):
    """The Ray cluster cannot be started or joined, or is too small for the workers asked."""


def require_ray(what: str) -> ModuleType:
    """The `ray` module; `RayUnavailableError` naming `what` (e.g. "--workers 2") when it is
    not installed."""
    try:
        return importlib.import_module("ray")
    except ImportError as error:
        raise RayUnavailableError(
            f"{what} needs Ray, which is not installed ({error}): {INSTALL_HINT}; "
            "or run with one worker (the default), which needs no Ray"
        ) from None


def connect(workers: int, address: str | None, cpus_per_worker: int, what: str) -> ModuleType:
    """A connected `ray` with room for `workers` workers of `cpus_per_worker` CPUs each.

    Reuses this process's connection when there is one; else starts a local cluster of
    `workers * cpus_per_worker` CPUs (`address` None) or joins the cluster at `address`.
    Raises `RayUnavailableError` without Ray, `ClusterError` when the cluster cannot be reached
    or has fewer CPUs than asked for."""
    ray = require_ray(what)
    if not ray.is_initialized():
        options = dict(log_to_driver=False, logging_level=logging.WARNING)
        try:
            if address is None:
                ray.init(num_cpus=workers * cpus_per_worker, include_dashboard=False,
                         object_store_memory=OBJECT_STORE_BYTES, _system_config=LOCAL_CONFIG,
                         **options)  # fmt: skip
            else:
                ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as error:
            where = "start a local Ray cluster" if address is None else f"join --ray {address}"
            raise ClusterError(f"{what}: cannot {where}: {error}") from None
        _state["started"] = True
    have = ray.cluster_resources().get("CPU", 0.0)
    if have + 1e-9 < workers * cpus_per_worker:
        raise ClusterError(
            f"{what}: the Ray cluster has {have:g} CPUs, {workers} workers of "
            f"{cpus_per_worker} CPU(s) need {workers * cpus_per_worker}"
        )
    return ray


def cluster_workers(ray: ModuleType, cpus_per_worker: int) -> int:
    """How many workers of `cpus_per_worker` CPUs the connected cluster holds (at least 1)."""
    return max(1, math.floor(ray.cluster_resources().get("CPU", 1.0) / cpus_per_worker))


def gpu_share(ray: ModuleType, device: str, workers: int) -> float:
    """Each worker's share of the cluster's GPUs: 0 on the CPU, else the GPUs over `workers`
    (at most 1)."""
    if not device.startswith("cuda"):
        return 0.0
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if gpus <= 0:
        raise ClusterError(f"--device {device}: the Ray cluster has no GPU")
    return min(1.0, gpus / workers)


def on_shutdown(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` (once) before `shutdown` ends the connection."""
    _cleanups.append(cleanup)


def release() -> None:
    """Run the registered cleanups (the cached shard pools' actors end, freeing their CPUs)."""
    while _cleanups:
        _cleanups.pop()()


def shutdown() -> None:
    """`release`, then, when `connect` started or joined the cluster, disconnect (a local
    cluster's processes end with it)."""
    release()
    if _state["started"]:
        ray = importlib.import_module("ray")
        ray.shutdown()
        _state["started"] = False
