"""Scale-out on Ray (optional extra `[distributed]`): one hard instance sharded over Ray actors
with work stealing (`shards.py`, `workers.py`, `board.py`, `searches.py`), one aggregated
progress bar (`progress.py`); whole suites are spread as one Ray task per instance by the
command line (`verify.cli.suite`).

Ray is imported lazily (`cluster.require_ray`): importing this package needs nothing beyond the
core install, and a missing Ray gives `RayUnavailableError` (a `VerificationInputError`, so the
command line prints one `error:` line and exits 2) naming the option that needed it.
"""

from verify.distributed.cluster import ClusterError, RayUnavailableError, require_ray

__all__ = ["ClusterError", "RayUnavailableError", "require_ray"]
