"""Bounded hand-off between stages that gives up when the pipeline stops.

A channel is two C-level ``queue.SimpleQueue`` objects: ``data`` carries items and
``credits`` holds one token per free slot. A producer takes a credit before it puts an
item; the consumer returns the credit after it takes one. So at most ``capacity`` items
wait in ``data`` (the bound), and both sides block in C on a lock instead of in
``queue.Queue``'s Python-level condition variables, which costs less per item.

Every blocking call waits at most ``POLL_S`` at a time and then looks at the stop event,
so ``close()`` can join every thread within a few poll periods even when stages are
blocked on a full or an empty channel. Hot loops call ``data``/``credits`` directly and
fall back to the stop-aware ``get``/``put`` below only after a poll period of waiting.
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
    """A bounded FIFO between two stages, with stop-aware waits."""

    __slots__ = ("capacity", "credits", "data", "stop")

    def __init__(self, capacity: int, stop: threading.Event) -> None:
        self.capacity = capacity
        self.data: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.credits: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(capacity):
            self.credits.put(None)
        self.stop = stop

    def get(self) -> Any:
        data_get, stop = self.data.get, self.stop
        while True:
            if stop.is_set():
                raise Stopped
            try:
                item = data_get(timeout=POLL_S)
            except queue.Empty:
                continue
            self.credits.put(None)
            return item

    def put(self, item: Any) -> None:
        credit_get, stop = self.credits.get, self.stop
        while True:
            if stop.is_set():
                raise Stopped
            try:
                credit_get(timeout=POLL_S)
            except queue.Empty:
                continue
            self.data.put(item)
            return

    def occupancy(self) -> int:
        """Items waiting now (a C-level read, safe from any thread)."""
        return self.data.qsize()
