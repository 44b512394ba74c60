"""Live statistics: typed records for the user, cheap counters for the workers."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# Recent task durations kept per worker (and for retired workers) for the percentiles.
_DURATIONS_KEPT = 1024


@dataclass(frozen=True)
class StageStats:
    """One stage, since the pipeline started."""

    name: str
    """The stage's name (``source``, the op's name, ``aggregate(32)``, ...)."""
    kind: str
    """``source``, ``pipe``, ``aggregate`` or ``disaggregate``."""
    concurrency: int
    """Fast-lane worker threads configured."""
    tasks_done: int
    """Input items processed (failed and skipped included)."""
    failures: int
    """Items dropped because the op raised."""
    skipped: int
    """Items the op dropped by returning ``SKIP``."""
    task_time_mean_s: float
    """Mean seconds per task (the op call only, no queue waits)."""
    task_time_p50_s: float
    """Median task seconds over recent tasks."""
    task_time_p90_s: float
    """90th percentile task seconds over recent tasks."""
    task_time_p99_s: float
    """99th percentile task seconds over recent tasks."""
    busy_fraction: float
    """Share of the workers' lifetime spent running tasks (0..1), the tasks still in hand
    included (their time so far)."""
    input_queue_mean: float
    """Mean items waiting in the input queue, seen each time a worker takes one."""
    input_queue_capacity: int
    """Capacity of the input queue (0 for the source, which has none)."""
    blocked_input_s: float
    """Worker-seconds spent waiting for input, summed over workers."""
    blocked_output_s: float
    """Worker-seconds spent waiting to hand off output (backpressure), summed over workers."""
    slow_lane_limit_s: float | None
    """The slow lane's current limit in seconds, per unit of weight when the lane weighs
    its tasks (`SlowLane.weight`; None: no slow lane or no limit yet)."""
    slow_lane_moves: int
    """Workers moved to the slow lane so far."""
    slow_lane_size: int
    """Workers in the slow lane now."""


@dataclass(frozen=True)
class PipelineStats:
    """The whole pipeline, since it started."""

    stages: tuple[StageStats, ...]
    """Per stage, source first."""
    bottleneck: str | None
    """The stage (or ``"consumer"``) that limits throughput; None before any item moved."""
    bottleneck_reason: str
    """One line saying why :attr:`bottleneck` was picked."""
    elapsed_s: float
    """Seconds since ``start()``."""
    items_out: int
    """Items handed to the consumer."""
    sink_queue_mean: float
    """Mean items waiting in the sink buffer when the consumer asked for one."""
    sink_queue_capacity: int
    """Capacity of the sink buffer (``add_sink(buffer_size)``)."""

    def format(self) -> str:
        """A small text table, one row per stage."""
        head = f"{'stage':<20} {'conc':>4} {'done':>8} {'fail':>5} {'mean ms':>8} {'p99 ms':>8} {'busy':>5} {'inq':>6}"
        rows = [head]
        for s in self.stages:
            rows.append(
                f"{s.name[:20]:<20} {s.concurrency:>4} {s.tasks_done:>8} {s.failures:>5} "
                f"{s.task_time_mean_s * 1e3:>8.3f} {s.task_time_p99_s * 1e3:>8.3f} "
                f"{s.busy_fraction:>5.0%} {s.input_queue_mean:>6.1f}"
            )
        rows.append(
            f"out {self.items_out} in {self.elapsed_s:.2f}s; bottleneck: {self.bottleneck} "
            f"({self.bottleneck_reason})"
        )
        return "\n".join(rows)


class WorkerCounters:
    """One worker thread's counters, written by that worker under its own lock."""

    __slots__ = (
        "blocked_in",
        "blocked_out",
        "busy",
        "durations",
        "ended",
        "lock",
        "occ_n",
        "occ_sum",
        "running_since",
        "skipped",
        "started",
        "tasks",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.tasks = 0
        self.skipped = 0
        self.busy = 0.0
        self.blocked_in = 0.0
        self.blocked_out = 0.0
        self.occ_sum = 0
        self.occ_n = 0
        self.durations: deque[float] = deque(maxlen=_DURATIONS_KEPT)
        # When the task in hand started (set by the worker, no lock: one store), None
        # between tasks: a snapshot counts it busy so far (QA: a read hung for seconds
        # left its stage "busy 1%", and the bottleneck named another stage).
        self.running_since: float | None = None

    def add_task(
        self, busy: float, blocked_in: float, blocked_out: float, occupancy: int, skipped: bool
    ) -> None:
        with self.lock:
            self.running_since = None
            self.tasks += 1
            self.skipped += skipped
            self.busy += busy
            self.blocked_in += blocked_in
            self.blocked_out += blocked_out
            self.occ_sum += occupancy
            self.occ_n += 1
            self.durations.append(busy)

    def finish(self) -> None:
        with self.lock:
            if self.ended is None:
                self.ended = time.perf_counter()


@dataclass
class _Totals:
    tasks: int = 0
    skipped: int = 0
    busy: float = 0.0
    running: float = 0.0  # busy time of tasks still in hand (`busy` counts finished ones)
    alive: float = 0.0
    blocked_in: float = 0.0
    blocked_out: float = 0.0
    occ_sum: int = 0
    occ_n: int = 0


class StageCounters:
    """All workers of one stage; retired workers are folded into running totals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: list[WorkerCounters] = []
        self._retired = _Totals()
        self._retired_durations: deque[float] = deque(maxlen=_DURATIONS_KEPT)

    def new_worker(self) -> WorkerCounters:
        counters = WorkerCounters()
        with self._lock:
            self._live.append(counters)
        return counters

    def retire(self, counters: WorkerCounters) -> None:
        """Fold a finished worker into the totals (keeps memory flat under slow-lane churn)."""
        counters.finish()
        with self._lock:
            if counters not in self._live:
                return
            self._live.remove(counters)
            with counters.lock:
                _accumulate(self._retired, counters, time.perf_counter())
                self._retired_durations.extend(counters.durations)

    def tasks(self) -> int:
        with self._lock:
            total = self._retired.tasks
            for counters in self._live:
                with counters.lock:
                    total += counters.tasks
        return total

    def snapshot(self) -> tuple[_Totals, list[float]]:
        now = time.perf_counter()
        with self._lock:
            total = _Totals(**vars(self._retired))
            durations = list(self._retired_durations)
            for counters in self._live:
                with counters.lock:
                    _accumulate(total, counters, now)
                    durations.extend(counters.durations)
        return total, durations


def _accumulate(total: _Totals, c: WorkerCounters, now: float) -> None:
    total.tasks += c.tasks
    total.skipped += c.skipped
    total.busy += c.busy
    since = c.running_since
    if since is not None and c.ended is None:
        total.running += max(0.0, now - since)
    total.alive += (c.ended if c.ended is not None else now) - c.started
    total.blocked_in += c.blocked_in
    total.blocked_out += c.blocked_out
    total.occ_sum += c.occ_sum
    total.occ_n += c.occ_n


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


def find_bottleneck(
    stages: Iterable[StageStats], sink_mean: float, sink_capacity: int
) -> tuple[str | None, str]:
    """Name the stage that limits throughput and say why in one line."""
    active = [s for s in stages if s.tasks_done > 0]
    if not active:
        return None, "no item has moved yet"
    sink_fill = sink_mean / sink_capacity if sink_capacity else 0.0
    if sink_fill >= 0.5:
        return "consumer", (
            f"the sink buffer was {sink_fill:.0%} full on average: "
            "the consumer takes items slower than the stages make them"
        )
    top = max(active, key=lambda s: s.busy_fraction)
    fill = top.input_queue_mean / top.input_queue_capacity if top.input_queue_capacity else 0.0
    return top.name, (
        f"its workers were busy {top.busy_fraction:.0%} of the time (highest), "
        f"input queue {fill:.0%} full on average, "
        f"{top.blocked_output_s:.2f} worker-s blocked on output"
    )
