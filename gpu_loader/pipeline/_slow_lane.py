"""The slow lane of a ``pipe`` stage: a watchdog moves workers stuck on a long task aside.

A worker whose current task has run longer than ``threshold.limit()`` (times the task's
``weight``, when the lane has one) is marked slow; it finishes that task (never
restarted, so never run twice), hands the result on and exits. The watchdog starts a replacement at once, so the fast lane keeps ``concurrency``
workers taking new items. At most ``max_threads`` workers are slow at a time.
"""

from __future__ import annotations

import numbers
import threading
from typing import TYPE_CHECKING, Any

from ._defs import SlowLane
from ._errors import add_note

if TYPE_CHECKING:
    from ._pipe_stage import PipeStage


MAX_WAIT_POLLS = 10
"""The watchdog's longest sleep, in ``poll_s`` units (bounds the reaction to a clock or a
limit that changes while it sleeps)."""


class WorkerSlot:
    """One worker's running task as the watchdog sees it."""

    __slots__ = ("_clock", "_weigh", "lock", "slow", "started", "weight")

    def __init__(self, lane: SlowLane) -> None:
        self.lock = threading.Lock()
        self._clock = lane.clock
        self._weigh = lane.weight
        self.started: float | None = None  # clock() when the running task began
        self.weight = 1.0  # the running task's (`SlowLane.weight`)
        self.slow = False

    def begin(self, item: Any) -> None:
        weight = 1.0
        if self._weigh is not None:
            try:
                weight = float(self._weigh(item))
                if not weight >= 1:
                    raise ValueError(f"a slow lane's `weight` must be >= 1, got {weight}")
            except Exception as exc:
                add_note(exc, "raised by the stage's SlowLane.weight")
                raise
        now = self._clock()
        with self.lock:
            self.started, self.weight = now, weight


class LaneState:
    """Fast/slow bookkeeping and the watchdog loop of one stage."""

    def __init__(self, stage: PipeStage, lane: SlowLane) -> None:
        self._stage = stage
        self._lane = lane
        # Guards the fields below and every call into the threshold, so a threshold
        # implementation needs no lock of its own.
        self._lock = threading.Lock()
        self._fast: list[WorkerSlot] = []
        self._slow_size = 0
        self._moves = 0
        self._limit: float | None = None
        self._wait = lane.poll_s  # until the next check (see `_move_stragglers`)

    def new_slot(self) -> WorkerSlot:
        slot = WorkerSlot(self._lane)
        with self._lock:
            self._fast.append(slot)
        return slot

    def task_done(self, slot: WorkerSlot) -> bool:
        """Feed the task's duration to the threshold; True if the worker was moved."""
        now = self._lane.clock()
        with slot.lock:
            started, slot.started = slot.started, None
            moved, weight = slot.slow, slot.weight
        if started is not None:
            with self._lock:
                self._lane.threshold.observe((now - started) / weight)
        return moved

    def worker_exited(self, slot: WorkerSlot) -> None:
        with self._lock:
            if slot in self._fast:
                self._fast.remove(slot)
            elif slot.slow:
                self._slow_size -= 1

    def view(self) -> tuple[float | None, int, int]:
        """(current limit, moves so far, workers in the slow lane now)."""
        with self._lock:
            return self._limit, self._moves, self._slow_size

    def fast_size(self) -> int:
        with self._lock:
            return len(self._fast)

    def watch(self) -> None:
        """The watchdog thread: move over-limit workers to the slow lane.

        It sleeps until the earliest moment a running task can pass the limit (at least
        ``poll_s``, at most ``MAX_WAIT_POLLS * poll_s``), not a fixed ``poll_s``: with
        tasks far shorter than the limit that is a few wake-ups per limit instead of one
        per ``poll_s``, each of which takes the GIL from the workers. A task that starts
        while it sleeps cannot pass the limit before it wakes (weights are >= 1).
        """
        stage = self._stage
        rt = stage.rt
        assert rt is not None
        while not rt.stop.wait(self._wait):
            if stage.eos_seen():
                return  # no new items: a replacement would have nothing to do
            for _ in range(self._move_stragglers()):
                stage.spawn_worker()

    def _move_stragglers(self) -> int:
        lane = self._lane
        with self._lock:
            limit = lane.threshold.limit()
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, numbers.Real) or limit != limit
            ):  # a str or a NaN: the watchdog's error, which stops the run (QA52)
                raise TypeError(
                    f"LaneThreshold.limit() must return seconds (a real number, not NaN) or "
                    f"None, got {limit!r}"
                )
            self._limit = limit
            self._wait = lane.poll_s
            if limit is None:
                return 0
            now = lane.clock()
            moved = 0
            next_due = limit  # a task of weight 1 starting now
            for slot in list(self._fast):
                with slot.lock:
                    if slot.started is None:
                        continue
                    left = limit * slot.weight - (now - slot.started)
                    if left >= 0 or self._slow_size >= lane.max_threads:
                        next_due = min(next_due, max(left, 0.0))
                        continue
                    slot.slow = True
                self._fast.remove(slot)
                self._slow_size += 1
                self._moves += 1
                moved += 1
            self._wait = min(max(next_due, lane.poll_s), MAX_WAIT_POLLS * lane.poll_s)
            return moved
