"""A daemon thread that calls ``tick()`` every ``interval_s`` until closed.

The samplers and the JSON-lines logger share this lifecycle: ``start()`` (idempotent),
``close()`` (idempotent, joins), context manager. The wait between ticks is an
``Event.wait`` so ``close()`` returns within one tick, not one interval.
"""

from __future__ import annotations

import logging
import math
import threading
from types import TracebackType
from typing import TypeVar

from gpu_loader._threads import InterruptSafeEvent, join_started, set_through_interrupts

_log = logging.getLogger("gpu_loader.monitor")

# close() waits this long for the thread; a tick is a few NVML/psutil calls (ms), so a
# thread still alive after this is stuck in a driver call and is left as a daemon.
_JOIN_TIMEOUT_S = 10.0


_T = TypeVar("_T", bound="PeriodicThread")


def check_interval(name: str, value: float) -> float:
    """Validate a positive, finite interval in seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class PeriodicThread:
    """Base class: subclasses implement ``_setup()`` and ``_tick()``."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.interval_s = check_interval("interval_s", interval_s)
        self._name = name
        self._stop = InterruptSafeEvent()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    # -- hooks -------------------------------------------------------------------------
    def _setup(self) -> bool:
        """Runs in ``start()`` on the caller's thread; False means "do not start a thread"."""
        return True

    def _tick(self) -> bool:
        """One sampling step on the thread; False stops the thread."""
        raise NotImplementedError

    def _teardown(self) -> None:
        """Runs once in ``close()`` after the thread is joined."""

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread (idempotent). Starting after ``close()`` is an error."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed; create a new one to sample again")
            if self._started:
                return
            # Marked before setup so a second start() does not retry a failed setup.
            self._started = True
            if not self._setup():
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop and join the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        # A Ctrl-C held back by the stop event's `set` is raised once the join and the
        # teardown (the JSONL logger's last line and its file) have run: raised from
        # `set`, it skipped both, and a second close() found nothing left to do (QA).
        interrupted = set_through_interrupts(self._stop)
        try:
            if thread is not None:
                join_started(thread, _JOIN_TIMEOUT_S)
                if thread.is_alive():
                    _log.warning("%s did not stop within %.0f s", self._name, _JOIN_TIMEOUT_S)
        finally:
            self._teardown()
        if interrupted:
            raise KeyboardInterrupt

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def __enter__(self: _T) -> _T:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        # Tick first so a snapshot right after start() has data.
        while not self._stop.is_set():
            if not self._tick():
                return
            self._stop.wait(self.interval_s)
