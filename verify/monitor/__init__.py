"""Certified activation monitors against silent data corruption: `monitor(net, domain)` and its
`Monitor` (`api`), its domain (`domain`), the fused checks on the user's module (`check`, the
wrapped module in `wrapped`), the checksums of affine
layers (`sums`), the certified ranges (`ranges`), the compiled detection path (`compiled`), and
the fault injection that tests them (`faults`).

`verify.monitor` stays the public function (`verify.monitor(net, domain)`): `verify/__init__.py`
binds the name to it after importing this package; the names below are also importable as
`from verify.monitor import Box, Ball, Monitor, MonitorMismatchError, monitor`.
"""

from verify.monitor.api import (
    Ball,
    Box,
    CompiledMonitoredNet,
    Monitor,
    MonitoredNet,
    MonitorMismatchError,
    MonitorOptionError,
    MonitorReport,
    monitor,
)

__all__ = [
    "Ball",
    "Box",
    "CompiledMonitoredNet",
    "Monitor",
    "MonitorMismatchError",
    "MonitorOptionError",
    "MonitorReport",
    "MonitoredNet",
    "monitor",
]
