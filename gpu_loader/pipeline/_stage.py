"""The stage interface and the single-threaded stage kinds: source, aggregate, disaggregate.

A stage kind reads from ``inq`` (None for the source), writes to ``out``, sends ``EOS``
downstream exactly once after its last item, and reports errors through the runtime.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable
from typing import Any

from ._channel import EOS, POLL_S, WAKE, Channel, Stopped, pass_on_wake
from ._runtime import Runtime, as_failure
from ._stats import StageCounters, StageStats, percentile


class Stage:
    """Base class: wiring, stats and the one-thread run loop shared by simple kinds."""

    kind = "stage"

    def __init__(self, name: str, concurrency: int = 1) -> None:
        self.name = name
        self.concurrency = concurrency
        self.inq: Channel | None = None
        self.out: Channel | None = None
        self.counters = StageCounters()
        self.rt: Runtime | None = None

    def connect(self, inq: Channel | None, out: Channel) -> None:
        self.inq, self.out = inq, out

    def start(self, rt: Runtime) -> None:
        self.rt = rt
        rt.spawn(self._run_guarded, self.name)

    def _run_guarded(self, target: Callable[[], None] | None = None, detail: str = "") -> None:
        """Run ``target`` (the stage's own loop by default) as a thread of the stage: an
        error of it stops the run with a ``stage: <name>`` note, ``detail`` saying where."""
        rt = self.rt
        assert rt is not None  # set by start() before the thread exists
        try:
            (target or self._run)()
        except Stopped:
            return
        except BaseException as exc:
            rt.fail(as_failure(exc, self.name, detail))

    def _run(self) -> None:
        raise NotImplementedError

    # Stats -----------------------------------------------------------------------

    def failures(self) -> int:
        return 0

    def slow_lane_view(self) -> tuple[float | None, int, int]:
        return None, 0, 0

    def stats(self) -> StageStats:
        total, durations = self.counters.snapshot()
        durations.sort()
        limit, moves, size = self.slow_lane_view()
        failures = self.failures()
        return StageStats(
            name=self.name,
            kind=self.kind,
            concurrency=self.concurrency,
            tasks_done=total.tasks,
            failures=failures,
            skipped=total.skipped,
            task_time_mean_s=total.busy / total.tasks if total.tasks else 0.0,
            task_time_p50_s=percentile(durations, 0.50),
            task_time_p90_s=percentile(durations, 0.90),
            task_time_p99_s=percentile(durations, 0.99),
            busy_fraction=(
                min(1.0, (total.busy + total.running) / total.alive) if total.alive > 0 else 0.0
            ),
            input_queue_mean=total.occ_sum / total.occ_n if total.occ_n else 0.0,
            input_queue_capacity=self.inq.capacity if self.inq is not None else 0,
            blocked_input_s=total.blocked_in,
            blocked_output_s=total.blocked_out,
            slow_lane_limit_s=limit,
            slow_lane_moves=moves,
            slow_lane_size=size,
        )


class SourceStage(Stage):
    """Pulls the user's iterable on its own thread (so a slow index never blocks a worker)."""

    kind = "source"

    def __init__(
        self, iterable: Iterable[Any], backpressure_s: Callable[[], float] | None = None
    ) -> None:
        super().__init__("source")
        self._iterable = iterable
        self._backpressure_s = backpressure_s

    def _run(self) -> None:
        out = self.out
        assert out is not None
        counters = self.counters.new_worker()
        add_task, pc = counters.add_task, time.perf_counter
        credit_get, data_put, stopping = out.credits.get, out.data.put, out.stop.is_set
        backpressure = self._backpressure_s or (lambda: 0.0)
        try:
            it = iter(self._iterable)
            sentinel = object()
            t0 = pc()
            waited = backpressure()
            while True:
                item = next(it, sentinel)
                t1 = pc()
                # Waiting inside the iterable for room downstream is not work.
                before, waited = waited, backpressure()
                held = min(max(0.0, waited - before), t1 - t0)
                t0 += held
                if item is sentinel:
                    break
                if stopping():
                    raise Stopped
                try:  # direct put; the stop-aware Channel.put only after a poll period
                    credit = credit_get(timeout=POLL_S)
                except queue.Empty:
                    out.put(item)
                else:
                    if credit is WAKE:
                        pass_on_wake(out.credits)
                    data_put(item)
                t2 = pc()
                add_task(t1 - t0, 0.0, t2 - t1 + held, 0, False)
                t0 = t2
            out.put(EOS)
        finally:
            self.counters.retire(counters)


class AggregateStage(Stage):
    """Groups items into lists of ``size``; the last short list is kept unless ``drop_last``."""

    kind = "aggregate"

    def __init__(self, size: int, drop_last: bool) -> None:
        super().__init__(f"aggregate({size})")
        self._size = size
        self._drop_last = drop_last

    def _run(self) -> None:
        inq, out = self.inq, self.out
        assert inq is not None and out is not None
        counters = self.counters.new_worker()
        pc, size = time.perf_counter, self._size
        batch: list[Any] = []
        try:
            while True:
                occupancy = inq.occupancy()
                t0 = pc()
                item = inq.get()
                t1 = pc()
                if item is EOS:
                    break
                batch.append(item)
                if len(batch) == size:
                    out.put(batch)
                    batch = []
                counters.add_task(0.0, t1 - t0, pc() - t1, occupancy, False)
            if batch and not self._drop_last:
                out.put(batch)
            out.put(EOS)
        finally:
            self.counters.retire(counters)


class DisaggregateStage(Stage):
    """Emits the elements of each incoming sequence one by one."""

    kind = "disaggregate"

    def __init__(self) -> None:
        super().__init__("disaggregate")

    def _run(self) -> None:
        inq, out = self.inq, self.out
        assert inq is not None and out is not None
        counters = self.counters.new_worker()
        pc = time.perf_counter
        try:
            while True:
                occupancy = inq.occupancy()
                t0 = pc()
                items = inq.get()
                t1 = pc()
                if items is EOS:
                    break
                try:
                    elements = iter(items)
                except TypeError:
                    raise TypeError(
                        f"disaggregate() needs an iterable from the stage before it, got "
                        f"{type(items).__name__}; put it after aggregate() or an op that "
                        "returns a list"
                    ) from None
                for element in elements:
                    out.put(element)
                counters.add_task(0.0, t1 - t0, pc() - t1, occupancy, False)
            out.put(EOS)
        finally:
            self.counters.retire(counters)
