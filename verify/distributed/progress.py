"""One aggregated progress bar for distributed runs: instances done (suites), answers so far,
domains bounded and domains per second across all workers.

On a terminal the bar is redrawn in place (at most every `interval` seconds); elsewhere (a log
file, a pipe) one line is written every `log_interval` seconds and at the end. `reporting(bar)`
makes a bar current for the calls inside it (the sharded search reports its domain counts to
`current()`), so `verify.verify` needs no progress argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import TextIO

from verify.result import STATUSES

_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "ldverify_progress", default=None
)


def _count(n: float) -> str:
    """`n` with a k/M suffix: 950, 12.3k, 4.1M."""
    if n < 1000:
        return f"{n:.0f}"
    if n < 1e6:
        return f"{n / 1e3:.1f}k"
    return f"{n / 1e6:.1f}M"


class Progress:
    """The bar's state: `total` instances (None: one instance), `done`, answer counts, domains
    bounded (finished instances plus the running search's live count) over wall time."""

    def __init__(self, workers: int, total: int | None = None, stream: TextIO | None = None,
                 interval: float = 0.2, log_interval: float = 10.0) -> None:  # fmt: skip
        self.workers, self.total = workers, total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else log_interval
        self.done = 0
        self.answers: Counter[str] = Counter()
        self.finished_domains = 0  # of finished instances / regions
        self.live_domains = 0  # of the running search, across its workers
        self.open_domains: int | None = None
        self.start = time.monotonic()
        self.last_draw = -float("inf")
        self.width = 0

    def answer(self, status: str, domains: int = 0) -> None:
        """One instance answered `status` after bounding `domains` domains."""
        self.done += 1
        self.answers[status] += 1
        self.finished_domains += domains
        self.draw()

    def searching(self, domains: int, open_domains: int | None = None) -> None:
        """The running search has bounded `domains` domains (all workers), `open_domains` open."""
        self.live_domains, self.open_domains = domains, open_domains
        self.draw()

    def region_done(self) -> None:
        """The running search ended: its domains count as finished."""
        self.finished_domains += self.live_domains
        self.live_domains, self.open_domains = 0, None

    def domains(self) -> int:
        return self.finished_domains + self.live_domains

    def line(self) -> str:
        """The bar as text, e.g. `[#####.....] 93/186 | unsat 60 sat 30 timeout 3 | 1.2M
        domains, 8.5k/s | 2 workers | 110 s`."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        parts = []
        if self.total is not None:
            filled = round(10 * self.done / self.total) if self.total else 10
            parts.append(f"[{'#' * filled}{'.' * (10 - filled)}] {self.done}/{self.total}")
        answers = " ".join(f"{s} {self.answers[s]}" for s in STATUSES if self.answers[s])
        if answers:
            parts.append(answers)
        domains = f"{_count(self.domains())} domains, {_count(self.domains() / elapsed)}/s"
        if self.open_domains is not None:
            domains += f", {_count(self.open_domains)} open"
        parts += [domains, f"{self.workers} workers", f"{elapsed:.0f} s"]
        return " | ".join(parts)

    def draw(self, force: bool = False) -> None:
        """Write the bar if `interval` has passed since the last time (or `force`)."""
        now = time.monotonic()
        if not force and now - self.last_draw < self.interval:
            return
        self.last_draw = now
        text = self.line()
        if self.tty:
            pad = " " * max(0, self.width - len(text))
            self.stream.write(f"\r{text}{pad}")
            self.width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, text: str, stream: TextIO) -> None:
        """Print `text` as its own line on `stream`, keeping the terminal bar below it."""
        if self.tty and self.width and stream is self.stream:
            self.stream.write("\r" + " " * self.width + "\r")
            self.width = 0
        print(text, file=stream, flush=True)
        if self.tty:
            self.draw(force=True)

    def close(self) -> None:
        """The final bar (and a newline on a terminal)."""
        self.draw(force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


@contextlib.contextmanager
def reporting(bar: Progress | None) -> Iterator[Progress | None]:
    """Make `bar` current (`current()`) inside the block."""
    token = _current.set(bar)
    try:
        yield bar
    finally:
        _current.reset(token)


def current() -> Progress | None:
    """The bar set by the innermost `reporting` block, or None."""
    return _current.get()
