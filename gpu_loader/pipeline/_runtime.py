"""What the threads of one pipeline share: the stop event, the fatal error, the thread list.

Threads hold this object, never the ``Pipeline``, so dropping the last reference to a
``Pipeline`` lets its finalizer stop them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpu_loader._threads import InterruptSafeEvent, join_started, set_through_interrupts

from ._channel import StopEvent
from ._errors import PipelineFailure, add_note, error_text

logger = logging.getLogger("gpu_loader.pipeline")

# close() waits this long in total for threads to finish; only an op that is itself
# stuck (not the engine, whose waits all poll the stop event) can make it run out.
JOIN_TIMEOUT_S = 10.0


def as_failure(exc: BaseException, stage: str, detail: str = "") -> BaseException:
    """Wrap an unexpected error of ``stage`` in a PipelineFailure (BaseExceptions stay raw)."""
    if isinstance(exc, PipelineFailure) or not isinstance(exc, Exception):
        return exc
    where = f"stage: {stage}" + (f", {detail}" if detail else "")
    add_note(exc, where)
    return PipelineFailure(
        f"stage {stage!r} failed{' in ' + detail if detail else ''}: {error_text(exc)}", [exc]
    )


class Runtime:
    """Shared state of one running pipeline."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stop = StopEvent()  # setting it also wakes every waiting thread
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._joiner: InterruptSafeEvent | None = None  # set once the first shutdown has joined
        self._fatal: BaseException | None = None
        self.started_at: float | None = None

    @property
    def fatal(self) -> BaseException | None:
        # A plain read: the reference is written once, under the lock, before `stop` is set.
        return self._fatal

    def fail(self, exc: BaseException) -> None:
        """Record the first fatal error and stop every thread."""
        with self._lock:
            if self._fatal is None and not self._closing:
                self._fatal = exc
        self.stop.set()

    def spawn(self, target: Callable[[], None], name: str) -> bool:
        """Start a daemon thread unless the pipeline is closing; False if it was not started."""
        thread = threading.Thread(target=target, name=f"{self.name}:{name}", daemon=True)
        with self._lock:
            if self._closing:
                return False
            self._threads.append(thread)
            # Started under the lock so shutdown() never misses a thread it must join.
            thread.start()
        return True

    def shutdown(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stop and join every thread; safe to call more than once and from any thread.

        The first call joins (for at most ``timeout``); a later or concurrent one waits for
        that join to end instead of starting its own, so a thread stuck in an op (a read
        that never returns) costs ``timeout`` once, not once per caller.
        """
        with self._lock:
            self._closing = True
            threads = list(self._threads)
            joined, first = self._joiner, self._joiner is None
            if first:
                joined = self._joiner = InterruptSafeEvent()
        assert joined is not None
        interrupted = False
        try:
            # A Ctrl-C meanwhile is raised once the threads are joined.
            interrupted = set_through_interrupts(self.stop)
            if not first:
                if threading.current_thread() not in threads:  # ours would wait on itself
                    joined.wait(timeout)
            else:
                self._join(threads, timeout)
        finally:
            # Whatever happened above: a later close must not wait out its timeout for
            # a join that never ran (QA: a Ctrl-C in `set` made a `break` take 20 s).
            if first and set_through_interrupts(joined):
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt

    def _join(self, threads: list[threading.Thread], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        for thread in threads:
            if thread is current:  # a finalizer run by GC on one of our own threads
                continue
            join_started(thread, max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive() and t is not current]
        if stuck:
            logger.warning(
                "pipeline %s: %d thread(s) still running after %.0fs (an op that does not "
                "return?): %s; they are daemon threads and end with the process",
                self.name,
                len(stuck),
                timeout,
                ", ".join(stuck),
            )

    def live_threads(self) -> list[threading.Thread]:
        with self._lock:
            return [t for t in self._threads if t.is_alive()]
