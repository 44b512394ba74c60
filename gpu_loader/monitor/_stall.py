"""StallMeter: how much of the training loop's time goes to waiting for data.

Definitions (exact; tests check them against a scripted clock):

- A *wait* runs from ``wait_started()`` to ``wait_ended()``: the blocking ``next()``
  on the loader. The consumer calls them around every ``next()``.
- The first wait (pipeline start-up: threads, first reads, first decodes) is warm-up.
  Its length is ``startup_s``; it is excluded from every fraction.
- ``t0`` is the end of the first wait (the first batch is in the loop's hands).
- ``stall_fraction`` = (time spent in waits after ``t0``) / (now - ``t0``). A wait in
  progress counts up to ``now``, so a starving loader shows a rising stall live.
- ``stall_fraction_recent`` is the same over the last ``window_s`` seconds (or since
  ``t0`` if that is shorter): waiting time overlapping ``[now - w, now]`` divided by ``w``.

Both are 0.0 before ``t0`` is known or when no time has passed since.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ._periodic import check_interval


@dataclass(frozen=True)
class StallSnapshot:
    """Data-stall accounting at one moment."""

    startup_s: float | None
    """Length of the first wait (warm-up); None until it ends."""
    waited_s: float
    """Time spent waiting after the first batch (including a wait in progress)."""
    wall_s: float
    """Time since the first batch arrived (``now - t0``); 0.0 before it."""
    stall_fraction: float
    """``waited_s / wall_s`` (0.0 when ``wall_s`` is 0)."""
    stall_fraction_recent: float
    """The same over the recent window."""
    waits: int
    """Completed waits, the first one included."""


class StallMeter:
    """Counts the consumer's waiting time; thread-safe, cheap (a lock and a clock read)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, window_s: float = 10.0):
        self._clock = clock
        self.window_s = check_interval("window_s", window_s)
        self._lock = threading.Lock()
        self._wait_start: float | None = None
        self._t0: float | None = None
        self._startup_s: float | None = None
        self._waited_s = 0.0
        self._waits = 0
        self._recent: collections.deque[tuple[float, float]] = collections.deque()

    def wait_started(self) -> None:
        """The consumer is about to block on ``next()``."""
        now = self._clock()
        with self._lock:
            if self._wait_start is not None:
                raise RuntimeError("wait_started() called twice without wait_ended() between")
            self._wait_start = now

    def wait_ended(self) -> None:
        """The consumer got its item (or the iterator ended)."""
        now = self._clock()
        with self._lock:
            start = self._wait_start
            if start is None:
                raise RuntimeError("wait_ended() called without a matching wait_started()")
            self._wait_start = None
            self._waits += 1
            if self._t0 is None:
                self._startup_s = now - start
                self._t0 = now
                return
            self._waited_s += now - start
            self._recent.append((start, now))
            horizon = now - self.window_s
            while self._recent and self._recent[0][1] <= horizon:
                self._recent.popleft()

    @property
    def wait_open(self) -> bool:
        """A wait has started and not ended yet. A caller that an exception (a Ctrl-C)
        may cut off between its call and its own note of it asks this, as well as that
        note (a wait open here may be another caller's), before it ends a wait."""
        return self._wait_start is not None

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """``with meter.waiting(): batch = next(it)`` — ends the wait even on StopIteration."""
        self.wait_started()
        try:
            yield
        finally:
            self.wait_ended()

    @property
    def startup_s(self) -> float | None:
        """Length of the first wait; None until it has ended."""
        return self._startup_s

    def stall_fraction(self) -> float:
        """Waiting time / wall time since the first batch (see the module docstring)."""
        return self.snapshot().stall_fraction

    def stall_fraction_recent(self) -> float:
        """The stall fraction over the recent window."""
        return self.snapshot().stall_fraction_recent

    def snapshot(self) -> StallSnapshot:
        """All figures at one consistent moment."""
        now = self._clock()
        with self._lock:
            t0, start = self._t0, self._wait_start
            waits, startup, waited = self._waits, self._startup_s, self._waited_s
            recent = list(self._recent)
        if t0 is None:
            return StallSnapshot(startup, 0.0, 0.0, 0.0, 0.0, waits)
        if start is not None:
            waited += now - start
            recent.append((start, now))
        wall = now - t0
        window = min(self.window_s, wall)
        lo = now - window
        overlap = sum(max(0.0, min(end, now) - max(begin, lo)) for begin, end in recent)
        return StallSnapshot(
            startup_s=startup,
            waited_s=waited,
            wall_s=wall,
            stall_fraction=waited / wall if wall > 0 else 0.0,
            stall_fraction_recent=overlap / window if window > 0 else 0.0,
            waits=waits,
        )
