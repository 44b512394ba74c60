"""The running pipeline: lifecycle, the consumer's iterator, stats and failures.

``Pipeline`` is the user's handle; ``_Core`` is what threads may reference. Keeping
threads off the handle means ``del pipeline`` (or interpreter exit) triggers the
finalizer, which stops and joins every thread.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from types import TracebackType
from typing import Any

from gpu_loader._threads import interrupt_main_after

from ._channel import EOS, POLL_S, WAKE, Channel
from ._defs import IDLE
from ._errors import FailureRecord
from ._pipe_stage import PipeStage
from ._runtime import JOIN_TIMEOUT_S, Runtime, logger
from ._stage import Stage
from ._stats import PipelineStats, WorkerCounters, find_bottleneck

_ids = itertools.count(1)


class _Core:
    """Stages, channels and runtime of one pipeline; never references the Pipeline."""

    def __init__(self, stages: Sequence[Stage], sink_capacity: int) -> None:
        self.rt = Runtime(f"gpu_loader-pipeline-{next(_ids)}")
        self.stages = tuple(stages)
        self.sink = Channel(sink_capacity, self.rt.stop)
        self.consumer = WorkerCounters()
        self.started_at = 0.0
        self.on_close: list[Callable[[], None]] = []
        upstream: Channel | None = None
        for i, stage in enumerate(self.stages):
            last = i == len(self.stages) - 1
            nxt = self.stages[i + 1] if not last else None
            out = self.sink if nxt is None else Channel(_input_capacity(nxt), self.rt.stop)
            stage.connect(upstream, out)
            upstream = out

    def start(self) -> None:
        self.started_at = time.perf_counter()
        for stage in self.stages:
            stage.start(self.rt)

    def shutdown(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        for wake in list(self.on_close):  # before the join: it may be what ends a wait
            try:
                wake()
            except Exception:
                logger.exception("pipeline %s: an on_close callback raised", self.rt.name)
        self.rt.shutdown(timeout)

    def stats(self) -> PipelineStats:
        stages = tuple(stage.stats() for stage in self.stages)
        with self.consumer.lock:
            items_out, occ_sum, occ_n = (
                self.consumer.tasks,
                self.consumer.occ_sum,
                self.consumer.occ_n,
            )
        sink_mean = occ_sum / occ_n if occ_n else 0.0
        bottleneck, reason = find_bottleneck(stages, sink_mean, self.sink.capacity)
        elapsed = time.perf_counter() - self.started_at if self.started_at else 0.0
        return PipelineStats(
            stages=stages,
            bottleneck=bottleneck,
            bottleneck_reason=reason,
            elapsed_s=elapsed,
            items_out=items_out,
            sink_queue_mean=sink_mean,
            sink_queue_capacity=self.sink.capacity,
        )

    def failures(self) -> list[FailureRecord]:
        records: list[FailureRecord] = []
        for stage in self.stages:
            if isinstance(stage, PipeStage):
                records.extend(stage.policy.records())
        return records

    def report(self, interval: float, on_report: Callable[[PipelineStats], None] | None) -> None:
        """The reporter thread: stats every ``interval`` seconds until the pipeline stops."""
        while not self.rt.stop.wait(interval):
            stats = self.stats()
            if on_report is None:
                logger.info("pipeline stats:\n%s", stats.format())
                continue
            try:
                on_report(stats)
            except Exception:
                # A broken report callback must not stop training; say so loudly instead.
                logger.exception("pipeline %s: on_report raised", self.rt.name)


def _input_capacity(stage: Stage) -> int:
    """Queue capacity in front of ``stage``: enough to keep every worker fed."""
    return max(2, 2 * stage.concurrency)


class _Outputs(Iterator[Any]):
    """What `Pipeline.iterate` returns: its generator, with a `close()` that also closes
    the pipeline before the first next(), where a generator's own close does nothing.
    `send` and `throw` are the generator's, as they were when it was returned bare. The
    pipeline is held weakly: the generator's frame holds it while it may run."""

    __slots__ = ("__weakref__", "_gen", "_pipeline")

    def __init__(self, gen: Generator[Any, None, None], pipeline: Pipeline) -> None:
        self._gen = gen
        self._pipeline = weakref.ref(pipeline)

    def __next__(self) -> Any:
        return next(self._gen)

    def send(self, value: None) -> Any:
        return self._gen.send(value)

    def throw(self, exc: BaseException) -> Any:
        return self._gen.throw(exc)

    def close(self) -> None:
        """Stop iterating and close the pipeline, as leaving a ``for`` loop does."""
        self._gen.close()
        if (pipeline := self._pipeline()) is not None:
            pipeline._close_unstarted()


