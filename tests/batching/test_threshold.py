"""AdaptiveThreshold: warm-up, percentile * factor, floor, adaptation, thread safety."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from gpu_loader.batching import AdaptiveThreshold
from gpu_loader.pipeline import LaneThreshold, SlowLane


def test_warm_up_gives_no_limit_then_the_percentile_times_factor() -> None:
    t = AdaptiveThreshold(percentile=0.9, factor=3.0, window=64, min_samples=10, refresh_every=1)
    rng = random.Random(0)
    values = [rng.uniform(0.01, 0.05) for _ in range(40)]
    for i, v in enumerate(values):
        t.observe(v)
        seen = values[: i + 1]
        if len(seen) < 10:
            assert t.limit() is None
        else:
            assert t.limit() == pytest.approx(3.0 * np.percentile(seen, 90))
    stats = t.stats()
    assert stats.observations == t.observations == 40 and stats.window_fill == 40
    assert stats.percentile_s == pytest.approx(np.percentile(values, 90))
    assert stats.limit_s == pytest.approx(3.0 * np.percentile(values, 90))


def test_initial_and_floor() -> None:
    t = AdaptiveThreshold(min_samples=4, window=8, initial_s=0.5, floor_s=0.2, refresh_every=1)
    assert t.limit() == 0.5
    for _ in range(4):
        t.observe(0.001)
    assert t.limit() == 0.2  # 2 * 0.001 is below the floor
    assert AdaptiveThreshold(initial_s=0.1, floor_s=0.3).limit() == 0.3


def test_responds_to_a_shift_within_one_window() -> None:
    window = 128
    t = AdaptiveThreshold(window=window, min_samples=32, percentile=0.95, factor=2.0)
    rng = random.Random(1)
    for _ in range(3 * window):
        t.observe(rng.uniform(0.010, 0.020))
    before = t.limit()
    assert before is not None and 0.036 < before < 0.041
    # The tasks get 10x slower while the watchdog polls: one window of new durations
    # moves the limit (all but the last refresh_every - 1 durations are in the cache).
    new = [rng.uniform(0.100, 0.200) for _ in range(window)]
    for v in new:
        t.observe(v)
        t.limit()
    assert t.limit() == pytest.approx(2.0 * np.percentile(new, 95), rel=0.05)
    t.observe(0.15)
    for _ in range(t.refresh_every):
        t.observe(new[-1])
    assert t.limit() == pytest.approx(2.0 * np.percentile(t._ring, 95))
    # And back down again.
    fast = [rng.uniform(0.010, 0.020) for _ in range(window)]
    for v in fast:
        t.observe(v)
    assert t.limit() == pytest.approx(2.0 * np.percentile(fast, 95))


def test_limit_is_cached_between_refreshes() -> None:
    t = AdaptiveThreshold(window=16, min_samples=4, refresh_every=4, factor=1.0, percentile=1.0)
    for v in (1.0, 1.0, 1.0, 1.0):
        t.observe(v)
    assert t.limit() == 1.0
    for v in (5.0, 5.0, 5.0):
        t.observe(v)
        assert t.limit() == 1.0  # fewer than refresh_every new durations: cached
    t.observe(5.0)
    assert t.limit() == 5.0


def test_observe_is_thread_safe() -> None:
    t = AdaptiveThreshold(window=256, min_samples=1)
    per_thread = 5000
    barrier = threading.Barrier(8)

    def work(k: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            t.observe(0.001 * k)
            if i % 100 == 0:
                t.limit()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.observations == 8 * per_thread
    assert t.stats().window_fill == 256
    limit = t.limit()
    assert limit is not None and 0.0 <= limit <= 2 * 0.007


def test_meets_the_engine_protocol() -> None:
    t = AdaptiveThreshold()
    assert isinstance(t, LaneThreshold)
    assert SlowLane(max_threads=2, threshold=t).threshold is t


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"percentile": 95}, ValueError, "for p95 pass 0.95"),
        ({"factor": 0}, ValueError, "`factor` must be a finite number > 0"),
        ({"window": 0}, ValueError, "`window` must be >= 1, got 0"),
        ({"window": 8, "min_samples": 9}, ValueError, r"`min_samples` \(9\) must be <= `window`"),
        ({"floor_s": -1.0}, ValueError, "`floor_s` must be a finite number >= 0"),
        ({"initial_s": 0.0}, ValueError, "`initial_s` must be None or a finite number > 0"),
        ({"refresh_every": 0}, ValueError, "`refresh_every` must be >= 1"),
        ({"window": 8.0}, TypeError, "`window` must be an int"),
        ({"factor": "2"}, TypeError, "`factor` must be a number"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        AdaptiveThreshold(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_durations(bad: float) -> None:
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        AdaptiveThreshold().observe(bad)


def test_limit_then_observe_is_limit_then_observe() -> None:
    # The one-lock path (a fresh cached percentile) and the fallback (warm-up, refresh)
    # give what the two calls give, observation for observation.
    one, two = (AdaptiveThreshold(window=16, min_samples=4, refresh_every=3) for _ in range(2))
    durations = [0.001 * ((7 * i) % 11 + 1) for i in range(40)]
    for d in durations:
        expected = two.limit()
        two.observe(d)
        assert one.limit_then_observe(d) == expected
    assert one.stats() == two.stats()
    with pytest.raises(ValueError, match="finite"):
        one.limit_then_observe(float("nan"))


def test_observe_many_is_observe_each() -> None:
    one, two = (AdaptiveThreshold(window=8, min_samples=3, refresh_every=2) for _ in range(2))
    durations = [0.001 * (i % 5 + 1) for i in range(21)]
    for i in range(0, len(durations), 4):
        one.observe_many(durations[i : i + 4])
        for d in durations[i : i + 4]:
            two.observe(d)
        assert one.limit() == two.limit()
    assert one.stats() == two.stats()
    with pytest.raises(ValueError, match="finite"):
        one.observe_many([0.001, -1.0])
    assert one.stats() == two.stats()  # nothing of a refused batch is kept
