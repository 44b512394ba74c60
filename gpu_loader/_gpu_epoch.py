"""One epoch on the GPU path: fetch into pinned memory, batch, decode + transform on device.

Two engine pipelines joined by the batcher (the GPU placement of straggler-aware
batching: decode batches are formed from the samples whose bytes have arrived)::

    fetch:  positions -> GpuFetcher (I/O threads: bytes into the pinned arena, crop params)
    decode: batcher -> GpuBatchStage (one CUDA stream + one nvImageCodec decoder per thread)
    training loop: handoff (wait on the batch's event, record_stream) -> (images, labels)

The fetch pipeline is drained by the decode pipeline's source thread, which feeds the
batcher and yields the batches it forms. Per-sample decode failures come back inside each
`GpuBatch`; a failure of a whole batch (a device error) fails each of its samples.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_loader._epoch import IDLE_TICK_S, EpochBase, Task, as_failed, run_key, task_key
from gpu_loader._failed import FailedSample
from gpu_loader.cuda import FetchedSample, GpuBatch, GpuBatchStage, GpuFetcher
from gpu_loader.cuda._gpu_stage import ARENA_OVERFLOW_S
from gpu_loader.pipeline import IDLE, OutputOrder, PipelineBuilder
from gpu_loader.pipeline._errors import MAX_CAUSES, error_text, limit_failure, rate_passed

if TYPE_CHECKING:
    import torch

    from gpu_loader.cuda import WorkerState
    from gpu_loader.loader import ImageLoader


@dataclass(frozen=True)
class GpuEngineStats:
    """Both pipelines' stage records as one list, in data-flow order."""

    stages: tuple[Any, ...]
    """Stage records of the fetch pipeline, then of the decode pipeline."""
    bottleneck: str | None
    """The busiest stage (highest busy fraction), or None before any work."""
    bottleneck_reason: str
    """Why that stage."""