class Pipeline:
    """A built pipeline. Use ``with pipeline:`` and iterate it; see the package README."""

    def __init__(
        self,
        stages: Sequence[Stage],
        sink_capacity: int,
        report_interval: float | None = None,
        on_report: Callable[[PipelineStats], None] | None = None,
    ) -> None:
        self._core = core = _Core(stages, sink_capacity)
        self._report = (report_interval, on_report)
        self._lock = threading.Lock()
        self._state = "built"  # -> "running" -> "closed"
        self._iterating = False
        self._unstarted: weakref.finalize[Any, Any] | None = None
        self._completed = False
        self._finalizer = weakref.finalize(self, core.shutdown)

    # Lifecycle -------------------------------------------------------------------------

    def start(self) -> Pipeline:
        """Start every thread; a no-op when already running."""
        with self._lock:
            if self._state == "closed":
                raise RuntimeError("this pipeline is closed; build a new one to run again")
            if self._state == "running":
                return self
            self._state = "running"
        core = self._core
        try:
            core.start()
            interval, on_report = self._report
            if interval is not None:
                core.rt.spawn(lambda: core.report(interval, on_report), "reporter")
        except BaseException:
            # e.g. "can't start new thread": join the threads that did start, then re-raise.
            self.close()
            raise
        return self

    def close(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stop and join every thread, each for at most ``timeout`` seconds together
        (a thread still running then is left to end with the process: an op that does not
        return); idempotent, safe from any thread."""
        with self._lock:
            self._state = "closed"
        # Not just `self._finalizer()`: a second caller must also wait for the join.
        self._finalizer.detach()
        self._core.shutdown(timeout)

    def on_close(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` whenever the pipeline closes (`close`, a failed `start`, the
        finalizer), before it joins its threads: for a source or op that waits on
        something of the caller's, which the pipeline's own stop event does not end.
        It may be called more than once and from any thread, so it must be quick and
        idempotent (set an event), and must not reference the pipeline."""
        self._core.on_close.append(wake)

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Consuming -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Yield the outputs; starts the pipeline if needed and closes it when left.

        A pipeline is single-pass: leaving the loop early (break, exception) closes it.
        """
        return self.iterate()

    def iterate(self, *, idle_s: float | None = None) -> Iterator[Any]:
        """Like ``iter(pipeline)``; with ``idle_s``, also yield :data:`IDLE` each time no
        output has arrived for ``idle_s`` seconds.

        For a consumer that must act on events outside the stream (a failure noted by an
        op that produced no output, say) while it waits for the next output.
        """
        if idle_s is not None and not idle_s > 0:
            raise ValueError(f"`idle_s` must be > 0 or None, got {idle_s!r}")
        with self._lock:
            if self._state == "closed":
                raise RuntimeError("this pipeline is closed (single pass); build a new one")
            if self._iterating:
                raise RuntimeError("this pipeline is already being iterated (single consumer)")
            self._iterating = True
        self.start()
        outputs = _Outputs(self._iterate(idle_s), self)
        # A generator dropped before its first next() never runs its `finally`: the
        # threads ran on and the pipeline stayed "being iterated" (QA52). Detached at the
        # first next(), after which the generator's own `finally` closes.
        self._unstarted = weakref.finalize(outputs, self._close_dropped)
        return outputs

    def _close_unstarted(self) -> None:
        """`_Outputs.close` before the first next(): the generator's own close then runs
        no `finally`, so the pipeline is closed here (a Ctrl-C in it is raised as is)."""
        unstarted = self._unstarted
        if unstarted is not None and unstarted.detach() is not None:
            self.close()

    def _close_dropped(self) -> None:
        """`close` for an iterator collected before its first next(): from a finalizer,
        where a Ctrl-C raised is printed as "Exception ignored" and lost (QA53), so it is
        raised again in the main thread once the close has returned, as the iterator's
        own `finally` does."""
        try:
            self.close()
        except KeyboardInterrupt:
            if threading.current_thread() is not threading.main_thread():
                raise
            interrupt_main_after(sys._getframe())

    def _iterate(self, idle_s: float | None) -> Generator[Any, None, None]:
        if self._unstarted is not None:
            self._unstarted.detach()
        core = self._core
        rt, sink, add = core.rt, core.sink, core.consumer.add_task
        stopping, occupancy, data_get, credit_back = (
            rt.stop.is_set,
            sink.data.qsize,
            sink.data.get,
            sink.credits.put,
        )
        poll = POLL_S if idle_s is None else min(POLL_S, idle_s)
        idle_since: float | None = None  # when the current run of empty polls began
        abandoned = False  # the consumer let go mid-stream (a `break`, the collector)
        try:
            while True:
                if stopping():
                    break
                occ = occupancy()
                try:
                    item = data_get(timeout=poll)
                except queue.Empty:
                    if idle_s is not None:  # the clock is read only while idle
                        now = time.monotonic()
                        if idle_since is None:
                            idle_since = now - poll  # this empty poll already waited
                        if now - idle_since >= idle_s:
                            idle_since = now
                            yield IDLE
                    continue
                idle_since = None
                if item is WAKE:
                    sink.data.put(WAKE)
                    break
                credit_back(None)
                if item is EOS:
                    self._completed = True
                    break
                add(0.0, 0.0, 0.0, occ, False)
                yield item
            if rt.fatal is not None:
                raise rt.fatal
        except GeneratorExit:
            abandoned = True
            raise
        finally:
            try:
                self.close()
            except KeyboardInterrupt:
                # A Ctrl-C during the close a `break` (or the collector) runs here: raised
                # from this finalizer it would be printed as "Exception ignored" and lost
                # (QA); it is raised again in the main thread once the close has returned.
                if not abandoned or threading.current_thread() is not threading.main_thread():
                    raise
                interrupt_main_after(sys._getframe())

    # Inspection ------------------------------------------------------------------------

    def stats(self) -> PipelineStats:
        """A snapshot of per-stage and pipeline statistics (cheap; safe while running)."""
        return self._core.stats()

    def failures(self) -> list[FailureRecord]:
        """Every failure recorded so far, in stage order (a snapshot)."""
        return self._core.failures()

    @property
    def completed(self) -> bool:
        """Whether the consumer has had the whole stream: False after a ``close()`` (from
        another thread, say) ended its loop early, which it does quietly, without an
        error; True once the last item was followed by the end of the stream."""
        return self._completed

    @property
    def threads(self) -> list[threading.Thread]:
        """The pipeline's threads that are still alive (for diagnostics and tests)."""
        return self._core.rt.live_threads()
