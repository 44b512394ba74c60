"""RunSizer: straggler mode's run size from per-sample read and decode times; RunLength:
ordered mode's, from their CPU time and the reads' wall time."""

from __future__ import annotations

import pytest

from gpu_loader import _run_sizer
from gpu_loader._run_sizer import RunLength, RunSizer


def feed(sizer: RunSizer, reads: list[float], decodes: list[float]) -> None:
    for i in range(0, len(reads), 8):  # in runs, as the epoch records them
        sizer.observe("read", reads[i : i + 8])
    for i in range(0, len(decodes), 8):
        sizer.observe("decode", decodes[i : i + 8])


def test_one_sample_per_call_until_it_has_seen_enough_of_both() -> None:
    sizer = RunSizer(8, min_samples=16)
    assert sizer.size() == 1
    feed(sizer, [0.0001] * 16, [0.002] * 15)
    assert sizer.size() == 1  # one decode short
    sizer.observe("decode", [0.002])
    assert sizer.size() == 8


def test_runs_while_no_read_outlasts_decoding_a_run() -> None:
    sizer = RunSizer(8, min_samples=16)
    # Reads up to 15 ms against 2 ms decodes: the slowest read is shorter than a run's
    # decodes (16 ms), so a run it holds loses nothing a single sample would not.
    feed(sizer, [0.0001] * 90 + [0.015] * 10, [0.002] * 100)
    assert sizer.size() == 8
    sizer = RunSizer(8, min_samples=16)
    feed(sizer, [0.0001] * 90 + [0.017] * 10, [0.002] * 100)
    assert sizer.size() == 1


def test_a_heavy_read_tail_turns_runs_off_and_they_come_back_when_it_leaves() -> None:
    sizer = RunSizer(4, min_samples=16)
    feed(sizer, [0.0002] * 200, [0.001] * 200)
    assert sizer.size() == 4
    # 5% of reads wait 150 ms (remote storage): the p99 is one of them.
    feed(sizer, [0.150 if i % 20 == 0 else 0.0002 for i in range(200)], [])
    assert sizer.size() == 1
    # The window keeps the last 256 reads: once they are fast again, so are runs.
    feed(sizer, [0.0002] * 256, [])
    assert sizer.size() == 4


def test_reads_under_the_straggler_floor_never_turn_runs_off() -> None:
    # Tiny images: 40 us decodes, reads ~0.1 ms and up to 1 ms waiting for the GIL. No
    # slow lane moves a task under the floor, so such reads are no reason for one sample
    # per call (which halved the img/s); past the floor they are.
    sizer = RunSizer(8, min_samples=16)
    feed(sizer, [0.0001] * 90 + [0.001] * 10, [0.00004] * 100)
    assert sizer.size() == 8
    sizer = RunSizer(8, min_samples=16)
    feed(sizer, [0.0001] * 90 + [_run_sizer.STRAGGLER_FLOOR_S * 1.2] * 10, [0.00004] * 100)
    assert sizer.size() == 1


def test_the_early_verdict_allows_reads_under_the_straggler_floor() -> None:
    clock = Clock()
    sizer = RunSizer(8, probe=4, clock=clock)
    probe_reads(sizer, clock, [0.0002, 0.0005, 0.001, 0.002])  # 8 x 40 us is 0.32 ms
    sizer.observe("decode", [0.00004] * 8)
    assert sizer.verdict() == 8


def test_most_must_be_positive() -> None:
    with pytest.raises(ValueError, match="most"):
        RunSizer(0)