class GpuEpoch(EpochBase):
    """The GPU path of `ImageLoader` (see the module docstring)."""

    after_batching = frozenset({"gpu_decode"})

    def __init__(self, loader: ImageLoader, resume: Mapping[str, Any] | None) -> None:
        super().__init__(loader, resume)
        opts = loader.options
        self.ports = loader._gpu_ports()
        self.arena, self.pixel_arena = loader._gpu_arenas(self.ports)
        self.workers = loader._gpu_workers(self.ports)
        self.gpu_failures: list[FailedSample] = []
        self.gpu_failures_lock = threading.Lock()
        self.gpu_causes: list[Exception] = []  # the first GPU decode errors, for PipelineFailure
        self.delivered_samples = 0
        # After a resume, the samples done before it count against the limits too.
        before = self.received.failures_before(("fetch", "gpu_decode"))
        self.gpu_decode_before = before["gpu_decode"]
        fetcher = GpuFetcher(
            loader.source,
            self.arena,
            loader.transform,
            seed=loader.seed,
            epoch=self.epoch,
            max_pixels=opts.max_pixels,
            stop_event=self.stopping,
            pixel_arena=self.pixel_arena,
            overflow_after_s=ARENA_OVERFLOW_S,
        )
        self.stage = GpuBatchStage(
            self.ports,
            loader.transform,
            self.labels,
            dtype=loader.dtype,
            max_pixels=opts.max_pixels,
        )
        order: OutputOrder = "completion" if loader.batching == "straggler" else "input"
        # The fetch threads also decode the input that is not JPEG (GIL-free), so they get
        # up to 8 of the decode threads unless io_threads was set.
        fetch_threads = opts.io_threads or max(loader.io_threads, min(8, loader.decode_threads))

        def fetch(task: Task) -> FetchedSample:
            me = self.hold(task.key, "fetch")
            try:
                return fetcher(task)
            except BaseException:
                self.note_failure(task.position, "fetch")
                raise
            finally:
                self.in_hand.pop(me, None)

        self.fetch_pipeline = (
            PipelineBuilder()
            .add_source(self.source(), backpressure_s=self.backpressure_s)
            .pipe(
                fetch,
                concurrency=fetch_threads,
                name="fetch",
                output_order=order,
                max_failures=loader.max_failures,
                failures_before=before["fetch"],
                key_fn=task_key,
                slow_lane=self.slow_lane("fetch", fetch_threads),
            )
            .add_sink(buffer_size=max(2, loader.batch_size))
            .build()
        )
        self.decode_pipeline = (
            PipelineBuilder()
            .add_source(self.formed_batches())
            .pipe(
                self.decode_batch,
                concurrency=opts.gpu_streams,
                name="gpu_decode",
                output_order="input",
                # Counted per sample by `check_failure_budget`: a batch that fails whole
                # is one call here, but batch_size samples.
                max_failures=None,
                key_fn=run_key,
                worker_init=self.workers.acquire,
            )
            .add_sink(buffer_size=opts.prefetch_batches)
            .build()
        )
        self.feeds(self.fetch_pipeline)
        self.feeds(self.decode_pipeline)
        self.stream: Iterator[Any] | None = None  # GpuBatch, or IDLE

    # -- the decode pipeline's source thread: the batcher ------------------------------
    def formed_batches(self) -> Iterator[list[FetchedSample]]:
        with self.fetch_pipeline:
            completions = self.fetch_pipeline.iterate(idle_s=IDLE_TICK_S)
            for batch in self.feed_batcher(completions, lambda sample: sample):
                if batch.items:  # every sample of it failed: nothing to decode
                    yield list(batch.items)

    def decode_batch(self, samples: list[FetchedSample], state: WorkerState) -> GpuBatch:
        me = self.hold(run_key(samples), "gpu_decode")
        try:
            return self.stage(samples, state)
        except BaseException as exc:
            # The whole batch is lost (a device error): each sample fails with this cause.
            self.record_gpu_failures([(s.position, s.key, exc) for s in samples])
            raise
        finally:
            self.in_hand.pop(me, None)

    def record_gpu_failures(self, failed: Sequence[tuple[int, str, BaseException]]) -> None:
        with self.gpu_failures_lock:
            for _, key, exc in failed:
                error = error_text(exc)
                self.gpu_failures.append(FailedSample(key, "gpu_decode", error, self.epoch))
                if isinstance(exc, Exception) and len(self.gpu_causes) < MAX_CAUSES:
                    self.gpu_causes.append(exc)
        for position, _, _ in failed:
            self.remember_failure(position, "gpu_decode")
        self.release(len(failed))

    # -- the training loop's thread ----------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.decode_pipeline.start()
        try:
            # Idle ticks while nothing comes, so a wait can be timed (`check_wait`).
            self.stream = self.decode_pipeline.iterate(idle_s=IDLE_TICK_S)
            yield
        finally:
            # Joined for as long as `join_s` allows; the fetch pipeline first (`shutdown`).
            self.fetch_pipeline.close(self.join_s)
            self.decode_pipeline.close(self.join_s)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, Sequence[int]] | None:
        assert self.stream is not None, "running() starts the pipelines first"
        while True:
            batch = next(self.stream, None)
            if batch is IDLE:
                self.check_wait()
                continue
            if batch is None:
                self.check_failure_budget(final=True)
                return None
            if batch.failed:
                self.record_gpu_failures(batch.failed)
            self.delivered_samples += len(batch.positions)
            self.check_failure_budget()
            if batch.positions:
                images, labels = self.stage.handoff(batch)
                if images.device.type == "cpu":
                    # The stand-in runtime (tests): its outputs are host memory, and a host
                    # read does not synchronise the way reading a CUDA tensor does.
                    batch.event.synchronize()
                return images, labels, batch.positions

    def check_failure_budget(self, *, final: bool = False) -> None:
        """Apply `max_failures` to GPU decode failures, counted per sample (the engine
        sees a batch as one call): a count at once, a rate by `rate_passed`, as the engine
        does for the CPU stages."""
        limit = self.loader.max_failures
        if limit is None:
            return
        calls_before, failed_before = self.gpu_decode_before
        with self.gpu_failures_lock:
            own = len(self.gpu_failures)
            causes = list(self.gpu_causes)
        failed, done = own + failed_before, self.delivered_samples + own + calls_before
        if isinstance(limit, int):
            over = failed > limit
        else:
            over = rate_passed(failed, done, limit, final=final)
        if over:
            raise limit_failure(
                f"stage 'gpu_decode': {failed} of {done} sample(s) failed, past "
                f"max_failures={limit!r}; see failed_samples() for every key",
                causes or [RuntimeError("GPU decode failures")],
            )

    # -- failures and shutdown ---------------------------------------------------------
    def failure_errors(self) -> list[Exception]:
        fetched = [r.error for r in self.fetch_pipeline.failures()]
        with self.gpu_failures_lock:
            gpu = list(self.gpu_causes)
        errors = [e for e in fetched if isinstance(e, Exception)] + gpu
        return [e for e in errors if not isinstance(e, InterruptedError)]

    def stage_failures(self) -> list[FailedSample]:
        with self.gpu_failures_lock:
            gpu = list(self.gpu_failures)
        fetched = [
            as_failed(r, self.epoch)
            for r in self.fetch_pipeline.failures()
            # A fetch stopped while it waited for arena room (the epoch was stopped) is
            # not a bad sample.
            if not isinstance(r.error, InterruptedError)
        ]
        return fetched + gpu

    def engine_stats(self) -> GpuEngineStats:
        stages = (*self.fetch_pipeline.stats().stages, *self.decode_pipeline.stats().stages[1:])
        work = [s for s in stages if getattr(s, "kind", "pipe") != "source" and s.tasks_done]
        if not work:
            return GpuEngineStats(stages, None, "no work done yet")
        top = max(work, key=lambda s: s.busy_fraction)
        return GpuEngineStats(
            stages, top.name, f"busiest stage: workers busy {top.busy_fraction:.0%} of the time"
        )

    def threads(self) -> list[threading.Thread]:
        return self.fetch_pipeline.threads + self.decode_pipeline.threads

    def shutdown(self) -> None:
        # The fetch pipeline first: the decode pipeline's source thread iterates it.
        self.fetch_pipeline.close(self.join_s)
        self.decode_pipeline.close(self.join_s)
        self.workers.reclaim()  # the workers that joined: their states can serve again
        if self.fetch_pipeline.threads or self.decode_pipeline.threads:
            # A thread that would not stop in the join timeout (a read hung on remote
            # storage, a stuck decode) may still write its slice or read one: handing those
            # bytes to the next epoch's samples could corrupt them. Give the arenas up; the
            # loader makes new ones.
            self.loader._drop_gpu_arenas(self.arena)
            return
        # Slices of samples dropped in queues never reached the stage that releases them;
        # every worker has joined, so none can still be read.
        self.arena.reset()
        self.pixel_arena.reset()
