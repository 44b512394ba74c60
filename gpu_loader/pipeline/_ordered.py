"""The input-order ``pipe`` stage for concurrency > 1: a bounded reorder buffer.

Workers number items as they take them, run the op in parallel and deposit results by
number. Whoever deposits the next number due becomes the flusher and hands results on in
order, outside the lock. A window semaphore caps items taken but not yet handed on at
``2 * concurrency``, so one slow item cannot make the buffer grow without limit.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._channel import EOS, POLL_S, WAKE, Channel, StopEvent, Stopped, pass_on_wake
from ._defs import SKIP, PipeSpec
from ._pipe_stage import _DROPPED, PipeStage
from ._slow_lane import WorkerSlot
from ._stats import WorkerCounters


class OrderedPipeStage(PipeStage):
    def __init__(self, spec: PipeSpec) -> None:
        super().__init__(spec)
        self.window = 2 * spec.concurrency
        # Window slots as tokens in a C-level queue: cheaper than threading.Semaphore.
        self._window: queue.SimpleQueue[Any] = queue.SimpleQueue()  # None, or WAKE
        for _ in range(self.window):
            self._window.put(None)
        self._take_lock = threading.Lock()
        self._next_take = 0
        self._out_lock = threading.Lock()
        self._next_out = 0
        self._ready: dict[int, Sequence[Any]] = {}
        self._flushing = False

    def start(self, rt: Any) -> None:
        if isinstance(rt.stop, StopEvent):  # window waits are SimpleQueue waits too
            rt.stop.add_waker(lambda: self._window.put(WAKE))
        super().start(rt)

    def _loop(
        self, call: Callable[[Any], Any], counters: WorkerCounters, slot: WorkerSlot | None
    ) -> None:
        inq = self.inq
        assert inq is not None
        data_get, credit_back, occupancy = inq.data.get, inq.credits.put, inq.data.qsize
        add_task = counters.add_task
        generator = self.spec.is_generator
        pc = time.perf_counter
        stopping = inq.stop.is_set
        while True:
            if stopping():
                raise Stopped
            occ = occupancy()
            t0 = pc()
            self._acquire_window(inq)
            with self._take_lock:
                try:  # direct get; the stop-aware Channel.get only after a poll period
                    item = data_get(timeout=POLL_S)
                except queue.Empty:
                    item = inq.get()
                else:
                    if item is WAKE:
                        pass_on_wake(inq.data)
                    credit_back(None)
                seq = self._next_take
                self._next_take += 1
            t1 = pc()
            if item is EOS:
                self._window.put(None)
                self.saw_eos(inq)
                return
            counters.running_since = t1
            try:
                result = call(item)
            except Stopped:  # a generator op stopped between yields: not a failure
                raise
            except Exception as exc:
                result = self.failed(item, exc)
            t2 = pc()
            skipped = result is SKIP
            if skipped or result is _DROPPED:
                outs: Sequence[Any] = ()
            else:
                outs = result if generator else (result,)
            self._deposit(seq, outs)
            add_task(t2 - t1, t1 - t0, pc() - t2, occ, skipped)

    def _acquire_window(self, inq: Channel) -> None:
        while True:
            try:
                token = self._window.get(timeout=POLL_S)
            except queue.Empty:
                if inq.stop.is_set():
                    raise Stopped from None
                continue
            if token is WAKE:
                pass_on_wake(self._window)
            return

    def _deposit(self, seq: int, outs: Sequence[Any]) -> None:
        with self._out_lock:
            self._ready[seq] = outs
            if self._flushing or seq != self._next_out:
                return
            self._flushing = True
        out = self.out
        assert out is not None
        while True:
            with self._out_lock:
                ready = self._ready.pop(self._next_out, None)
                if ready is None:
                    self._flushing = False
                    return
                self._next_out += 1
            # Put outside the lock: others keep depositing while we wait on backpressure.
            for value in ready:
                try:
                    credit = out.credits.get(timeout=POLL_S)
                except queue.Empty:
                    out.put(value)
                else:
                    if credit is WAKE:
                        pass_on_wake(out.credits)
                    out.data.put(value)
            self._window.put(None)
