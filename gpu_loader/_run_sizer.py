"""How many samples the CPU path's next read and decode call takes (``samples_per_task``
automatic): `RunLength` in both modes, and in straggler mode `RunSizer`, which follows it
while runs are on at all.

One sample per engine call lets the slow lane move a single slow sample, but pays the
per-call costs under the GIL (queue hops, stage counters, the slow-lane bookkeeping) for
every sample: about twice the CPU per image of runs of 8 with decode made free. A run
reads its files one after another, so a slow read holds the rest of its run: that is
what the slow lane exists for when reads are slow (remote storage), and costs little
when no read takes longer than decoding a run. So the loader measures both per sample
and runs up to ``most`` samples per call while the slowest reads (their p99) are no
longer than decoding a run (``most`` x the median decode) or than `STRAGGLER_FLOOR_S`,
one sample per call otherwise.

Until it has seen ``min_samples`` of each, an early verdict decides from the loader's
first ``probe`` reads, started one sample per call while the source keeps at most
``probe`` samples (or two per thread, if more) in flight (`EpochBase.room`). Without
that cap, a loader's whole first window (160 samples in the benchmark) went out one per
call before anything was measured, at about twice the CPU per image, right when the
training loop waits for its first batches. The first reads to *finish* are the fast
ones, so the verdict counts the first ``probe`` reads to *start*: slow as soon as one of
them, finished or still running, has taken longer than decoding a run; fast once all of
them have finished within that bound.

Decode stragglers are not a reason to stop runs: the samples a run has decoded reach the
batcher only when it ends, so a slow decode would hold them, but a batch waits for them
only until that decode passes the per-sample straggler limit (`StragglerRows.hold_back`),
as it waits for a single slow decode.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence

from gpu_loader.batching import AdaptiveThreshold

MIN_SAMPLES = 64
"""Per-sample reads and decodes seen before the percentiles decide (once per loader: the
sizer lives as long as its loader, so later epochs start from what it measured)."""

PROBE = 32
"""Reads the early verdict judges: with 10% of reads slow, 32 all fast has a 3% chance."""

PROBE_DECODES = 8
"""Decodes timed before the early verdict's bound (``most`` x their median) exists."""

STRAGGLER_FLOOR_S = 0.005
"""Straggler mode's slow lanes move no task shorter than this (`AdaptiveThreshold`'s
``floor_s``): a read under it is never moved alone, so runs go on while the slowest reads
are under it, however cheap decoding is. Without it, tiny images (40 us decodes, reads
that wait ~0.3 ms for the GIL) ran one sample per call at half the img/s of runs."""


class RunSizer:
    """Per-sample read and decode times, and the run size they allow. Thread-safe."""

    def __init__(
        self,
        most: int,
        *,
        min_samples: int = MIN_SAMPLES,
        probe: int = PROBE,
        clock: Callable[[], float] = time.perf_counter,
        lengths: RunLength | None = None,
    ) -> None:
        if most < 1:
            raise ValueError(f"`most` must be >= 1, got {most}")
        if lengths is not None and lengths.base != most:
            raise ValueError(f"`lengths` must start at `most` ({most}), not {lengths.base}")
        if probe < 1:
            raise ValueError(f"`probe` must be >= 1, got {probe}")
        self.most = most
        self.lengths = lengths
        """Once runs are on, how long (`RunLength`: past ``most`` while samples are cheap);
        None: ``most``."""
        self.probe = probe
        self.clock = clock
        # Raw percentiles (factor 1): the slowest reads, the typical decode.
        self.reads = AdaptiveThreshold(
            percentile=0.99, factor=1.0, window=256, min_samples=min_samples, refresh_every=32
        )
        self.decodes = AdaptiveThreshold(
            percentile=0.5, factor=1.0, window=256, min_samples=min_samples, refresh_every=32
        )
        # The early verdict: `most` or 1 once given, None before.
        self.early: int | None = None
        self._lock = threading.Lock()
        self._began: list[float] = []  # the probe reads' start times, in start order
        self._took: list[float | None] = []  # their durations (None: still running)
        self._decodes: list[float] = []  # the first decodes' durations

    @property
    def probing(self) -> bool:
        """True until the early verdict is given (the source caps its window meanwhile)."""
        return self.early is None

    def read_began(self) -> int | None:
        """A read starts: its place in the probe (for `read_ended`), or None past it."""
        if self.early is not None or len(self._began) >= self.probe:  # no lock: a hint
            return None
        with self._lock:
            if len(self._began) >= self.probe:
                return None
            self._began.append(self.clock())
            self._took.append(None)
            return len(self._began) - 1

    def read_ended(self, place: int) -> None:
        """The probe read `read_began` placed at ``place`` has ended (failed or not)."""
        now = self.clock()
        with self._lock:
            self._took[place] = now - self._began[place]

    def observe(self, stage: str, seconds: Sequence[float]) -> None:
        """Samples' reads (``stage="read"``) or decodes took ``seconds`` each."""
        if stage == "read":
            self.reads.observe_many(seconds)
            return
        self.decodes.observe_many(seconds)
        if self.early is None and len(self._decodes) < PROBE_DECODES:
            with self._lock:
                self._decodes.extend(seconds[: PROBE_DECODES - len(self._decodes)])

    def size(self) -> int:
        """Samples for the next run: ``most`` (or as `lengths` says) while no read outlasts
        decoding a run."""
        slowest_read = self.reads.limit()
        typical_decode = self.decodes.limit()
        if slowest_read is None or typical_decode is None:
            return self.verdict() or 1
        if slowest_read > self.bound(typical_decode):
            return 1
        return self.most if self.lengths is None else self.lengths.size()

    def bound(self, typical_decode: float) -> float:
        """The slowest read runs allow: decoding a run, and at least `STRAGGLER_FLOOR_S`."""
        return max(self.most * typical_decode, STRAGGLER_FLOOR_S)

    def verdict(self) -> int | None:
        """The early verdict (see the module's docstring), given once; None until then."""
        if self.early is not None:
            return self.early
        with self._lock:
            if len(self._decodes) < PROBE_DECODES:
                if self.reads.limit() is not None:
                    # `min_samples` reads and still too few decodes (they fail): one
                    # sample per call, and the source's window cap lifts.
                    self.early = 1
                return self.early
            bound = self.bound(statistics.median(self._decodes))
            now = self.clock()
            times = [
                now - began if took is None else took
                for began, took in zip(self._began, self._took, strict=True)
            ]
            if any(t > bound for t in times):  # finished or still running
                self.early = 1
            elif len(times) == self.probe and None not in self._took:
                self.early = self.most
            return self.early


