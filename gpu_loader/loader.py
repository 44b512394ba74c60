"""`ImageLoader`: the torch-facing iterable over batches of images and labels.

One epoch is one engine pipeline: the sampler's positions -> `read` (I/O threads) ->
`decode` (decode + transform threads, GIL-free) -> a batcher in the consuming thread.
In ``ordered`` mode every sample is written straight into its slot of its batch's
preallocated tensor; in ``straggler`` mode it is written into its own tensor and batches
are assembled from whichever samples are ready (see `gpu_loader.batching`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gpu_loader.batching import (
    AdaptiveThreshold,
    Batch,
    BatcherStats,
    OrderedBatcher,
    StragglerBatcher,
)
from gpu_loader.monitor import (
    JsonlLogger,
    Monitor,
    MonitorConfig,
    ProgressReporter,
    nvml_indices_for_cuda,
)
from gpu_loader.ops import DEFAULT_MAX_PIXELS, EvalTransform, OutputDtype, TrainTransform, load_into
from gpu_loader.pipeline import FailureRecord, PipelineBuilder, SlowLane
from gpu_loader.sources import SampleIndex, Sampler, sample_rng

if TYPE_CHECKING:
    import torch

    from gpu_loader.monitor import LoaderStats

Batching = Literal["ordered", "straggler"]
OnError = Literal["skip", "raise"]
Device = Literal["cpu", "cuda", "auto"]
_STATE_VERSION = 1


@dataclass(frozen=True)
class LoaderOptions:
    """Tuning knobs. Every field has an automatic default that suits most machines."""

    decode_threads: int | None = None
    """Decode + transform threads (default: the CPU count)."""
    io_threads: int | None = None
    """Threads reading bytes (default: 2 for local files, 16 for fsspec URLs)."""
    prefetch_batches: int = 2
    """Batches prepared ahead of the training loop; bounds memory with `max_delay_batches`."""
    max_delay_batches: int = 2
    """``straggler`` mode: the most batches a slow sample may arrive after its nominal batch."""
    max_slow_threads: int | None = None
    """``straggler`` mode: workers allowed in each stage's slow lane at once (default: that
    stage's thread count)."""
    max_pixels: int = DEFAULT_MAX_PIXELS
    """Images with more pixels are refused before decoding (decompression bombs)."""
    pin_memory: bool | None = None
    """Pin CPU batches when CUDA is usable (default: yes when the device is CUDA)."""
    progress: bool = False
    """Show a live progress bar (img/s, stall %, GPU util, bottleneck)."""
    monitor_gpu: bool = True
    """Sample NVML GPU utilisation (the loader's GPU, or all GPUs on the CPU path)."""
    log_jsonl: str | None = None
    """Append a `stats().as_dict()` line to this file every `log_interval_s` seconds."""
    log_interval_s: float = 10.0
    """Seconds between JSON-lines snapshots."""

    def __post_init__(self) -> None:
        for name in ("decode_threads", "io_threads", "max_slow_threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be an int >= 1 or None (automatic), got {value!r}")
        if not isinstance(self.prefetch_batches, int) or self.prefetch_batches < 1:
            raise ValueError(
                f"`prefetch_batches` must be an int >= 1, got {self.prefetch_batches!r}"
            )
        if not isinstance(self.max_delay_batches, int) or self.max_delay_batches < 0:
            raise ValueError(
                f"`max_delay_batches` must be an int >= 0, got {self.max_delay_batches!r}"
            )
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"`max_pixels` must be an int >= 1, got {self.max_pixels!r}")


@dataclass(frozen=True)
class FailedSample:
    """A sample that was not delivered, and why."""

    key: str
    """The sample's key (its path or URL)."""
    stage: str
    """The pipeline stage that failed (``read`` or ``decode``)."""
    error: str
    """``ExceptionType: message``."""
    epoch: int
    """The epoch it failed in."""


@dataclass
class _Task:
    position: int
    index: int
    key: str
    data: bytes | None = None
    out: Any = None


_TORCH_DTYPES = ("float32", "float16", "bfloat16", "uint8")


