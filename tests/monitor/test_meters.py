"""StallMeter and RateMeter against a scripted clock: exact fractions and rates."""

from __future__ import annotations

import pytest

from gpu_loader.monitor import RateMeter, StallMeter

from ._fakes import ScriptedClock


def run_waits(meter: StallMeter, clock: ScriptedClock, script: list[tuple[float, float]]) -> None:
    """Each (wait, step): block ``wait`` seconds in next(), then train ``step`` seconds."""
    for wait, step in script:
        with meter.waiting():
            clock.advance(wait)
        clock.advance(step)


def test_stall_before_any_batch_is_zero() -> None:
    clock = ScriptedClock()
    meter = StallMeter(clock)
    snap = meter.snapshot()
    assert (snap.startup_s, snap.stall_fraction, snap.waits) == (None, 0.0, 0)
    meter.wait_started()
    clock.advance(3.0)  # still in the first wait: warm-up, not stall
    assert meter.stall_fraction() == 0.0 and meter.startup_s is None


def test_first_wait_is_startup_and_excluded() -> None:
    clock = ScriptedClock()
    meter = StallMeter(clock, window_s=100.0)
    # warm-up 5 s, then 3 batches: waits 1, 0, 2 s; steps 1 s each.
    run_waits(meter, clock, [(5.0, 1.0), (1.0, 1.0), (0.0, 1.0), (2.0, 1.0)])
    snap = meter.snapshot()
    assert snap.startup_s == 5.0
    assert snap.waited_s == pytest.approx(3.0)
    assert snap.wall_s == pytest.approx(7.0)  # 1 + (1+1) + (0+1) + (2+1)
    assert snap.stall_fraction == pytest.approx(3.0 / 7.0)
    assert snap.stall_fraction_recent == pytest.approx(3.0 / 7.0)  # window longer than run
    assert snap.waits == 4


def test_wait_in_progress_counts_live() -> None:
    clock = ScriptedClock()
    meter = StallMeter(clock, window_s=100.0)
    run_waits(meter, clock, [(2.0, 4.0)])  # t0 after the first wait, then 4 s training
    meter.wait_started()
    clock.advance(4.0)  # starving right now
    assert meter.stall_fraction() == pytest.approx(0.5)
    meter.wait_ended()
    assert meter.stall_fraction() == pytest.approx(0.5)


def test_recent_window_sees_only_recent_waits() -> None:
    clock = ScriptedClock()
    meter = StallMeter(clock, window_s=10.0)
    run_waits(meter, clock, [(1.0, 0.0)])  # warm-up
    run_waits(meter, clock, [(9.0, 1.0)])  # 90% stalled for 10 s
    run_waits(meter, clock, [(0.0, 1.0)] * 8)  # then 8 s without waiting
    run_waits(meter, clock, [(1.0, 1.0)])  # and one 1 s wait
    snap = meter.snapshot()
    assert snap.wall_s == pytest.approx(20.0)
    assert snap.stall_fraction == pytest.approx(10.0 / 20.0)
    # The window [10, 20] after t0 holds the last wait ([18, 19]), none of the 9 s one.
    assert snap.stall_fraction_recent == pytest.approx(1.0 / 10.0)
    clock.advance(4.0)  # window now [14, 24] after t0: the wait at [18, 19] still inside
    assert meter.stall_fraction_recent() == pytest.approx(0.1)


def test_recent_window_clips_a_wait_at_its_edge() -> None:
    clock = ScriptedClock()
    meter = StallMeter(clock, window_s=4.0)
    run_waits(meter, clock, [(1.0, 2.0), (6.0, 1.0)])
    # since t0: step 2 s, wait 6 s, step 1 s (wall 9). Window [5, 9] holds 3 s of the wait.
    assert meter.stall_fraction() == pytest.approx(6.0 / 9.0)
    assert meter.stall_fraction_recent() == pytest.approx(3.0 / 4.0)


