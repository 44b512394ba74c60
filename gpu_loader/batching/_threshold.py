"""AdaptiveThreshold: the slow-lane time limit, learnt from recent task durations.

Implements the engine's `LaneThreshold` protocol (`observe`, `limit`): worker threads call
`observe()` after every task, the stage's watchdog calls `limit()` every few milliseconds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING


@dataclass(frozen=True)
class ThresholdStats:
    """A snapshot of an `AdaptiveThreshold`."""

    limit_s: float | None
    """The current limit in seconds (None while warming up without ``initial_s``)."""
    percentile_s: float | None
    """The raw percentile of the recent window behind the limit (None while warming up)."""
    observations: int
    """Durations observed since construction."""
    window_fill: int
    """Durations currently in the window (at most ``window``)."""


def _check_duration(duration_s: float) -> None:
    if not 0.0 <= duration_s < math.inf:  # also refuses NaN
        raise ValueError(f"a task duration must be finite and >= 0 s, got {duration_s!r}")


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 1] of sorted values (NumPy's default)."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


class AdaptiveThreshold:
    """``limit() = max(floor_s, factor * percentile(last `window` durations))``.

    Until ``min_samples`` durations have been observed, ``limit()`` is ``initial_s``
    (raised to ``floor_s``), or None (no limit: nothing moves to the slow lane) when
    ``initial_s`` is None. ``observe()`` is O(1) under a lock (a ring buffer); the limit
    is cached and recomputed (a sort of the window) at most once every ``refresh_every``
    observations, so a shift in the task-time distribution shows in the limit once
    ``window`` new durations have been observed. Thread-safe.
    """

    def __init__(
        self,
        *,
        percentile: float = 0.95,
        factor: float = 2.0,
        window: int = 512,
        min_samples: int = 32,
        floor_s: float = 0.0,
        initial_s: float | None = None,
        refresh_every: int = 8,
    ) -> None:
        _check_number("percentile", percentile)
        if not 0.0 <= percentile <= 1.0:
            raise ValueError(
                f"`percentile` is a fraction in [0, 1], got {percentile} (for p95 pass 0.95)"
            )
        _check_number("factor", factor)
        if not 0.0 < factor < math.inf:
            raise ValueError(f"`factor` must be a finite number > 0, got {factor}")
        _check_count("window", window, 1)
        _check_count("min_samples", min_samples, 1)
        if min_samples > window:
            raise ValueError(
                f"`min_samples` ({min_samples}) must be <= `window` ({window}): the window "
                "could never hold enough durations"
            )
        _check_number("floor_s", floor_s)
        if not 0.0 <= floor_s < math.inf:
            raise ValueError(f"`floor_s` must be a finite number >= 0, got {floor_s}")
        if initial_s is not None:
            _check_number("initial_s", initial_s)
            if not 0.0 < initial_s < math.inf:
                raise ValueError(
                    f"`initial_s` must be None or a finite number > 0, got {initial_s}"
                )
        _check_count("refresh_every", refresh_every, 1)
        self.percentile = float(percentile)
        self.factor = float(factor)
        self.window = window
        self.min_samples = min_samples
        self.floor_s = float(floor_s)
        self.initial_s = None if initial_s is None else max(self.floor_s, float(initial_s))
        self.refresh_every = refresh_every
        self._lock = threading.Lock()
        self._ring = [0.0] * window
        self._next = 0
        self._count = 0
        self._stale = 0  # observations since the cached percentile was computed
        self._cached: float | None = None  # raw percentile of the window

    def observe(self, duration_s: float) -> None:
        """Record one task duration in seconds (finite, >= 0)."""
        _check_duration(duration_s)
        with self._lock:
            self._append(duration_s)

    def observe_many(self, durations_s: Sequence[float]) -> None:
        """`observe` each of ``durations_s``, under one lock. All or nothing: a bad
        duration raises before any is recorded."""
        for d in durations_s:
            _check_duration(d)
        with self._lock:
            for d in durations_s:
                self._append(d)

    def _append(self, duration_s: float) -> None:
        """Record a checked duration; the caller holds the lock."""
        self._ring[self._next] = duration_s
        self._next = (self._next + 1) % self.window
        self._count += 1
        self._stale += 1

    def limit(self) -> float | None:
        """The time after which a running task counts as a straggler, or None (no limit)."""
        return self._limit_from(self._refresh())

    def limit_then_observe(self, duration_s: float) -> float | None:
        """`limit()` as it stands, then `observe(duration_s)`: one lock taken, not two,
        while the cached percentile is fresh (a caller doing both for every sample, from
        many threads, pays for each contended lock)."""
        _check_duration(duration_s)
        with self._lock:
            fresh = self._count >= self.min_samples and self._cached is not None
            if fresh and self._stale < self.refresh_every:
                raw: float | None = self._cached
                self._append(duration_s)
                return self._limit_from(raw)
        limit = self.limit()
        self.observe(duration_s)
        return limit

    @property
    def observations(self) -> int:
        """Durations observed since construction."""
        return self._count

    def stats(self) -> ThresholdStats:
        raw = self._refresh()
        with self._lock:
            fill = min(self._count, self.window)
            count = self._count
        return ThresholdStats(
            limit_s=self._limit_from(raw), percentile_s=raw, observations=count, window_fill=fill
        )

    def _limit_from(self, raw: float | None) -> float | None:
        if raw is None:
            return self.initial_s
        return max(self.floor_s, self.factor * raw)

    def _refresh(self) -> float | None:
        with self._lock:
            if self._count < self.min_samples:
                return None
            if self._cached is not None and self._stale < self.refresh_every:
                return self._cached
            values = self._ring[: min(self._count, self.window)]  # a copy: sort off the lock
            self._stale = 0
        raw = percentile(sorted(values), self.percentile)
        with self._lock:
            self._cached = raw
        return raw


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} {value!r}")


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")


if TYPE_CHECKING:  # mypy proves the engine's protocol is met; nothing runs at import
    from gpu_loader.pipeline import LaneThreshold

    _conforms: LaneThreshold = AdaptiveThreshold()
