"""ProcessSampler: CPU use and memory of this process, on a daemon thread.

CPU % is computed from deltas of CPU time (user + system, all threads: this process's
from ``time.process_time()``, in nanoseconds; another's from psutil's ``cpu_times()``,
in 10 ms ticks) over wall time, like ``top``: 100 means one core fully busy, so a process using 4 cores
reads 400. ``cpu_percent_normalised`` divides by the logical CPU count (0-100).
Memory: RSS from ``memory_info()``; PSS from ``memory_full_info().pss`` where the OS
has it (Linux), else None. PSS splits shared pages between the processes sharing
them, so it is the fair number to compare with multi-process loaders. It is also
costly: the kernel walks the process's page tables for it (4-8 ms at 225 MB RSS on the
dev machine, and proportional to RSS), so it is read no more often than keeps that
under `PSS_CPU_SHARE` of one core, and not in the final reading of `close()` (which a
loader takes in the training loop's thread at every epoch's end: 10-15 ms per epoch).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._periodic import PeriodicThread, check_interval

_log = logging.getLogger("gpu_loader.monitor")

PSS_CPU_SHARE = 0.01
"""The most of one core's time that reading PSS may take: after a reading that took ``t``
seconds, the next is due ``t / PSS_CPU_SHARE`` later (at most every tick)."""


@dataclass(frozen=True)
class ProcessSnapshot:
    """CPU and memory of the process."""

    cpu_percent: float | None
    """CPU % over the recent window (100 = one core); None before two readings."""
    cpu_percent_normalised: float | None
    """``cpu_percent / cpu_count`` (0-100 on a fully busy machine); None likewise."""
    cpu_seconds: float
    """User + system CPU time since the sampler started (all threads)."""
    cpu_count: int
    """Logical CPUs the normalisation divides by."""
    rss_bytes: int | None
    """Resident set size at the latest reading."""
    pss_bytes: int | None
    """Proportional set size at the latest PSS reading (rarer than the others when reading
    it is slow: see `PSS_CPU_SHARE`); None where the OS lacks it."""
    peak_rss_bytes: int | None
    """Largest RSS seen."""
    peak_pss_bytes: int | None
    """Largest PSS seen."""
    threads: int | None
    """Threads in the process at the latest reading."""


@dataclass(frozen=True)
class _Reading:
    time_s: float
    cpu_s: float


def _default_proc() -> Any:
    import psutil

    return psutil.Process()


class ProcessSampler(PeriodicThread):
    """Samples ``proc`` (this process via psutil by default) every ``interval_s``."""

    def __init__(
        self,
        interval_s: float = 0.5,
        *,
        window_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        proc: Any = None,
        cpu_count: int | None = None,
    ) -> None:
        super().__init__("gpu_loader-process-sampler", interval_s)
        self.window_s = check_interval("window_s", window_s)
        self._clock = clock
        self._proc = proc
        # This process: CPU time from the clock_gettime counter, in ns. psutil's
        # cpu_times() counts 10 ms ticks, so a run of 20 ms read 245-1086% of a 2-core
        # machine (QA63).
        self._own = proc is None
        self._cpu_count = cpu_count or os.cpu_count() or 1
        self._data_lock = threading.Lock()
        self._readings: collections.deque[_Reading] = collections.deque()
        self._first_cpu_s: float | None = None
        self._rss: int | None = None
        self._pss: int | None = None
        self._peak_rss: int | None = None
        self._peak_pss: int | None = None
        self._threads: int | None = None
        self._has_pss = True
        self._pss_due = -math.inf  # clock() from which PSS may be read again
        self._warned = False

    def _setup(self) -> bool:
        if self._proc is None:
            self._proc = _default_proc()
        return True

    def _tick(self) -> bool:
        self.sample_once()
        return True

    def _teardown(self) -> None:
        # A last reading, so a run shorter than one interval (a short epoch) still has
        # two readings, its start and its end, and a CPU figure. Not while the
        # interpreter shuts down (a loader closed by garbage collection at exit): psutil
        # cannot read then, and there is nobody left to read the figure.
        if self._readings and not sys.is_finalizing():
            self.sample_once(pss=False)

    def continue_pss(self, previous: ProcessSampler) -> None:
        """Take over ``previous``'s PSS reading, peak and schedule (a monitor renews its
        sampler every epoch: a fresh one would read PSS at once, at every epoch's start)."""
        with previous._data_lock:
            pss, peak = previous._pss, previous._peak_pss
        with self._data_lock:
            self._pss, self._peak_pss = pss, peak
        self._has_pss, self._pss_due = previous._has_pss, previous._pss_due

    def _read_pss(self) -> int | None:
        """PSS now, or None when unavailable or not yet due (`PSS_CPU_SHARE`)."""
        began = self._clock()
        if not self._has_pss or began < self._pss_due:
            return None
        try:
            pss = getattr(self._proc.memory_full_info(), "pss", None)
        except Exception as exc:  # AccessDenied / unsupported: PSS is optional
            _log.debug("PSS unavailable: %s", exc)
            pss = None
        if pss is None:
            self._has_pss = False  # no point asking every tick
            return None
        took = self._clock() - began
        self._pss_due = began + took / PSS_CPU_SHARE
        return int(pss)

    def sample_once(self, *, pss: bool = True) -> bool:
        """Take one reading now; False (and one warning) if the process can't be read.
        ``pss``: read PSS too if it is due (else the last PSS reading stands)."""
        if self._proc is None:
            self._proc = _default_proc()
        try:
            if self._own:
                cpu_s = time.process_time()
            else:
                times = self._proc.cpu_times()
                cpu_s = float(times.user) + float(times.system)
            # Stamped with the CPU reading, not after the memory reads that follow (the
            # PSS read takes milliseconds, which the window then left out).
            now = self._clock()
            rss = int(self._proc.memory_info().rss)
            threads = int(self._proc.num_threads()) if hasattr(self._proc, "num_threads") else None
        except Exception as exc:  # psutil errors must not stop the loader; say so once
            if not self._warned:
                self._warned = True
                _log.warning("process sampling failed: %s: %s", type(exc).__name__, exc)
            return False
        pss_now = self._read_pss() if pss else None
        with self._data_lock:
            if self._first_cpu_s is None:
                self._first_cpu_s = cpu_s
            self._readings.append(_Reading(now, cpu_s))
            while len(self._readings) > 2 and self._readings[1].time_s <= now - self.window_s:
                self._readings.popleft()  # keep one reading at/just before the window start
            self._rss, self._threads = rss, threads
            self._peak_rss = max(rss, self._peak_rss or 0)
            if pss_now is not None:
                self._pss = pss_now
                self._peak_pss = max(pss_now, self._peak_pss or 0)
        return True

    def snapshot(self) -> ProcessSnapshot:
        """CPU % over the window (first to last reading in it) and the latest memory."""
        with self._data_lock:
            readings = list(self._readings)
            first_cpu = self._first_cpu_s
            rss, pss, threads = self._rss, self._pss, self._threads
            peak_rss, peak_pss = self._peak_rss, self._peak_pss
        cpu: float | None = None
        if len(readings) >= 2 and readings[-1].time_s > readings[0].time_s:
            a, b = readings[0], readings[-1]
            cpu = max(0.0, 100.0 * (b.cpu_s - a.cpu_s) / (b.time_s - a.time_s))
        total = readings[-1].cpu_s - first_cpu if readings and first_cpu is not None else 0.0
        return ProcessSnapshot(
            cpu_percent=cpu,
            cpu_percent_normalised=None if cpu is None else cpu / self._cpu_count,
            cpu_seconds=total,
            cpu_count=self._cpu_count,
            rss_bytes=rss,
            pss_bytes=pss,
            peak_rss_bytes=peak_rss,
            peak_pss_bytes=peak_pss,
            threads=threads,
        )
