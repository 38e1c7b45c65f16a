"""Scale-out on Ray (optional extra `[distributed]`): whole suites spread as one Ray task per
instance (`suite.py`), one hard instance sharded over Ray actors with work stealing
(`shards.py`, `workers.py`, `board.py`, `searches.py`), one aggregated progress bar
(`progress.py`).

Ray is imported lazily (`cluster.require_ray`): importing this package needs nothing beyond the
core install, and a missing Ray gives `RayUnavailableError` (a `VerificationInputError`, so the
command line prints one `error:` line and exits 2) naming the option that needed it.
"""

from verify.distributed.cluster import ClusterError, RayUnavailableError, require_ray

__all__ = ["ClusterError", "RayUnavailableError", "require_ray"]
