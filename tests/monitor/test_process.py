"""ProcessSampler with a fake process and a scripted clock, and once for real."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_loader.monitor import ProcessSampler

from ._fakes import FakeProc, ScriptedClock, monitor_threads, wait_until


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(monitor_threads())
    yield
    assert set(monitor_threads()) - before == set()


def test_cpu_percent_from_cpu_time_deltas() -> None:
    clock, proc = ScriptedClock(), FakeProc()
    sampler = ProcessSampler(1.0, window_s=10.0, clock=clock, proc=proc, cpu_count=4)
    assert sampler.snapshot().cpu_percent is None  # no reading yet
    sampler.sample_once()
    assert sampler.snapshot().cpu_percent is None  # one reading: no interval
    for _ in range(4):  # 1.5 cores busy: 1.0 s user + 0.5 s system per second
        clock.advance(1.0)
        proc.user += 1.0
        proc.system += 0.5
        sampler.sample_once()
    snap = sampler.snapshot()
    assert snap.cpu_percent == pytest.approx(150.0)
    assert snap.cpu_percent_normalised == pytest.approx(37.5)
    assert snap.cpu_seconds == pytest.approx(6.0) and snap.cpu_count == 4
    assert (snap.rss_bytes, snap.pss_bytes, snap.threads) == (100 << 20, 80 << 20, 7)


def test_this_process_s_cpu_time_is_read_at_full_resolution(monkeypatch: Any) -> None:
    # QA63: psutil's cpu_times() counts 10 ms ticks, so an epoch of 20 ms read 245-1086%
    # of a 2-core machine. The sampler of this process reads time.process_time().
    from gpu_loader.monitor import _process

    clock, cpu = ScriptedClock(), [5.0]
    monkeypatch.setattr(_process.time, "process_time", lambda: cpu[0])
    sampler = ProcessSampler(1.0, clock=clock, cpu_count=2)  # this process
    sampler.sample_once()
    clock.advance(0.02)
    cpu[0] += 0.013  # 13 ms in 20 ms: 65%, whatever the tick count says
    sampler.sample_once(pss=False)
    assert sampler.snapshot().cpu_percent == pytest.approx(65.0)


def test_the_window_starts_at_the_cpu_reading_not_after_the_pss_read() -> None:
    # The PSS read takes milliseconds (the kernel walks the page tables): a stamp taken
    # after it left that time out of the window, and the CPU it took in.
    clock, proc = ScriptedClock(), FakeProc()
    full_info = proc.memory_full_info

    def slow_pss() -> Any:
        clock.advance(0.01)
        return full_info()

    proc.memory_full_info = slow_pss  # type: ignore[method-assign]
    sampler = ProcessSampler(1.0, clock=clock, proc=proc, cpu_count=2)
    sampler.sample_once()  # reads PSS: 10 ms
    clock.advance(0.01)
    proc.user += 0.01  # one core busy over the 20 ms since the CPU reading
    sampler.sample_once(pss=False)
    assert sampler.snapshot().cpu_percent == pytest.approx(50.0)


def test_cpu_percent_covers_the_recent_window_only() -> None:
    clock, proc = ScriptedClock(), FakeProc()
    sampler = ProcessSampler(1.0, window_s=3.0, clock=clock, proc=proc, cpu_count=2)
    sampler.sample_once()
    for busy in (1.0, 1.0, 1.0, 0.0, 0.0, 0.0):  # busy, then idle
        clock.advance(1.0)
        proc.user += busy
        sampler.sample_once()
    assert sampler.snapshot().cpu_percent == pytest.approx(0.0)
    assert sampler.snapshot().cpu_seconds == pytest.approx(3.0)


def test_peaks_and_missing_pss() -> None:
    clock, proc = ScriptedClock(), FakeProc(pss=None)
    sampler = ProcessSampler(1.0, clock=clock, proc=proc)
    sampler.sample_once()
    proc.rss = 500 << 20
    sampler.sample_once()
    proc.rss = 200 << 20
    sampler.sample_once()
    snap = sampler.snapshot()
    assert snap.pss_bytes is None and snap.peak_pss_bytes is None
    assert snap.rss_bytes == 200 << 20 and snap.peak_rss_bytes == 500 << 20


def pss_reads_take(proc: FakeProc, clock: ScriptedClock, seconds: float) -> list[float]:
    """Make ``proc``'s PSS readings take ``seconds`` of ``clock``; the list of the clock
    readings at which each began."""
    reads: list[float] = []
    full_info = proc.memory_full_info

    def costly() -> Any:
        reads.append(clock())
        clock.advance(seconds)
        return full_info()

    proc.memory_full_info = costly  # type: ignore[method-assign]
    return reads


def test_pss_is_read_no_more_often_than_its_cost_allows() -> None:
    # The kernel walks the page tables for PSS (milliseconds, more with a larger RSS):
    # at most 1% of one core goes to it, and never to the final reading of close(),
    # which a loader takes in the training loop's thread at each epoch's end.
    from gpu_loader.monitor._process import PSS_CPU_SHARE

    clock, proc = ScriptedClock(start=0.0), FakeProc()
    reads = pss_reads_take(proc, clock, 0.02)
    sampler = ProcessSampler(0.5, clock=clock, proc=proc)
    for tick in range(10):
        proc.pss = (80 + tick) << 20
        sampler.sample_once()
        clock.advance(0.5)
    # 20 ms per reading: the next is due 0.02 / 0.01 = 2 s after the last began.
    assert PSS_CPU_SHARE == 0.01
    assert reads == pytest.approx([0.0, 2.02, 4.04])
    snap = sampler.snapshot()
    assert snap.pss_bytes == snap.peak_pss_bytes == (80 + 8) << 20  # the reading at 4.04 s
    assert snap.rss_bytes == 100 << 20  # RSS is read every tick
    clock.advance(10.0)
    sampler.sample_once(pss=False)  # close()'s final reading
    assert len(reads) == 3
    sampler.sample_once()
    assert len(reads) == 4


def test_a_renewed_sampler_keeps_the_pss_schedule() -> None:
    # A loader's monitor makes a new sampler every epoch: it must not read PSS at once
    # at every epoch's start, nor forget the last reading and the peak.
    clock, proc = ScriptedClock(start=0.0), FakeProc()
    reads = pss_reads_take(proc, clock, 0.02)
    first = ProcessSampler(0.5, clock=clock, proc=proc)
    first.sample_once()
    clock.advance(0.5)
    second = ProcessSampler(0.5, clock=clock, proc=proc)
    second.continue_pss(first)  # 20 ms readings: the next is due 2 s after the first
    proc.pss = 1 << 20
    second.sample_once()
    assert reads == [0.0]
    assert second.snapshot().pss_bytes == second.snapshot().peak_pss_bytes == 80 << 20
    clock.advance(2.0)
    second.sample_once()
    assert len(reads) == 2 and second.snapshot().pss_bytes == 1 << 20
    assert second.snapshot().peak_pss_bytes == 80 << 20


def test_unreadable_process_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpu_loader.monitor")
    sampler = ProcessSampler(1.0, proc=FakeProc(fail=True))
    assert sampler.sample_once() is False
    assert sampler.sample_once() is False
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert sampler.snapshot().rss_bytes is None


def test_real_process_thread_reads_this_process() -> None:
    with ProcessSampler(0.005) as sampler:
        assert wait_until(lambda: sampler.snapshot().cpu_percent is not None)
        sum(i * i for i in range(200_000))  # burn a little CPU
        snap = sampler.snapshot()
    assert not sampler.running
    assert snap.rss_bytes is not None and snap.rss_bytes > 10 << 20
    assert snap.cpu_percent is not None and snap.cpu_percent >= 0.0
    assert snap.threads is not None and snap.threads >= 2  # the main thread and the sampler


def test_a_run_shorter_than_one_interval_still_has_a_cpu_figure() -> None:
    clock, proc = ScriptedClock(), FakeProc()
    sampler = ProcessSampler(60.0, window_s=120.0, clock=clock, proc=proc)
    sampler.start()  # the thread reads once at start, then waits a minute
    assert wait_until(lambda: sampler.snapshot().rss_bytes is not None)
    clock.advance(0.3)
    proc.user += 0.3  # one core busy for the 0.3 s run
    sampler.close()  # and once more at the end
    assert sampler.snapshot().cpu_percent == pytest.approx(100.0)
    never = ProcessSampler(60.0, clock=clock, proc=FakeProc())
    never.close()  # never started: nothing to read at the end either
    assert never.snapshot().cpu_percent is None and never.snapshot().rss_bytes is None
