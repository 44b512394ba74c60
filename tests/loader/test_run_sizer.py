"""RunSizer: straggler mode's run size from per-sample read and decode times."""

from __future__ import annotations

import pytest

from gpu_loader._run_sizer import RunSizer


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


def test_most_must_be_positive() -> None:
    with pytest.raises(ValueError, match="most"):
        RunSizer(0)
