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

The poll alone is not enough on CPython 3.11: ``SimpleQueue.get(timeout=...)``, woken by
a put whose item another consumer then takes, recomputes the time left, and when that is
already negative it waits with no timeout at all (seen: a read worker stuck for good
after a ``break``, and ``close()`` waiting out its 10 s join). So setting the stop event
(a `StopEvent`) also puts `WAKE` into both queues of every channel; whoever takes it
puts it back and stops, so every waiter, stuck or not, finds one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from gpu_loader._threads import InterruptSafeEvent, interrupt_deferred

POLL_S = 0.05


class _EndOfStream:
    def __repr__(self) -> str:
        return "<end of stream>"


EOS: Any = _EndOfStream()
"""Sent downstream once by each stage after its last item."""


class _Wake:
    def __repr__(self) -> str:
        return "<wake: the pipeline is stopping>"


WAKE: Any = _Wake()
"""Put into every queue when the pipeline stops; a thread that takes it puts it back
(for the next waiter) and stops."""


def pass_on_wake(q: queue.SimpleQueue[Any]) -> NoReturn:
    """A thread took `WAKE` from ``q``: put it back for the next waiter, and stop."""
    q.put(WAKE)
    raise Stopped


class StopEvent(InterruptSafeEvent):
    """The pipeline's stop event: `set` also runs the registered wakers, once."""

    def __init__(self) -> None:
        super().__init__()
        self._wakers: list[Callable[[], None]] = []
        self._wake_lock = threading.Lock()
        self._woken = False

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Run ``waker`` when the event is set (at once, if it already is)."""
        with self._wake_lock:
            if not self._woken:
                self._wakers.append(waker)
                return
        waker()

    def set(self) -> None:
        # The wakers too, before a Ctrl-C held back meanwhile is raised: skipped, they
        # left threads waiting on queues nobody woke (QA).
        with interrupt_deferred():
            threading.Event.set(self)
            with self._wake_lock:
                wakers, self._wakers, self._woken = self._wakers, [], True
            for waker in wakers:
                waker()


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
        if isinstance(stop, StopEvent):
            stop.add_waker(self.wake)

    def wake(self) -> None:
        """Release every thread waiting on this channel (the pipeline is stopping)."""
        self.data.put(WAKE)
        self.credits.put(WAKE)

    def get(self) -> Any:
        data_get, stop = self.data.get, self.stop
        while True:
            if stop.is_set():
                raise Stopped
            try:
                item = data_get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is WAKE:
                pass_on_wake(self.data)
            self.credits.put(None)
            return item

    def put(self, item: Any) -> None:
        credit_get, stop = self.credits.get, self.stop
        while True:
            if stop.is_set():
                raise Stopped
            try:
                credit = credit_get(timeout=POLL_S)
            except queue.Empty:
                continue
            if credit is WAKE:
                pass_on_wake(self.credits)
            self.data.put(item)
            return

    def occupancy(self) -> int:
        """Items waiting now (a C-level read, safe from any thread)."""
        return self.data.qsize()
