"""The ``pipe`` stage: long-lived worker threads running a user op.

Each worker: take an item, run the op, hand the result on, count. This file has the
completion-order loop (used for concurrency 1 in both orders, since one worker cannot
reorder) and the machinery shared with the input-order variant in ``_ordered.py``:
per-thread state, failure recording, end of stream, and the slow lane.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ._channel import EOS, POLL_S, WAKE, Channel, Stopped, pass_on_wake
from ._defs import SKIP, PipeSpec
from ._errors import FailurePolicy, FailureRecord, add_note, item_key, release_locals
from ._runtime import as_failure
from ._slow_lane import LaneState, WorkerSlot
from ._stage import Stage
from ._stats import WorkerCounters

_DROPPED: Any = object()  # the op raised; the item is gone (and recorded)


class PipeStage(Stage):
    kind = "pipe"

    def __init__(self, spec: PipeSpec) -> None:
        super().__init__(spec.name, spec.concurrency)
        self.spec = spec
        self.policy = FailurePolicy(spec.name, spec.max_failures, spec.failures_before)
        self._lock = threading.Lock()
        self._alive = 0
        self._eos_seen = False
        self._lane = LaneState(self, spec.slow_lane) if spec.slow_lane is not None else None

    # Lifecycle ---------------------------------------------------------------------

    def start(self, rt: Any) -> None:
        self.rt = rt
        if (error := self.policy.check_start()) is not None:
            rt.fail(error)
            return
        for _ in range(self.concurrency):
            self.spawn_worker()
        if (lane := self._lane) is not None:
            # Guarded as every stage thread is: its own errors (a `LaneThreshold.limit`
            # that raises or gives no number, a clock that raises) stop the run, where the
            # thread died quietly and the lane was off for the rest of it (QA52).
            watch = functools.partial(self._run_guarded, lane.watch, "the slow-lane watchdog")
            rt.spawn(watch, f"{self.name}:watchdog")

    def spawn_worker(self, slot: WorkerSlot | None = None) -> bool:
        """Start one worker thread (also used by the slow lane for replacements)."""
        rt = self.rt
        assert rt is not None
        if slot is None and self._lane is not None:
            slot = self._lane.new_slot()
        with self._lock:
            if self._eos_seen:
                return False
            self._alive += 1
        if rt.spawn(lambda: self._worker(slot), self.name):
            return True
        with self._lock:
            self._alive -= 1
        return False

    def _worker(self, slot: WorkerSlot | None) -> None:
        rt = self.rt
        assert rt is not None
        counters = self.counters.new_worker()
        try:
            call = self._make_call()
            self._loop(call, counters, slot)
        except Stopped:
            pass
        except BaseException as exc:
            rt.fail(as_failure(exc, self.name))
        finally:
            self.counters.retire(counters)
            if self._lane is not None and slot is not None:
                self._lane.worker_exited(slot)
            self._worker_exited()

    def _make_call(self) -> Callable[[Any], Any]:
        """The per-item call for this worker thread, with its ``worker_init`` state bound."""
        op, spec = self.spec.op, self.spec
        if spec.worker_init is not None:
            try:
                state = spec.worker_init()
            except Exception as exc:
                raise as_failure(exc, self.name, "worker_init") from None

            def call(item: Any) -> Any:
                return op(item, state)

        else:
            call = op
        if not spec.is_generator:
            return call

        assert self.rt is not None  # called by a worker: the stage has started
        stopping = self.rt.stop.is_set

        def collect(item: Any) -> Any:
            # Collected so the task time is the op's time alone; SKIP inside is ignored.
            # The stop event is looked at between yields: an op that yields without end
            # ran on after close() gave up on it, its list growing (QA: 1 GB in 12 s).
            out = []
            produced = call(item)
            try:
                for r in produced:
                    if stopping():
                        raise Stopped
                    if r is not SKIP:
                        out.append(r)
            finally:
                if (close := getattr(produced, "close", None)) is not None:
                    close()
            return out

        return collect

    def _worker_exited(self) -> None:
        with self._lock:
            self._alive -= 1
            last = self._alive == 0 and self._eos_seen
        rt, out = self.rt, self.out
        assert rt is not None and out is not None
        if not last or rt.stop.is_set():
            return
        error = self.policy.check_final(self.tasks_done())
        if error is not None:
            rt.fail(error)
            return
        try:
            out.put(EOS)
        except Stopped:
            return

    def saw_eos(self, inq: Channel) -> None:
        with self._lock:
            self._eos_seen = True
        inq.put(EOS)  # put back so every sibling worker sees it too

    def eos_seen(self) -> bool:
        with self._lock:
            return self._eos_seen

    # The completion-order loop -----------------------------------------------------

    def _loop(
        self, call: Callable[[Any], Any], counters: WorkerCounters, slot: WorkerSlot | None
    ) -> None:
        inq, out = self.inq, self.out
        assert inq is not None and out is not None
        # The hot path talks to the queues directly (no Channel frames) and falls back to
        # the stop-aware Channel methods only when a wait runs past one poll period.
        stopping, occupancy = inq.stop.is_set, inq.data.qsize
        data_get, credit_back = inq.data.get, inq.credits.put
        credit_get, data_put = out.credits.get, out.data.put
        add_task, generator, lane = counters.add_task, self.spec.is_generator, self._lane
        pc = time.perf_counter
        t0 = pc()
        while True:
            if stopping():
                raise Stopped
            occ = occupancy()
            try:
                item = data_get(timeout=POLL_S)
            except queue.Empty:
                item = inq.get()
            else:
                if item is WAKE:
                    pass_on_wake(inq.data)
                credit_back(None)
            t1 = pc()
            if item is EOS:
                self.saw_eos(inq)
                return
            if slot is not None:
                slot.begin(item)
            counters.running_since = t1
            try:
                result = call(item)
            except Stopped:  # a generator op stopped between yields: not a failure
                raise
            except Exception as exc:
                result = self.failed(item, exc)
            t2 = pc()
            moved = lane.task_done(slot) if lane is not None and slot is not None else False
            skipped = result is SKIP
            if not skipped and result is not _DROPPED:
                for value in result if generator else (result,):
                    try:
                        credit = credit_get(timeout=POLL_S)
                    except queue.Empty:
                        out.put(value)
                    else:
                        if credit is WAKE:
                            pass_on_wake(out.credits)
                        data_put(value)
            t3 = pc()
            add_task(t2 - t1, t1 - t0, t3 - t2, occ, skipped)
            t0 = t3  # the next wait for input starts here
            if moved:
                return  # a slow-lane worker exits after its one task

    # Failures --------------------------------------------------------------------------

    def failed(self, item: Any, exc: Exception) -> Any:
        """Record a failed item; stop the pipeline if the stage's limit is passed."""
        rt = self.rt
        assert rt is not None
        key = item_key(item, self.spec.key_fn)
        add_note(exc, f"stage: {self.name}, sample: {key}")
        record = FailureRecord(stage=self.name, key=key, error=exc)
        # +1: this task is counted only after it returns.
        error = self.policy.record(record, calls=self.tasks_done() + 1)
        if error is None:
            release_locals(exc)  # the record outlives the item: do not keep its bytes
        else:
            rt.fail(error)
            raise Stopped
        return _DROPPED

    def tasks_done(self) -> int:
        return self.counters.tasks()

    def failures(self) -> int:
        return self.policy.failures()

    def slow_lane_view(self) -> tuple[float | None, int, int]:
        if self._lane is None:
            return None, 0, 0
        return self._lane.view()