class Clock:
    """A scripted clock: time moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def probe_reads(sizer: RunSizer, clock: Clock, took: list[float]) -> None:
    """Reads that start together and end after ``took`` seconds each (the clock ends at
    the last)."""
    began = clock.now
    places = [sizer.read_began() for _ in took]
    for place, t in sorted(zip(places, took, strict=True), key=lambda pt: pt[1]):
        assert place is not None
        clock.now = began + t
        sizer.read_ended(place)


def test_the_early_verdict_gives_runs_once_every_probe_read_has_finished_fast() -> None:
    clock = Clock()
    sizer = RunSizer(8, probe=4, clock=clock)
    probe_reads(sizer, clock, [0.001, 0.002, 0.003])
    assert sizer.read_began() == 3  # the fourth and last probe read
    assert sizer.read_began() is None  # past the probe
    sizer.observe("decode", [0.002] * 7)
    assert sizer.verdict() is None and sizer.size() == 1  # its bound needs 8 decodes
    sizer.observe("decode", [0.002])
    # Three reads finished well within 8 x 2 ms; the fourth is still running: not yet.
    assert sizer.verdict() is None and sizer.probing
    clock.now += 0.010
    sizer.read_ended(3)
    assert sizer.verdict() == 8 and sizer.size() == 8 and not sizer.probing


def test_a_probe_read_still_running_past_the_bound_turns_runs_off() -> None:
    # The first reads to finish are the fast ones: a verdict from finished reads alone
    # would say runs while the slow read is still running.
    clock = Clock()
    sizer = RunSizer(8, probe=4, clock=clock)
    slow = sizer.read_began()
    probe_reads(sizer, clock, [0.001, 0.001, 0.001])
    sizer.observe("decode", [0.002] * 8)
    assert sizer.verdict() is None  # the slow read has run 1 ms of its bound's 16
    clock.now = 0.017
    assert sizer.verdict() == 1 and sizer.size() == 1
    assert slow is not None
    sizer.read_ended(slow)  # it ends; the verdict stands
    assert sizer.verdict() == 1


def test_a_finished_probe_read_past_the_bound_turns_runs_off() -> None:
    clock = Clock()
    sizer = RunSizer(4, probe=4, clock=clock)
    probe_reads(sizer, clock, [0.001, 0.001, 0.001, 0.009])  # bound: 4 x 2 ms
    sizer.observe("decode", [0.002] * 8)
    assert sizer.verdict() == 1


def test_the_percentiles_overrule_the_early_verdict_once_they_have_enough() -> None:
    clock = Clock()
    sizer = RunSizer(8, min_samples=16, probe=4, clock=clock)
    probe_reads(sizer, clock, [0.001] * 4)
    sizer.observe("decode", [0.002] * 8)
    assert sizer.size() == 8  # the verdict, while the percentiles warm up
    feed(sizer, [0.0001] * 10 + [0.2] * 6, [0.002] * 8)
    assert sizer.size() == 1  # p99 read 200 ms > 8 x 2 ms


def test_probe_must_be_positive() -> None:
    with pytest.raises(ValueError, match="probe"):
        RunSizer(8, probe=0)


def test_reads_without_decodes_end_the_wait_for_a_verdict() -> None:
    # Decodes that all fail (a corrupt dataset) never give the verdict its bound; the
    # source's window would stay capped. After `min_samples` reads it stops waiting.
    clock = Clock()
    sizer = RunSizer(8, min_samples=16, probe=4, clock=clock)
    probe_reads(sizer, clock, [0.001] * 4)
    feed(sizer, [0.001] * 15, [])
    assert sizer.verdict() is None
    feed(sizer, [0.001], [])
    assert sizer.verdict() == 1 and not sizer.probing


# -- RunLength ---------------------------------------------------------------------------
def test_run_length_stays_at_its_base_until_both_stages_are_measured() -> None:
    lengths = RunLength(8, 64)
    assert lengths.size() == 8
    lengths.observe("read", wall_s=0.0008, cpu_s=0.0001, samples=8)
    assert lengths.size() == 8  # no decode yet
    lengths.observe("decode", wall_s=0.0008, cpu_s=0.0003, samples=8)
    # 50 us of CPU per sample: 2 ms hold 40.
    assert lengths.size() == int(_run_sizer.RUN_CPU_S / 50e-6) == 40


def test_run_length_never_leaves_base_to_cap() -> None:
    lengths = RunLength(8, 16)
    lengths.observe("read", wall_s=1e-6, cpu_s=1e-6, samples=8)
    lengths.observe("decode", wall_s=1e-6, cpu_s=1e-6, samples=8)
    assert lengths.size() == 16  # cheap samples: the cap
    lengths = RunLength(8, 64)
    lengths.observe("read", wall_s=0.008, cpu_s=0.0008, samples=8)
    lengths.observe("decode", wall_s=0.08, cpu_s=0.016, samples=8)  # 2 ms a decode
    assert lengths.size() == 8  # typical photos: the base, as before runs grew


def test_run_length_is_not_fooled_by_cheap_cpu_in_slow_reads() -> None:
    # Remote reads: little CPU, long waits. Their wall time, in turn, bounds the run.
    lengths = RunLength(4, 64)
    lengths.observe("decode", wall_s=0.0004, cpu_s=0.0004, samples=8)
    lengths.observe("read", wall_s=0.008, cpu_s=0.00008, samples=8)  # 1 ms each
    assert lengths.size() == int(_run_sizer.RUN_READ_WALL_S / 0.001) == 20
    lengths.observe("read", wall_s=1.2, cpu_s=0.00008, samples=8)  # 150 ms each
    assert lengths.size() == 4


def test_run_length_follows_a_change_in_cost() -> None:
    lengths = RunLength(8, 64, smoothing=0.5)
    lengths.observe("read", wall_s=0.0001, cpu_s=0.0001, samples=10)
    lengths.observe("decode", wall_s=0.0004, cpu_s=0.0004, samples=10)
    assert lengths.size() == 40
    for _ in range(20):  # the data turns heavy: the mean forgets the cheap runs
        lengths.observe("decode", wall_s=0.01, cpu_s=0.01, samples=10)
    assert lengths.size() == 8


def test_run_length_ignores_empty_runs_and_unknown_stages() -> None:
    lengths = RunLength(8, 64)
    lengths.observe("read", wall_s=0.0, cpu_s=0.0, samples=0)
    lengths.observe("augment", wall_s=0.0, cpu_s=0.0, samples=8)
    assert lengths.cpu_s == {"read": None, "decode": None} and lengths.read_wall_s is None


@pytest.mark.parametrize(
    ("base", "cap", "smoothing", "match"),
    [(0, 8, 0.2, "base"), (8, 4, 0.2, "cap"), (8, 64, 0.0, "smoothing"), (8, 64, 1.5, "smoothing")],
)
def test_run_length_refuses_bad_settings(base: int, cap: int, smoothing: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RunLength(base, cap, smoothing=smoothing)


def test_straggler_runs_follow_run_length_while_they_are_on() -> None:
    lengths = RunLength(8, 64)
    sizer = RunSizer(8, min_samples=16, lengths=lengths)
    lengths.observe("read", wall_s=0.0008, cpu_s=0.0001, samples=8)
    lengths.observe("decode", wall_s=0.0008, cpu_s=0.0003, samples=8)
    assert sizer.size() == 1  # nothing judged yet: the early verdict's wait
    feed(sizer, [0.0001] * 100, [0.00004] * 100)
    assert sizer.size() == lengths.size() == 40  # runs on: as long as cheap samples allow
    feed(sizer, [0.150] * 40, [])  # slow reads: one per call, however cheap the samples
    assert sizer.size() == 1


def test_a_sizers_run_length_starts_at_its_most() -> None:
    with pytest.raises(ValueError, match="lengths"):
        RunSizer(8, lengths=RunLength(4, 64))
