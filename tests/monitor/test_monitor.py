"""Monitor end to end: a real engine pipeline, a fake NVML, no leaked threads."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpu_loader.monitor import Monitor, MonitorConfig, format_summary
from gpu_loader.pipeline import PipelineBuilder

from ._fakes import FakeGpu, FakeNvml, FakeNVMLError, FakeProc, ScriptedClock, monitor_threads


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(monitor_threads())
    yield
    assert set(monitor_threads()) - before == set()


FAST = MonitorConfig(interval_s=0.002, window_s=5.0)


def slow_decode(x: int) -> int:
    time.sleep(0.002)
    return x


def test_monitor_over_a_real_pipeline() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(sm=40)])
    pipeline = (
        PipelineBuilder()
        .add_source(range(64))
        .pipe(slow_decode, concurrency=1, name="decode")
        .aggregate(8)
        .add_sink(2)
        .build()
    )
    with Monitor(FAST, nvml=nvml) as monitor, pipeline:
        batches = list(monitor.track(pipeline, size=len))
        stats = monitor.stats(pipeline.stats())
    assert len(batches) == 8
    assert (stats.samples, stats.batches) == (64, 8)
    assert stats.startup_s is not None and stats.startup_s > 0
    assert stats.samples_per_s > 0 and stats.elapsed_s >= stats.startup_s
    # The loop does nothing but wait: the loader (its one slow stage) is the bottleneck.
    assert stats.stall_fraction > 0.5
    assert stats.bottleneck == "decode"
    assert stats.gpu is not None and stats.gpu.available
    assert stats.gpu_util_percent == 40.0 and stats.gpu_idle_percent == 60.0
    assert stats.rss_bytes is not None and stats.rss_bytes > 0
    assert [s.name for s in stats.stages][:2] == ["source", "decode"]
    assert stats.as_dict()["stage.decode.tasks_done"] == 64
    assert "decode" in format_summary(stats)


def test_monitor_without_nvml_reports_the_rest() -> None:
    clock = ScriptedClock()
    nvml = FakeNvml(init_error=FakeNVMLError(9))
    with Monitor(FAST, clock=clock, nvml=nvml, proc=FakeProc()) as monitor:
        for _ in range(5):
            with monitor.waiting():
                clock.advance(0.1)
            monitor.record_batch(32)
            clock.advance(1.9)  # a slow training step: 4% stall, below the 5% threshold
        stats = monitor.stats(failures=1)
    assert stats.gpu is not None and not stats.gpu.available
    assert stats.gpu_util_percent is None and stats.gpu_idle_percent is None
    assert stats.startup_s == pytest.approx(0.1)
    assert stats.stall_fraction == pytest.approx(0.4 / 9.9)
    assert stats.samples_per_s == pytest.approx(128 / 9.9)
    assert stats.bottleneck == "training step"
    assert stats.failures == 1 and stats.elapsed_s == pytest.approx(10.0)
    assert "no GPU" in format_summary(stats)


def test_gpu_off_never_touches_nvml() -> None:
    nvml = FakeNvml()
    with Monitor(MonitorConfig(interval_s=0.002, gpu="off"), nvml=nvml) as monitor:
        stats = monitor.stats()
    assert nvml.inits == 0 and stats.gpu is None and monitor.gpu is None
    assert stats.bottleneck is None and stats.samples == 0


def test_track_ends_the_wait_when_the_source_raises() -> None:
    def broken() -> Iterator[list[int]]:
        yield [1, 2]
        raise OSError("disk gone")

    monitor = Monitor(MonitorConfig(gpu="off", interval_s=0.002))
    with monitor, pytest.raises(OSError, match="disk gone"):
        for _ in monitor.track(broken(), size=len):
            pass
    assert monitor.stall.snapshot().waits == 2
    monitor.close()  # idempotent


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="gpu"):
        MonitorConfig(gpu="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window_s"):
        MonitorConfig(window_s=0)
    with pytest.raises(ValueError, match="stall_threshold"):
        MonitorConfig(stall_threshold=1.5)
    assert MonitorConfig(gpu_devices=[1, 0]).gpu_devices == (1, 0)  # type: ignore[arg-type]


def test_suspend_joins_samplers_and_start_samples_again() -> None:
    import threading

    monitor = Monitor(MonitorConfig(gpu="off", interval_s=0.01))
    monitor.start()
    monitor.record_batch(4)
    monitor.suspend()
    assert not [t for t in threading.enumerate() if t.name.startswith("gpu_loader-process")]
    monitor.start()  # fresh sampler threads, same meters
    assert [t for t in threading.enumerate() if t.name.startswith("gpu_loader-process")]
    monitor.record_batch(4)
    assert monitor.stats().samples == 8
    monitor.close()


def test_a_new_epoch_has_no_verdict_before_its_first_batch() -> None:
    # The stage stats are the new epoch's, of no work yet: its first log line named the
    # source stage the bottleneck (QA56).
    monitor = Monitor(MonitorConfig(gpu="off", interval_s=0.01))
    monitor.start()
    for _ in range(3):
        monitor.record_batch(4)
    assert monitor.stats().bottleneck == "training step"
    monitor.suspend()
    monitor.start()
    stats = monitor.stats()
    assert stats.bottleneck is None and stats.bottleneck_reason == "no batch delivered yet"
    monitor.record_batch(4)
    assert monitor.stats().bottleneck == "training step"
    monitor.close()


def test_a_pause_longer_than_the_window_keeps_the_figures_of_the_epoch_before() -> None:
    # The samplers' windows run on the wall clock: after a pause between epochs longer
    # than `window_s` (validation, a checkpoint) the GPU figures were gone (QA55).
    from ._fakes import wait_until

    nvml = FakeNvml(gpus=[FakeGpu(sm=80)])
    monitor = Monitor(MonitorConfig(interval_s=0.005, window_s=0.2), nvml=nvml)
    monitor.start()
    assert wait_until(lambda: monitor.stats().gpu_util_percent is not None)
    monitor.record_batch(4)
    monitor.suspend()
    before = monitor.stats()
    time.sleep(0.3)
    after = monitor.stats()
    assert before.gpu_util_percent == after.gpu_util_percent == pytest.approx(80.0)
    assert after.cpu_percent == before.cpu_percent
    monitor.start()  # a new epoch samples afresh
    assert wait_until(lambda: monitor.gpu is not None and monitor.gpu.snapshot().devices != ())
    monitor.close()


def test_a_ctrl_c_inside_suspend_leaves_no_closed_sampler_for_the_next_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # QA: an interrupt after the samplers closed, before the monitor marked itself
    # suspended, made the next epoch fail with "gpu_loader-process-sampler is closed".
    import threading

    monitor = Monitor(MonitorConfig(gpu="off", interval_s=0.01))
    monitor.start()
    real_close = monitor.process.close

    def interrupted() -> None:
        real_close()
        raise KeyboardInterrupt

    monkeypatch.setattr(monitor.process, "close", interrupted)
    with pytest.raises(KeyboardInterrupt):
        monitor.suspend()
    monitor.start()  # fresh samplers, not the closed one
    assert [t for t in threading.enumerate() if t.name.startswith("gpu_loader-process")]
    monitor.close()


def test_the_pause_between_epochs_leaves_rates_and_stall_alone() -> None:
    # A loader suspends its monitor between epochs (validation, checkpoints): the meters'
    # clock stands still, so an idle hour does not dilute the epochs' figures.
    clock = ScriptedClock()
    config = MonitorConfig(interval_s=60.0, window_s=100.0, gpu="off")
    monitor = Monitor(config, clock=clock, proc=FakeProc())

    def epoch(batches: int, wait_s: float, step_s: float) -> None:
        monitor.start()
        for _ in range(batches):
            monitor.wait_started()
            clock.advance(wait_s)
            monitor.wait_ended()
            monitor.record_batch(10)
            clock.advance(step_s)
        monitor.suspend()

    epoch(5, 0.1, 0.9)  # the first wait is start-up; then 4 waits of 0.1 s in 4.9 s
    first = monitor.stats()
    clock.advance(3600.0)  # an hour of validation
    assert monitor.stats() == first
    epoch(5, 0.1, 0.9)  # every wait counts now, the first one included: 5 x 0.1 s in 5 s
    second = monitor.stats()
    assert second.elapsed_s == pytest.approx(10.0)
    assert second.stall_s == pytest.approx(0.9)
    assert second.stall_fraction == pytest.approx(0.9 / 9.9)
    assert second.samples_per_s == pytest.approx(90 / 9.9)  # after the first batch
    per_epoch = (second.stall_s - first.stall_s) / (second.elapsed_s - first.elapsed_s)
    assert per_epoch == pytest.approx(0.1)
    monitor.close()


def test_the_active_clock_leaves_out_every_pause_not_just_the_last() -> None:
    from gpu_loader.monitor._monitor import ActiveClock

    clock = ScriptedClock(100.0)
    active = ActiveClock(clock)
    for _ in range(3):  # an epoch of 5 s, then 10 s of validation, three times
        clock.advance(5.0)
        active.pause()
        frozen = active()
        clock.advance(10.0)
        assert active() == frozen  # it stands still while paused
        active.resume()
    assert active() == pytest.approx(100.0 + 15.0)


def test_the_verdict_follows_the_recent_stall_not_the_whole_run() -> None:
    # A loader that starved the loop early and keeps up now: "training step", though the
    # stall over the whole run is still above the threshold.
    clock = ScriptedClock()
    config = MonitorConfig(interval_s=60.0, window_s=5.0, gpu="off")
    with Monitor(config, clock=clock, proc=FakeProc()) as monitor:
        for wait_s in [0.1] + [1.0] * 10 + [0.0] * 20:  # start-up, 10 s starved, 10 s fine
            with monitor.waiting():
                clock.advance(wait_s)
            monitor.record_batch(8)
            clock.advance(0.5)
        stats = monitor.stats()
    assert stats.stall_fraction > 0.3 and stats.stall_fraction_recent == 0.0
    assert stats.bottleneck == "training step"


def _odd_fails(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def test_failures_default_to_the_sum_over_the_stages() -> None:
    pipeline = (
        PipelineBuilder()
        .add_source(range(12))
        .pipe(_odd_fails, concurrency=2, name="decode", max_failures=None)
        .pipe(slow_decode, concurrency=1, name="transform")
        .add_sink(4)
        .build()
    )
    config = MonitorConfig(interval_s=60.0, window_s=5.0, gpu="off")
    with Monitor(config, proc=FakeProc()) as monitor, pipeline:
        assert sorted(pipeline) == [0, 2, 4, 6, 8, 10]
        engine = pipeline.stats()
    per_stage = {s.name: s.failures for s in engine.stages}
    assert per_stage["decode"] == 6 and per_stage["transform"] == 0
    assert monitor.stats(engine).failures == 6
    assert monitor.stats(engine, failures=2).failures == 2  # the caller's count wins