RUN_CPU_S = 0.002
"""`RunLength`: the CPU time a run aims at. A run's hand-offs between the engine's threads
cost about 0.1-0.3 ms of the GIL whatever its length (measured: 32-64 px JPEGs to a 32 px
output ran at 57 us of CPU per image in runs of 128 against 149 in runs of 8)."""

RUN_READ_WALL_S = 0.020
"""`RunLength`: the longest wall time a run's reads may take one after another (a run
reads its files in turn: a long run of slow reads would hold its batch)."""

MOST_LONG = 64
"""`RunLength`: the longest run, whatever the measurements."""


class RunLength:
    """The CPU path's run length, with ``samples_per_task`` automatic (in straggler mode
    while its `RunSizer` has runs on).

    Runs start at ``base`` (the fixed default, up to 8) and grow towards ``cap`` while
    samples are cheap: as many as take about `RUN_CPU_S` of CPU to read and decode,
    while their reads, in turn, take no longer than `RUN_READ_WALL_S`. CPU time, not wall
    time, because a thread's wall time under the GIL includes its waits for it, which the
    hand-offs cause. Never fewer than ``base``. Each stage's per-sample time is an
    exponentially weighted mean over its runs; two threads' updates may race, which loses
    a run's weight in the mean, never more. Durations come from the caller (no clock
    here), so tests script them.
    """

    def __init__(self, base: int, cap: int, *, smoothing: float = 0.2) -> None:
        if base < 1:
            raise ValueError(f"`base` must be >= 1, got {base}")
        if cap < base:
            raise ValueError(f"`cap` must be >= base ({base}), got {cap}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"`smoothing` must be in (0, 1], got {smoothing}")
        self.base = base
        self.cap = cap
        self.smoothing = smoothing
        self.cpu_s: dict[str, float | None] = {"read": None, "decode": None}
        """Per sample and stage: CPU seconds (thread time)."""
        self.read_wall_s: float | None = None
        """Per sample: the read stage's wall seconds."""

    def observe(self, stage: str, wall_s: float, cpu_s: float, samples: int) -> None:
        """A run of ``samples`` of ``stage`` ("read" or "decode") took ``wall_s`` seconds,
        ``cpu_s`` of them on the CPU of its thread."""
        if samples < 1 or stage not in self.cpu_s:
            return
        self.cpu_s[stage] = self._mean(self.cpu_s[stage], cpu_s / samples)
        if stage == "read":
            self.read_wall_s = self._mean(self.read_wall_s, wall_s / samples)

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def size(self) -> int:
        """Samples for the next run."""
        read, decode, wall = self.cpu_s["read"], self.cpu_s["decode"], self.read_wall_s
        if read is None or decode is None or wall is None:
            return self.base
        fits = min(RUN_CPU_S / max(read + decode, 1e-9), RUN_READ_WALL_S / max(wall, 1e-9))
        return max(self.base, min(self.cap, int(fits)))
