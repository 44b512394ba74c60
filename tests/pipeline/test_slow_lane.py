"""The slow lane: stragglers move aside, are never restarted, the fast lane keeps going."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_loader.pipeline import LaneThreshold, PipelineBuilder, SlowLane

from ._helpers import CallCounter


class FixedThreshold:
    """A scripted threshold: a fixed limit, every observation kept."""

    def __init__(self, limit: float | None) -> None:
        self._limit = limit
        self.observed: list[float] = []

    def observe(self, duration_s: float) -> None:
        self.observed.append(duration_s)

    def limit(self) -> float | None:
        return self._limit


class Scenario:
    """An op where `slow` items block until released; tracks concurrency per kind."""

    def __init__(self, slow: set[int], fast_s: float = 0.002) -> None:
        self.slow, self.fast_s = slow, fast_s
        self.release = threading.Event()
        self.calls = CallCounter()
        self.lock = threading.Lock()
        self.running_fast = self.running_slow = 0
        self.max_fast_while_slow_stuck = 0

    def op(self, x: int) -> int:
        self.calls.add(x)
        is_slow = x in self.slow
        with self.lock:
            if is_slow:
                self.running_slow += 1
            else:
                self.running_fast += 1
                if self.running_slow == len(self.slow):
                    self.max_fast_while_slow_stuck = max(
                        self.max_fast_while_slow_stuck, self.running_fast
                    )
        try:
            if is_slow:
                # Bounded wait: without a working slow lane the test fails instead of hanging.
                self.release.wait(timeout=3)
            else:
                time.sleep(self.fast_s)
        finally:
            with self.lock:
                if is_slow:
                    self.running_slow -= 1
                else:
                    self.running_fast -= 1
        return x


def sample_stats(p: Any, stop: threading.Event, out: list[tuple[int, int]]) -> Callable[[], None]:
    def loop() -> None:
        while not stop.wait(0.003):
            stage = p.stats().stages[1]
            out.append((stage.slow_lane_size, stage.slow_lane_moves))

    return loop


def test_stragglers_move_and_the_fast_lane_keeps_its_strength() -> None:
    n, slow = 120, {5, 6}
    scenario = Scenario(slow)
    # 100x the fast tasks' 2 ms: a fast task stalled past 30 ms by a busy CI machine moved
    # too (a third move, seen once in ~20 CI runs).
    threshold = FixedThreshold(0.2)
    p = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(
            scenario.op,
            concurrency=2,
            output_order="completion",
            slow_lane=SlowLane(max_threads=2, threshold=threshold),
        )
        .add_sink(2)
        .build()
    )
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_stats(p, stop, samples))
    out: list[int] = []
    t0 = time.monotonic()
    with p:
        sampler.start()
        for x in p:
            out.append(x)
            if len(out) == n - len(slow):
                scenario.release.set()  # every fast item is through: let the stragglers end
    stop.set()
    sampler.join()
    assert time.monotonic() - t0 < 2.5  # no 3 s wait: the fast lane did not stall
    assert sorted(out) == list(range(n))
    assert set(out[-2:]) == slow
    assert all(c == 1 for c in scenario.calls.calls.values())  # never run twice
    assert scenario.max_fast_while_slow_stuck == 2  # fast lane still at `concurrency`
    assert max(size for size, _ in samples) <= 2
    stage = p.stats().stages[1]
    assert (stage.slow_lane_moves, stage.slow_lane_size) == (2, 0)
    assert stage.slow_lane_limit_s == 0.2
    assert len(threshold.observed) == n


def test_a_full_slow_lane_runs_the_stage_at_reduced_strength() -> None:
    n, slow = 60, {5, 6, 7}
    scenario = Scenario(slow)
    p = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(
            scenario.op,
            concurrency=2,
            output_order="completion",
            slow_lane=SlowLane(max_threads=1, threshold=FixedThreshold(0.02)),
        )
        .add_sink(2)
        .build()
    )
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_stats(p, stop, samples))
    with p:
        sampler.start()
        threading.Timer(0.4, scenario.release.set).start()
        out = list(p)
    stop.set()
    sampler.join()
    assert sorted(out) == list(range(n))
    assert all(c == 1 for c in scenario.calls.calls.values())
    # One worker moved; the other two stragglers had to hold the remaining fast workers.
    assert max(size for size, _ in samples) == 1
    assert max(moves for _, moves in samples if moves) >= 1
    assert scenario.max_fast_while_slow_stuck == 0


def test_no_limit_yet_means_no_moves() -> None:
    scenario = Scenario(set())
    p = (
        PipelineBuilder()
        .add_source(range(30))
        .pipe(
            scenario.op,
            concurrency=2,
            output_order="completion",
            slow_lane=SlowLane(max_threads=2, threshold=FixedThreshold(None)),
        )
        .add_sink(2)
        .build()
    )
    with p:
        assert sorted(p) == list(range(30))
    stage = p.stats().stages[1]
    assert (stage.slow_lane_moves, stage.slow_lane_limit_s) == (0, None)


def test_injected_clock_decides() -> None:
    # A frozen clock never lets a task exceed the limit, however long it really runs.
    p = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(
            lambda x: time.sleep(0.05) or x,
            concurrency=1,
            output_order="completion",
            slow_lane=SlowLane(1, FixedThreshold(0.001), clock=lambda: 0.0),
        )
        .add_sink(2)
        .build()
    )
    with p:
        assert list(p) == [0, 1, 2, 3]
    assert p.stats().stages[1].slow_lane_moves == 0


def test_slow_lane_needs_completion_order() -> None:
    lane = SlowLane(1, FixedThreshold(1.0))
    with pytest.raises(ValueError, match='output_order="completion"'):
        PipelineBuilder().add_source([]).pipe(lambda x: x, slow_lane=lane)


def test_slow_lane_validation() -> None:
    assert isinstance(FixedThreshold(1.0), LaneThreshold)
    with pytest.raises(ValueError, match="max_threads"):
        SlowLane(0, FixedThreshold(1.0))
    with pytest.raises(TypeError, match="LaneThreshold"):
        SlowLane(1, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="weight"):
        SlowLane(1, FixedThreshold(1.0), weight=3)  # type: ignore[arg-type]


class Recording:
    """A fixed limit that keeps what it observed."""

    def __init__(self, limit: float) -> None:
        self.seen: list[float] = []
        self._limit = limit

    def observe(self, duration_s: float) -> None:
        self.seen.append(duration_s)

    def limit(self) -> float | None:
        return self._limit


def test_weighted_tasks_are_measured_and_limited_per_unit() -> None:
    """Runs of samples: a run of 8 may take 8 limits, and the threshold learns per sample
    (a lane trained on single samples must not move every run once runs begin)."""
    from gpu_loader.pipeline._slow_lane import LaneState

    now = [0.0]
    threshold = Recording(0.010)
    lane = SlowLane(2, threshold, clock=lambda: now[0], poll_s=0.001, weight=len)
    state = LaneState(None, lane)  # type: ignore[arg-type]  # the stage is not used here
    run, single = state.new_slot(), state.new_slot()
    run.begin(list(range(8)))
    single.begin([0])
    now[0] = 0.012
    assert state._move_stragglers() == 1  # the single sample passed 10 ms; the run did not
    assert single.slow and not run.slow
    assert state._wait == pytest.approx(0.010)  # a new single sample could pass 10 ms by then
    now[0] = 0.040
    assert not state.task_done(run)
    assert threshold.seen == [pytest.approx(0.005)]  # 40 ms over 8 samples
    run.begin(list(range(8)))
    now[0] = 0.040 + 0.081
    assert state._move_stragglers() == 1 and run.slow
    with pytest.raises(ValueError, match="weight") as raised:
        state.new_slot().begin([])  # an empty run weighs 0
    assert "SlowLane.weight" in str(raised.value.__notes__)


def test_watchdog_sleeps_until_a_task_can_pass_the_limit() -> None:
    from gpu_loader.pipeline._slow_lane import MAX_WAIT_POLLS, LaneState

    now = [0.0]
    lane = SlowLane(1, FixedThreshold(0.010), clock=lambda: now[0], poll_s=0.001)
    state = LaneState(None, lane)  # type: ignore[arg-type]  # the stage is not used here
    assert state._move_stragglers() == 0
    assert state._wait == pytest.approx(0.010)  # nothing running: a new task's whole limit
    first, second = state.new_slot(), state.new_slot()
    first.begin("a")
    now[0] = 0.004
    second.begin("b")
    assert state._move_stragglers() == 0
    assert state._wait == pytest.approx(0.006)  # when `first` could pass the limit
    now[0] = 0.0105
    assert state._move_stragglers() == 1  # `first` moved
    assert state._wait == pytest.approx(0.0035)  # `second`'s turn
    now[0] = 0.0142
    # The slow lane is full: `second` stays, and is looked at again after one poll.
    assert state._move_stragglers() == 0
    assert state._wait == pytest.approx(0.001)
    slow = LaneState(None, SlowLane(1, FixedThreshold(5.0), poll_s=0.001))  # type: ignore[arg-type]
    slow._move_stragglers()
    assert slow._wait == pytest.approx(MAX_WAIT_POLLS * 0.001)  # a limit can change meanwhile
