"""Bounded hand-off between stages that gives up when the pipeline stops.

Every blocking call waits at most ``POLL_S`` at a time and then looks at the stop event,
so ``close()`` can join every thread within a few poll periods even when stages are
blocked on a full or an empty queue.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

POLL_S = 0.05


class _EndOfStream:
    def __repr__(self) -> str:
        return "<end of stream>"


EOS: Any = _EndOfStream()
"""Sent downstream once by each stage after its last item."""


class Stopped(Exception):
    """The pipeline is stopping; the thread that sees this unwinds and exits."""


class Channel:
    """A bounded FIFO between two stages (``queue.Queue`` plus stop-aware waits)."""

    __slots__ = ("capacity", "q", "stop")

    def __init__(self, capacity: int, stop: threading.Event) -> None:
        self.capacity = capacity
        self.q: queue.Queue[Any] = queue.Queue(capacity)
        self.stop = stop

    def get(self) -> Any:
        q, stop = self.q, self.stop
        while True:
            if stop.is_set():
                raise Stopped
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                continue

    def put(self, item: Any) -> None:
        q, stop = self.q, self.stop
        while True:
            if stop.is_set():
                raise Stopped
            try:
                q.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def occupancy(self) -> int:
        # len() of the underlying deque needs no lock: deque length reads are atomic
        # with the GIL and under free-threading's per-object locking alike.
        return len(self.q.queue)
