"""Monitor: owns the meters and samplers and assembles :class:`LoaderStats`.

The loader wraps its consumer-facing iterator with :meth:`Monitor.track` (or calls
``waiting()`` and ``record_batch()`` itself) and passes the engine's stats record to
:meth:`Monitor.stats`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

from ._gpu_types import GpuSnapshot
from ._nvml import NvmlSampler
from ._periodic import check_interval
from ._process import ProcessSampler, ProcessSnapshot
from ._rate import RateMeter
from ._stall import StallMeter
from ._stats import LoaderStats, diagnose

GpuMode = Literal["auto", "off"]
_T = TypeVar("_T")


@dataclass(frozen=True)
class MonitorConfig:
    """How the monitor samples.

    ``gpu="auto"`` samples ``gpu_devices`` (NVML indices; None = every device) and
    degrades to "no GPU" without NVML; ``"off"`` never touches NVML.
    """

    interval_s: float = 0.5
    """Seconds between NVML and process readings."""
    window_s: float = 10.0
    """Length of the "recent" window for rates, stall and GPU means."""
    gpu: GpuMode = "auto"
    """Whether to sample GPUs through NVML."""
    gpu_devices: tuple[int, ...] | None = None
    """NVML indices to sample; None for all."""
    gpu_uuids: tuple[str, ...] | None = None
    """Device UUIDs to sample, ahead of ``gpu_devices`` (the fallback when one is not
    among NVML's devices): exact whatever ``CUDA_VISIBLE_DEVICES`` and
    ``CUDA_DEVICE_ORDER`` say."""
    stall_threshold: float = 0.05
    """Stall fraction below which the training step, not the loader, is the bottleneck."""

    def __post_init__(self) -> None:
        check_interval("interval_s", self.interval_s)
        check_interval("window_s", self.window_s)
        if self.gpu not in ("auto", "off"):
            raise ValueError(f'`gpu` must be "auto" or "off", got {self.gpu!r}')
        if self.gpu_devices is not None:
            object.__setattr__(self, "gpu_devices", tuple(self.gpu_devices))
        if isinstance(self.gpu_uuids, str | bytes):  # one UUID, not its characters (QA)
            object.__setattr__(self, "gpu_uuids", (self.gpu_uuids,))
        elif self.gpu_uuids is not None:
            object.__setattr__(self, "gpu_uuids", tuple(self.gpu_uuids))
        if not 0.0 <= self.stall_threshold < 1.0:
            raise ValueError(f"`stall_threshold` must be in [0, 1), got {self.stall_threshold!r}")


class ActiveClock:
    """``clock`` with the time between `pause()` and `resume()` left out (it stands still)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # stats() reads it from any thread, mid-resume too
        self._paused_total = 0.0
        self._paused_at: float | None = None

    def __call__(self) -> float:
        with self._lock:
            paused_at = self._paused_at
            now = self._clock() if paused_at is None else paused_at
            return now - self._paused_total

    def pause(self) -> None:
        with self._lock:
            if self._paused_at is None:
                self._paused_at = self._clock()

    def resume(self) -> None:
        with self._lock:
            if self._paused_at is not None:
                self._paused_total += self._clock() - self._paused_at
                self._paused_at = None


class Monitor:
    """Stall and rate meters, a process sampler and (optionally) an NVML sampler.

    ``clock`` drives the meters (seconds, ``time.perf_counter`` by default); they run on
    *active* time: between `suspend()` and the next `start()` (a loader between epochs:
    validation, checkpointing) the clock stands still, so rates and stall fractions
    describe the epochs, not the pauses. ``nvml`` and ``proc`` are passed to the
    samplers (fakes in tests).
    """

    def __init__(
        self,
        config: MonitorConfig | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        nvml: Any = None,
        proc: Any = None,
    ) -> None:
        self.config = config if config is not None else MonitorConfig()
        cfg = self.config
        self._clock = ActiveClock(clock)
        clock = self._clock
        self._nvml = nvml
        self._proc = proc
        self._suspended = False
        self._batches_at_start = 0
        """Batches before the latest `start` after a `suspend` (a loader's epoch)."""
        self._frozen: tuple[ProcessSnapshot, GpuSnapshot | None] | None = None
        """The samplers' snapshots as `suspend` found them, which `stats` gives until the
        next `start`."""
        self._gpu_retired = False  # an NVML sampler that found no NVML is never restarted
        self.stall = StallMeter(clock, cfg.window_s)
        self.rate = RateMeter(clock, cfg.window_s)
        self.process = ProcessSampler(cfg.interval_s, window_s=cfg.window_s, proc=proc)
        self.gpu: NvmlSampler | None = None
        if cfg.gpu == "auto":
            self.gpu = NvmlSampler(
                cfg.gpu_devices,
                device_uuids=cfg.gpu_uuids,
                interval_s=cfg.interval_s,
                window_s=cfg.window_s,
                nvml=nvml,
            )
        self._started_at: float | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the samplers (idempotent); elapsed time counts from the first call."""
        if self._started_at is None:
            self._started_at = self._clock()
        if self._suspended:
            self._clock.resume()
            self._renew_samplers()
            self._batches_at_start = self.rate.snapshot().batches
        self.process.start()
        if self.gpu is not None and not self._gpu_retired:
            self.gpu.start()

    def close(self) -> None:
        """Stop and join the sampler threads (idempotent)."""
        if self.gpu is not None:
            self.gpu.close()
        self.process.close()

    def suspend(self) -> None:
        """Join the sampler threads but keep the meters and the last readings; the next
        `start()` samples again with fresh sampler threads (a loader between epochs).
        The meters' clock stands still until then."""
        # Marked first: a Ctrl-C inside close() must not leave closed samplers that the
        # next start() would reuse (QA: "gpu_loader-process-sampler is closed").
        self._suspended = True
        self._clock.pause()
        self.close()
        # The samplers' windows run on the wall clock: read now, as the epoch ended, or a
        # stats() after a pause longer than `window_s` (validation, a checkpoint) had lost
        # the GPU figures, the frozen one at close() too (QA55).
        self._frozen = (
            self.process.snapshot(),
            self.gpu.snapshot() if self.gpu is not None else None,
        )

    def _renew_samplers(self) -> None:
        cfg = self.config
        previous = self.process
        self.process = ProcessSampler(cfg.interval_s, window_s=cfg.window_s, proc=self._proc)
        self.process.continue_pss(previous)  # PSS stays on its own, slower schedule
        # An NVML sampler that found no NVML has no thread and already said why once: keep
        # it (and its reason) rather than warn again every epoch.
        if self.gpu is not None and self.gpu.snapshot().available:
            self.gpu = NvmlSampler(
                cfg.gpu_devices,
                device_uuids=cfg.gpu_uuids,
                interval_s=cfg.interval_s,
                window_s=cfg.window_s,
                nvml=self._nvml,
            )
        elif self.gpu is not None:
            self._gpu_retired = True
        self._suspended = False
        self._frozen = None

    def __enter__(self) -> Monitor:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- recording ---------------------------------------------------------------------
    def wait_started(self) -> None:
        """The consumer blocks on ``next()`` now."""
        self.stall.wait_started()

    def wait_ended(self) -> None:
        """The consumer got its item."""
        self.stall.wait_ended()

    @property
    def wait_open(self) -> bool:
        """A wait has started and not ended (`StallMeter.wait_open`)."""
        return self.stall.wait_open

    def waiting(self) -> Any:
        """Context manager around the blocking ``next()``."""
        return self.stall.waiting()

    def record_batch(self, samples: int) -> None:
        """One batch of ``samples`` samples reached the consumer."""
        self.rate.add(samples)

    def track(self, items: Iterable[_T], *, size: Callable[[_T], int]) -> Iterator[_T]:
        """Yield from ``items``, timing each ``next()`` and counting ``size(item)`` samples."""
        self.start()
        iterator = iter(items)
        while True:
            with self.stall.waiting():
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            self.rate.add(size(item))
            yield item

    # -- reading -----------------------------------------------------------------------
    def stats(
        self,
        engine: Any = None,
        *,
        stages: Sequence[Any] | None = None,
        failures: int | None = None,
    ) -> LoaderStats:
        """Assemble the snapshot. ``engine`` is the engine's stats record (its
        ``stages``, ``bottleneck`` and ``bottleneck_reason`` are used when present);
        ``stages`` overrides its stage list; ``failures`` defaults to the stages' sum.
        """
        now = self._clock()
        stall = self.stall.snapshot()
        rate = self.rate.snapshot()
        if (frozen := self._frozen) is not None:
            proc, gpu = frozen
        else:
            proc = self.process.snapshot()
            gpu = self.gpu.snapshot() if self.gpu is not None else None
        stage_list = tuple(stages if stages is not None else getattr(engine, "stages", ()) or ())
        if failures is None:
            failures = sum(int(getattr(s, "failures", 0) or 0) for s in stage_list)
        # No batch yet since the samplers started again: the stage stats are the new
        # epoch's, of no work yet (QA56: its first log line named the source stage).
        batches = rate.batches if rate.batches > self._batches_at_start else 0
        bottleneck, reason = diagnose(
            stall.stall_fraction_recent,  # now, as the stage stats (this epoch's) are
            batches,
            stage_list,
            getattr(engine, "bottleneck", None),
            getattr(engine, "bottleneck_reason", None),
            self.config.stall_threshold,
        )
        return LoaderStats(
            elapsed_s=now - self._started_at if self._started_at is not None else 0.0,
            samples=rate.samples,
            batches=rate.batches,
            samples_per_s=rate.samples_per_s,
            samples_per_s_recent=rate.samples_per_s_recent,
            batches_per_s=rate.batches_per_s,
            batches_per_s_recent=rate.batches_per_s_recent,
            stall_fraction=stall.stall_fraction,
            stall_s=stall.waited_s,
            stall_fraction_recent=stall.stall_fraction_recent,
            startup_s=stall.startup_s,
            gpu=gpu,
            gpu_util_percent=gpu.util_percent if gpu is not None else None,
            gpu_idle_percent=gpu.idle_percent if gpu is not None else None,
            cpu_percent=proc.cpu_percent,
            cpu_percent_normalised=proc.cpu_percent_normalised,
            rss_bytes=proc.rss_bytes,
            pss_bytes=proc.pss_bytes,
            stages=stage_list,
            bottleneck=bottleneck,
            bottleneck_reason=reason,
            failures=failures,
        )