class ImageLoader:
    """Batches of images ``[B, 3, H, W]`` and int64 labels from an image source.

    >>> loader = ImageLoader(ImageFolder("/data/train"), batch_size=256,
    ...                      transform=TrainTransform(224), device="cpu")
    >>> for epoch in range(3):
    ...     loader.set_epoch(epoch)
    ...     for images, labels in loader:
    ...         ...

    Without `set_epoch`, each completed pass moves on to the next epoch by itself.
    """

    def __init__(
        self,
        source: SampleIndex,
        *,
        batch_size: int,
        transform: TrainTransform | EvalTransform,
        device: Device | str = "cpu",
        dtype: OutputDtype = "float32",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        batching: Batching = "ordered",
        on_error: OnError = "skip",
        max_failures: int | float | None = 0.01,
        options: LoaderOptions | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"`batch_size` must be an int >= 1, got {batch_size!r}")
        if not isinstance(transform, TrainTransform | EvalTransform):
            raise TypeError(
                "`transform` must be gpu_loader.ops.TrainTransform or EvalTransform, "
                f"got {type(transform).__name__}"
            )
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"`dtype` must be one of {_TORCH_DTYPES}, got {dtype!r}")
        if batching not in ("ordered", "straggler"):
            raise ValueError(f"`batching` must be 'ordered' or 'straggler', got {batching!r}")
        if on_error not in ("skip", "raise"):
            raise ValueError(f"`on_error` must be 'skip' or 'raise', got {on_error!r}")
        self.source = source
        self.batch_size = batch_size
        self.transform = transform
        self.dtype: OutputDtype = dtype
        self.seed = seed
        self.drop_last = drop_last
        self.batching: Batching = batching
        self.on_error: OnError = on_error
        self.max_failures = 0 if on_error == "raise" else max_failures
        self.options = options or LoaderOptions()
        self.device = _resolve_device(device)
        self.sampler = Sampler(
            len(source),
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=False,
            fingerprint=source.fingerprint(),
        )
        cpus = os.cpu_count() or 1
        self.decode_threads = self.options.decode_threads or cpus
        self.io_threads = self.options.io_threads or _default_io_threads(source)
        self._resume: dict[str, Any] | None = None
        self._batcher: OrderedBatcher[Any] | StragglerBatcher[Any] | None = None
        self._epoch_done = False
        self._explicit_epoch = False
        self._failed: list[FailedSample] = []
        self._last_engine_stats: Any = None
        self._last_batcher_stats: BatcherStats | None = None
        # A weak reference: the epoch's generator (held by the training loop) keeps the
        # loader alive, never the other way round, so dropping both frees their threads.
        self._active: weakref.ref[_Epoch] | None = None
        self._lock = threading.Lock()
        self._monitor: Monitor | None = None
        self._logger: JsonlLogger | None = None

    # -- the torch-facing surface ---------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch for this rank (before any failed samples are left out)."""
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (reshuffles; per-sample random crops depend on it too)."""
        self.sampler.set_epoch(epoch)
        self._explicit_epoch = True
        self._epoch_done = False
        self._resume = None

    @property
    def epoch(self) -> int:
        return int(self.sampler.epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._epoch_done and not self._explicit_epoch:
            self.sampler.set_epoch(self.sampler.epoch + 1)
        self._epoch_done = False
        self._explicit_epoch = False
        self._stop_epoch()
        epoch = _Epoch(self, self._resume)
        self._resume = None
        self._active = weakref.ref(epoch)
        return epoch.batches()

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot for exact mid-epoch resume (never pickled)."""
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "sampler": self.sampler.state_dict(),
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "batching": self.batching,
            "epoch_done": self._epoch_done,
        }
        active = self._epoch()
        if active is not None and not active.finished:
            state["batcher"] = active.batcher.state_dict()
        elif self._resume is not None:
            state["batcher"] = self._resume
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict()`: the next iteration yields exactly what was left."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"unsupported loader state version {state.get('version')!r}; "
                f"this gpu_loader writes version {_STATE_VERSION}"
            )
        for name in ("batch_size", "drop_last", "batching"):
            if state.get(name) != getattr(self, name):
                raise ValueError(
                    f"state was saved with {name}={state.get(name)!r} but this loader has "
                    f"{name}={getattr(self, name)!r}; build the loader with the same settings"
                )
        self._stop_epoch()
        self.sampler.load_state_dict(state["sampler"])
        self._epoch_done = bool(state.get("epoch_done", False))
        self._explicit_epoch = False
        self._resume = state.get("batcher")

    def failed_samples(self) -> list[FailedSample]:
        """Every sample not delivered so far, with its key, stage and error."""
        with self._lock:
            done = list(self._failed)
        active = self._epoch()
        return done + (active.failures() if active is not None and not active.finished else [])

    def stats(self) -> LoaderStats:
        """A typed snapshot: throughput, stall %, GPU, CPU, memory, stages, bottleneck."""
        active = self._epoch()
        engine = active.pipeline.stats() if active is not None else self._last_engine_stats
        monitor = self._monitor or _make_monitor(self)
        return monitor.stats(engine, failures=len(self.failed_samples()))

    def batching_stats(self) -> BatcherStats | None:
        """The batcher's record for the running (or last) epoch: batches, moved samples and
        their delay in batches, held-back time; None before the first epoch."""
        active = self._epoch()
        if active is not None:
            return active.batcher.stats()
        return self._last_batcher_stats

    def close(self) -> None:
        """Stop the running epoch and the monitor's threads, and join them. Idempotent.

        The loader stays usable: the next iteration starts new threads.
        """
        self._stop_epoch()
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None

    def __enter__(self) -> ImageLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At interpreter shutdown modules may already be gone: nothing left to report to.
        with contextlib.suppress(Exception):
            self.close()

    def _stop_epoch(self) -> None:
        active = self._epoch()
        if active is not None:
            active.close()

    def _epoch(self) -> _Epoch | None:
        return self._active() if self._active is not None else None

    def _monitor_for_epoch(self) -> Monitor:
        """The loader's monitor (made again after `close()`), its samplers started."""
        if self._monitor is None:
            self._monitor = _make_monitor(self)
        if self._logger is None and self.options.log_jsonl is not None:
            self._logger = JsonlLogger(
                self.options.log_jsonl, self.options.log_interval_s, source=self.stats
            )
        self._monitor.start()
        if self._logger is not None:
            self._logger.start()
        return self._monitor

    # -- called by _Epoch ----------------------------------------------------------------
    def _epoch_closed(
        self, records: list[FailedSample], engine_stats: Any, batcher_stats: BatcherStats
    ) -> None:
        with self._lock:
            self._failed.extend(records)
            self._last_engine_stats = engine_stats
            self._last_batcher_stats = batcher_stats

    def _epoch_finished(self) -> None:
        self._epoch_done = True


class _Epoch:
    """One pass: the pipeline, the batcher and the bounded window between them."""

    def __init__(self, loader: ImageLoader, resume: Mapping[str, Any] | None) -> None:
        import torch

        self.loader = loader
        self.finished = False
        self.epoch = loader.epoch
        self.indices = loader.sampler.indices()
        opts = loader.options
        n = len(self.indices)
        size = loader.batch_size
        if loader.batching == "straggler":
            self.batcher: OrderedBatcher[Any] | StragglerBatcher[Any] = StragglerBatcher(
                size, n, max_delay_batches=opts.max_delay_batches, drop_last=loader.drop_last
            )
        else:
            self.batcher = OrderedBatcher(size, n, drop_last=loader.drop_last)
        if resume is not None:
            self.batcher.load_state_dict(resume)
        self.todo = self.batcher.remaining_positions()
        self.window = size * (opts.prefetch_batches + opts.max_delay_batches + 1)
        self.in_flight = 0
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.failed_positions: collections.deque[int] = collections.deque()
        self.stream_done = False
        self.tail: collections.deque[Batch[Any]] = collections.deque()
        self.torch_dtype = getattr(torch, loader.dtype)
        self.out_h, self.out_w = loader.transform.output_size
        self.pin = _want_pin(loader)
        self.buffers: dict[int, torch.Tensor] = {}
        # Straggler mode: per-sample outputs, recycled after they are copied into a batch
        # (at most `window` exist). deque.append/pop are atomic, so no lock is needed.
        self.spare: collections.deque[torch.Tensor] = collections.deque()
        self.buffers_lock = threading.Lock()
        self.pipeline = self._build()

    # -- pipeline ------------------------------------------------------------------------
    def _slow_lane(self, threads: int) -> SlowLane | None:
        """Straggler mode: a task running past the adaptive threshold moves its worker to
        a slow lane and a replacement keeps the stage at strength (each stage learns its
        own threshold: slow reads and slow decodes are different populations)."""
        if self.loader.batching != "straggler":
            return None
        limit = self.loader.options.max_slow_threads or threads
        # p75 x 4 rather than a high percentile: with 10% stragglers p95 *is* a straggler,
        # and a threshold above it would never move one. The floor keeps thread churn away
        # from tasks too short to matter.
        threshold = AdaptiveThreshold(percentile=0.75, factor=4.0, floor_s=0.005)
        return SlowLane(max_threads=limit, threshold=threshold)

    def _build(self) -> Any:
        loader = self.loader
        order: Literal["completion"] = "completion"
        return (
            PipelineBuilder()
            .add_source(self._source())
            .pipe(
                self._read,
                concurrency=loader.io_threads,
                name="read",
                output_order=order,
                max_failures=loader.max_failures,
                key_fn=_task_key,
                slow_lane=self._slow_lane(loader.io_threads),
            )
            .pipe(
                self._decode,
                concurrency=loader.decode_threads,
                name="decode",
                output_order=order,
                max_failures=loader.max_failures,
                key_fn=_task_key,
                slow_lane=self._slow_lane(loader.decode_threads),
            )
            .add_sink(buffer_size=max(2, loader.batch_size))
            .build()
        )

    def _source(self) -> Iterator[_Task]:
        """Positions to run, holding back while `window` samples are in flight."""
        source = self.loader.source
        for position in self.todo:
            with self.cond:
                while self.in_flight >= self.window and not self.stopping.is_set():
                    self.cond.wait(0.05)
                if self.stopping.is_set():
                    return
                self.in_flight += 1
            index = int(self.indices[position])
            self.batcher.started(position)
            yield _Task(position, index, source.key(index))

    def _read(self, task: _Task) -> _Task:
        try:
            task.data = self.loader.source.read(task.index)
        except BaseException:
            self.failed_positions.append(task.position)
            raise
        return task

    def _decode(self, task: _Task) -> _Task:

        loader = self.loader
        try:
            out = self._slot(task.position)
            target = _as_numpy(out)
            load_into(
                task.data or b"",
                loader.transform,
                sample_rng(loader.seed, self.epoch, task.index),
                target,
                dtype=loader.dtype,
                key=task.key,
                max_pixels=loader.options.max_pixels,
            )
        except BaseException:
            self.failed_positions.append(task.position)
            raise
        task.data = None
        task.out = out if loader.batching == "straggler" else None
        return task

    def _new_batch(self, rows: int) -> torch.Tensor:
        import torch

        shape = (rows, 3, self.out_h, self.out_w)
        return torch.empty(shape, dtype=self.torch_dtype, pin_memory=self.pin)

    def _slot(self, position: int) -> torch.Tensor:
        """Where this sample's output goes: its slot in its batch tensor (ordered mode)."""
        import torch

        if self.loader.batching == "straggler":
            try:
                return self.spare.pop()
            except IndexError:
                return torch.empty((3, self.out_h, self.out_w), dtype=self.torch_dtype)
        plan = self.batcher.plan
        b = position // plan.batch_size
        with self.buffers_lock:
            buf = self.buffers.get(b)
            if buf is None:
                buf = self._new_batch(len(plan.batch_range(b)))
                self.buffers[b] = buf
        return buf[position - b * plan.batch_size]

    # -- consuming -----------------------------------------------------------------------
    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        loader = self.loader
        monitor = loader._monitor_for_epoch()
        progress = _make_progress(loader, len(self.todo))
        try:
            with self.pipeline:
                stream = iter(self.pipeline)
                while True:
                    with monitor.waiting():
                        batch = self._next_batch(stream)
                    if batch is None:
                        break
                    images, labels = self._assemble(batch)
                    monitor.record_batch(int(labels.shape[0]))
                    if progress is not None:
                        progress.step(loader.stats)
                    yield images, labels
            self.finished = True
            loader._epoch_finished()
        finally:
            if progress is not None:
                progress.close(loader.stats())
            self.close()

    def _next_batch(self, stream: Iterator[_Task]) -> Batch[Any] | None:
        """Feed completions to the batcher until it emits; then the epoch's tail."""
        batcher = self.batcher
        while not self.stream_done:
            self._drain_failures()
            batch = batcher.pop()
            if batch is not None:
                return batch
            task = next(stream, None)
            if task is None:
                self.stream_done = True
                self._drain_failures()
                self.tail.extend(batcher.pop_final())
            else:
                batcher.push(task.position, task.out)
        return self.tail.popleft() if self.tail else None

    def _drain_failures(self) -> None:
        freed = 0
        while self.failed_positions:
            self.batcher.fail(self.failed_positions.popleft())
            freed += 1
        if freed:
            self._release(freed)

    def _release(self, count: int) -> None:
        with self.cond:
            self.in_flight -= count
            self.cond.notify_all()

    def _assemble(self, batch: Batch[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        positions = batch.positions
        self._release(len(positions))
        labels = torch.from_numpy(
            np.asarray(self.loader.source.labels, dtype=np.int64)[self.indices[list(positions)]]
        )
        # Copies go through numpy: torch's intra-op thread pool would spin on the cores
        # the decode threads are using (measured: 8-40x slower under load).
        if self.loader.batching == "straggler":
            images = self._new_batch(len(positions))
            np.stack([_as_numpy(t) for t in batch.items], out=_as_numpy(images))
            self.spare.extend(batch.items)  # their pages are mapped already: reuse them
        else:
            plan = self.batcher.plan
            b = positions[0] // plan.batch_size
            with self.buffers_lock:
                images = self.buffers.pop(b)
            if len(positions) != images.shape[0]:  # failed samples left out
                keep = [p - b * plan.batch_size for p in positions]
                compact = self._new_batch(len(keep))
                np.take(_as_numpy(images), keep, axis=0, out=_as_numpy(compact))
                images = compact
        device = self.loader.device
        if device.type != "cpu":
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        return images, labels

    # -- failures and shutdown -------------------------------------------------------------
    def failures(self) -> list[FailedSample]:
        return [_as_failed(r, self.epoch) for r in self.pipeline.failures()]

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        self.pipeline.close()
        self.loader._epoch_closed(self.failures(), self.pipeline.stats(), self.batcher.stats())


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor; bfloat16 (which numpy lacks) as its int16 bit patterns."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


def _as_failed(record: FailureRecord, epoch: int) -> FailedSample:
    return FailedSample(key=record.key, stage=record.stage, error=str(record), epoch=epoch)


def _task_key(task: _Task) -> str:
    return task.key


def _resolve_device(device: str) -> torch.device:
    import torch

    from gpu_loader.cuda import cuda_available

    if device == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not cuda_available():
        raise RuntimeError(
            f"device={device!r} was asked for but no CUDA device is usable here; "
            "use device='cpu' or device='auto'"
        )
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"`device` must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    return resolved


def _want_pin(loader: ImageLoader) -> bool:
    if loader.options.pin_memory is not None:
        return loader.options.pin_memory and loader.device.type == "cuda"
    return loader.device.type == "cuda"


def _default_io_threads(source: SampleIndex) -> int:
    remote = getattr(source, "is_remote", False)
    return 16 if remote else 2


def _make_monitor(loader: ImageLoader) -> Monitor:
    """NVML sampling of the loader's GPU when the device is CUDA, else of every GPU there is
    (the CPU path may be feeding one); without NVML the report says "no GPU" once."""
    if not loader.options.monitor_gpu:
        return Monitor(MonitorConfig(gpu="off"))
    devices = None
    if loader.device.type == "cuda":
        devices = nvml_indices_for_cuda([loader.device.index or 0])
    return Monitor(MonitorConfig(gpu="auto", gpu_devices=devices))


def _make_progress(loader: ImageLoader, samples: int) -> ProgressReporter | None:
    if not loader.options.progress:
        return None
    return ProgressReporter(samples, desc=f"epoch {loader.epoch}")
