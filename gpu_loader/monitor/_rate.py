"""RateMeter: samples/s and batches/s, since the first batch and over a sliding window.

Definitions (matching :mod:`._stall`, so start-up is excluded everywhere):

- ``t0`` is the time of the first ``add()`` (the first batch delivered).
- since start: what was added AFTER the first batch, divided by ``now - t0``; the first
  batch only starts the clock (counting it would credit start-up time to throughput).
- recent: what was added in ``(now - w, now]`` divided by ``w``, where
  ``w = min(window_s, now - t0)``.

Rates are 0.0 until some time has passed since ``t0``. Totals count every batch.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ._periodic import check_interval


@dataclass(frozen=True)
class RateSnapshot:
    """Throughput at one moment."""

    samples: int
    """Samples delivered, first batch included."""
    batches: int
    """Batches delivered, first batch included."""
    samples_per_s: float
    """Since the first batch (see the module docstring)."""
    batches_per_s: float
    """Since the first batch."""
    samples_per_s_recent: float
    """Over the recent window."""
    batches_per_s_recent: float
    """Over the recent window."""


class RateMeter:
    """Counts deliveries; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, window_s: float = 10.0):
        self._clock = clock
        self.window_s = check_interval("window_s", window_s)
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._first_samples = 0
        self._first_batches = 0
        self._samples = 0
        self._batches = 0
        self._recent: collections.deque[tuple[float, int, int]] = collections.deque()

    def add(self, samples: int, batches: int = 1) -> None:
        """Record a delivery of ``samples`` samples in ``batches`` batches."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"`samples` must be an int >= 0, got {samples!r}")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise ValueError(f"`batches` must be an int >= 0, got {batches!r}")
        now = self._clock()
        with self._lock:
            self._samples += samples
            self._batches += batches
            if self._t0 is None:
                self._t0 = now
                self._first_samples = samples
                self._first_batches = batches
                return
            self._recent.append((now, samples, batches))
            horizon = now - self.window_s
            while self._recent and self._recent[0][0] <= horizon:
                self._recent.popleft()

    @property
    def samples(self) -> int:
        """Samples recorded so far."""
        with self._lock:
            return self._samples

    def snapshot(self) -> RateSnapshot:
        """Totals and rates now."""
        now = self._clock()
        with self._lock:
            t0, samples, batches = self._t0, self._samples, self._batches
            first, first_batches = self._first_samples, self._first_batches
            recent = list(self._recent)
        if t0 is None or now <= t0:
            return RateSnapshot(samples, batches, 0.0, 0.0, 0.0, 0.0)
        wall = now - t0
        window = min(self.window_s, wall)
        inside = [(s, b) for t, s, b in recent if now - window < t <= now]
        return RateSnapshot(
            samples=samples,
            batches=batches,
            samples_per_s=(samples - first) / wall,
            batches_per_s=(batches - first_batches) / wall,
            samples_per_s_recent=sum(s for s, _ in inside) / window,
            batches_per_s_recent=sum(b for _, b in inside) / window,
        )
