"""ProgressReporter throttling and output, JsonlLogger lines."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_loader.monitor import JsonlLogger, LoaderStats, ProgressReporter

from ._fakes import ScriptedClock, monitor_threads, wait_until
from .test_stats import make_stats


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(monitor_threads())
    yield
    assert set(monitor_threads()) - before == set()


@pytest.mark.parametrize("lines", [False, True])
def test_progress_refreshes_at_most_every_interval(lines: bool) -> None:
    clock, out = ScriptedClock(), io.StringIO()
    calls: list[int] = []

    def get_stats() -> LoaderStats:
        calls.append(1)
        return make_stats(samples=320 * len(calls))

    reporter = ProgressReporter(total=1000, min_interval_s=0.5, file=out, clock=clock, lines=lines)
    assert out.getvalue() == ""  # nothing printed before the first refresh
    assert reporter.step(get_stats) is True
    for _ in range(10):  # 10 batches within 0.1 s: no refresh, no stats() call
        clock.advance(0.01)
        assert reporter.step(get_stats) is False
    assert len(calls) == 1
    clock.advance(0.5)
    assert reporter.step(get_stats) is True
    reporter.close(make_stats(samples=1000))
    reporter.close()  # idempotent
    assert reporter.step(get_stats) is False  # closed
    assert len(calls) == 2
    text = out.getvalue()
    assert "img/s=601" in text and "stall=12.5%" in text and "gpu=80%" in text
    assert "bottleneck=decode" in text
    assert "1000/1000" in text


def test_progress_without_total_shows_the_count() -> None:
    out = io.StringIO()
    with ProgressReporter(file=out, desc="demo", lines=False) as reporter:
        reporter.update(make_stats(samples=64, failures=0))
    assert "demo: 64 img" in out.getvalue()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_plain_lines() -> None:
    # A log file gets whole lines, not a bar's carriage-return redraws, and fewer of them.
    clock, log = ScriptedClock(), io.StringIO()
    reporter = ProgressReporter(total=1000, desc="epoch 0", file=log, clock=clock)
    assert reporter.lines and reporter.min_interval_s == 10.0
    reporter.step(lambda: make_stats(samples=250, failures=0))
    clock.advance(5.0)
    assert reporter.step(lambda: make_stats(samples=500)) is False  # not yet 10 s
    reporter.close(make_stats(samples=1000, failures=0))
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [
        "epoch 0: 250/1000 img (25%) img/s=601 stall=12.5% gpu=80% bottleneck=decode",
        "epoch 0: 1000/1000 img (100%) img/s=601 stall=12.5% gpu=80% bottleneck=decode",
    ]
    terminal = ProgressReporter(total=10, file=Terminal())
    assert not terminal.lines and terminal.min_interval_s == 0.5


def test_progress_counts_from_its_start() -> None:
    # A loader's stats count every epoch: the second epoch's bar starts at 1000, not 0.
    out = io.StringIO()
    with ProgressReporter(
        total=1000, file=out, desc="epoch 1", start=1000, lines=False, start_failures=4
    ) as reporter:
        reporter.update(make_stats(samples=1064))
        reporter.update(make_stats(samples=2000))
    text = out.getvalue()
    assert "64/1000" in text and "1000/1000" in text and "2000" not in text


def test_progress_validates() -> None:
    with pytest.raises(ValueError, match="start"):
        ProgressReporter(start=-1)
    with pytest.raises(ValueError, match="total"):
        ProgressReporter(total=-1)
    with pytest.raises(ValueError, match="min_interval_s"):
        ProgressReporter(min_interval_s=0)


def test_jsonl_logger_writes_periodic_lines_that_parse(tmp_path: Path) -> None:
    path = tmp_path / "stats.jsonl"
    count = [0]

    def source() -> LoaderStats:
        count[0] += 1
        return make_stats(samples=count[0])

    logger = JsonlLogger(path, interval_s=0.001, source=source)
    assert not path.exists()  # nothing opened before the first line
    with logger:
        assert wait_until(lambda: logger.lines >= 3)
    written = logger.lines
    lines = path.read_text().splitlines()
    assert len(lines) == written >= 4  # periodic lines plus the final one at close
    records = [json.loads(line) for line in lines]
    assert [r["samples"] for r in records] == sorted(r["samples"] for r in records)
    for record in records:
        assert record["stage.decode.p90_ms"] == pytest.approx(12.5)
        assert isinstance(record["time_unix"], float)
    with pytest.raises(RuntimeError, match="closed"):
        logger.write(make_stats())


def test_jsonl_manual_writes_append(tmp_path: Path) -> None:
    path = tmp_path / "stats.jsonl"
    path.write_text('{"earlier": 1}\n')
    logger = JsonlLogger(path, interval_s=60.0)
    logger.write(make_stats())
    logger.write(replace(make_stats(), samples=7))
    logger.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"earlier": 1} and lines[2]["samples"] == 7 and len(lines) == 3


def test_a_ctrl_c_in_close_still_writes_the_last_line_and_closes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA: a Ctrl-C held back by the stop event's `set` was raised before the join and the
    # teardown, and the second close() found nothing to do: no last line, the file open.
    import os
    import signal
    import threading
    import time

    path = tmp_path / "stats.jsonl"
    logger = JsonlLogger(path, interval_s=60.0, source=make_stats)
    logger.start()
    real = threading.Event.set

    def set_with_ctrl_c(event: threading.Event) -> None:
        if event is logger._stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        real(event)

    monkeypatch.setattr(threading.Event, "set", set_with_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        logger.close()
    monkeypatch.undo()
    assert not logger.running
    assert len(path.read_text().splitlines()) == 2  # the first tick and the last line
    assert logger._file is None or logger._file.closed


def test_jsonl_failing_source_stops_logging_not_training(tmp_path: Path) -> None:
    def broken() -> LoaderStats:
        raise RuntimeError("stats exploded")

    logger = JsonlLogger(tmp_path / "s.jsonl", interval_s=0.001, source=broken)
    logger.start()
    assert wait_until(lambda: not logger.running)
    logger.close()
    assert logger.lines == 0


def test_jsonl_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        JsonlLogger(tmp_path / "nope" / "s.jsonl")


def test_an_unwritable_log_warns_once_not_twice_an_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A loader makes a logger per epoch: a path that cannot be written warned twice an
    # epoch (the periodic line, then the final one), every epoch.
    import logging

    import gpu_loader.monitor._jsonl as jsonl

    monkeypatch.setattr(jsonl, "_warned", set())
    caplog.set_level(logging.DEBUG, logger="gpu_loader.monitor")
    folder = tmp_path / "a-folder"  # opening it to append fails
    folder.mkdir()
    for _ in range(3):  # three epochs
        logger = JsonlLogger(folder, interval_s=0.001, source=make_stats)
        logger.start()
        assert wait_until(lambda log=logger: not log.running)  # its first line failed
        logger.close()
        assert logger.failure is not None and "IsADirectoryError" in logger.failure
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(folder) in warned[0].getMessage()


def test_jsonl_lines_are_on_disk_before_close_and_carry_the_extra_fields(
    tmp_path: Path,
) -> None:
    # A crash loses at most the line being written: each is flushed as it goes.
    path = tmp_path / "stats.jsonl"
    logger = JsonlLogger(path, interval_s=60.0, fields=lambda: {"epoch": 3})
    logger.write(make_stats())
    logger.write(replace(make_stats(), samples=7))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    logger.close()
    assert [line["epoch"] for line in lines] == [3, 3] and lines[1]["samples"] == 7


@pytest.mark.parametrize("lines", [False, True])
def test_a_later_epochs_progress_counts_from_its_own_start(lines: bool) -> None:
    # The loader's stats count every epoch's samples; epoch 2 of 50 starts at 100.
    out = io.StringIO()
    reporter = ProgressReporter(total=50, file=out, start=100, lines=lines, start_failures=4)
    reporter.update(make_stats(samples=120))
    reporter.close(make_stats(samples=130))
    text = out.getvalue()
    assert "30/50" in text and "130/" not in text and "120/" not in text


@pytest.mark.parametrize("lines", [False, True])
def test_failed_samples_count_towards_the_total(lines: bool) -> None:
    # An epoch of 64 with 7 bad files delivers 57: its bar ended at 57/64 beside failed=7.
    # Repeats that pad a rank's last batches are delivered too: the count stops at the total.
    out = io.StringIO()
    reporter = ProgressReporter(total=64, file=out, start=100, lines=lines, start_failures=2)
    reporter.update(make_stats(samples=130, failures=5))
    reporter.update(make_stats(samples=157, failures=9))
    reporter.close(make_stats(samples=164, failures=9))
    text = out.getvalue()
    assert "33/64" in text and "64/64" in text and "failed=7" in text
    assert "57/64" not in text and "71/" not in text