def test_waiting_ends_even_when_next_raises() -> None:
    clock = ScriptedClock()
    meter = StallMeter(clock)
    with pytest.raises(StopIteration), meter.waiting():
        clock.advance(1.0)
        raise StopIteration
    assert meter.startup_s == 1.0
    meter.wait_started()  # the meter is usable again


def test_wait_open_says_whether_a_wait_is_running() -> None:
    meter = StallMeter(ScriptedClock())
    assert not meter.wait_open
    meter.wait_started()
    assert meter.wait_open
    meter.wait_ended()
    assert not meter.wait_open
    with pytest.raises(StopIteration), meter.waiting():
        assert meter.wait_open
        raise StopIteration
    assert not meter.wait_open


def test_stall_misuse_is_an_error() -> None:
    meter = StallMeter(ScriptedClock())
    with pytest.raises(RuntimeError, match="without a matching"):
        meter.wait_ended()
    meter.wait_started()
    with pytest.raises(RuntimeError, match="twice"):
        meter.wait_started()
    with pytest.raises(ValueError, match="window_s"):
        StallMeter(window_s=-1.0)


def test_rate_excludes_the_first_batch_and_uses_the_window() -> None:
    clock = ScriptedClock()
    meter = RateMeter(clock, window_s=4.0)
    assert meter.snapshot().samples_per_s == 0.0
    meter.add(32)  # t0: starts the clock
    assert meter.snapshot().samples_per_s == 0.0  # no time has passed
    for _ in range(10):
        clock.advance(1.0)
        meter.add(32)
    snap = meter.snapshot()
    assert (snap.samples, snap.batches) == (352, 11)
    assert snap.samples_per_s == pytest.approx(32.0)
    assert snap.batches_per_s == pytest.approx(1.0)
    assert snap.samples_per_s_recent == pytest.approx(32.0)  # 4 batches in (6, 10]
    # A burst of speed shows in the recent rate before the since-start one.
    for _ in range(4):
        clock.advance(0.5)
        meter.add(64)
    snap = meter.snapshot()
    assert snap.samples_per_s_recent == pytest.approx((2 * 32 + 4 * 64) / 4.0)
    assert snap.samples_per_s == pytest.approx((320 + 256) / 12.0)


def test_rate_recent_window_shorter_than_the_run_so_far() -> None:
    clock = ScriptedClock()
    meter = RateMeter(clock, window_s=10.0)
    meter.add(8)
    clock.advance(2.0)
    meter.add(8)
    snap = meter.snapshot()
    assert snap.samples_per_s_recent == pytest.approx(4.0)  # w = min(10, 2)
    clock.advance(100.0)
    assert meter.snapshot().samples_per_s_recent == 0.0  # nothing recent


def test_rate_validates() -> None:
    meter = RateMeter(ScriptedClock())
    with pytest.raises(ValueError, match="samples"):
        meter.add(-1)
    with pytest.raises(ValueError, match="batches"):
        meter.add(1, batches=True)  # type: ignore[arg-type]


def test_the_recent_window_keeps_only_its_own_waits() -> None:
    # A long run's waits must not pile up: each snapshot walks the ones kept.
    clock = ScriptedClock()
    meter = StallMeter(clock=clock, window_s=10.0)
    for _ in range(1000):  # 100 s of 0.01 s waits every 0.1 s
        meter.wait_started()
        clock.advance(0.01)
        meter.wait_ended()
        clock.advance(0.09)
    assert len(meter._recent) <= 101
    assert meter.snapshot().stall_fraction_recent == pytest.approx(0.1, abs=0.01)


def test_the_first_batch_is_left_out_of_the_recent_rate_too() -> None:
    # It arrives at the end of the start-up: counted in the window it would read as if
    # delivered in no time.
    clock = ScriptedClock()
    meter = RateMeter(clock=clock, window_s=1.0)
    meter.add(100)
    clock.advance(1.0)
    meter.add(10)
    snap = meter.snapshot()
    assert snap.samples_per_s_recent == pytest.approx(10.0)
    assert snap.samples == 110
