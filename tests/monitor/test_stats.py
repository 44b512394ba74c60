"""LoaderStats: the bottleneck call, the flat dict, the summary and the progress postfix."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from gpu_loader.monitor import (
    GpuSnapshot,
    LoaderStats,
    aggregate,
    diagnose,
    flatten_stage,
    format_summary,
    progress_postfix,
)
from gpu_loader.pipeline import StageStats

from .test_nvml_parse import reading


def stage(name: str, busy: float, **kw: Any) -> StageStats:
    values: dict[str, Any] = {
        "kind": "pipe",
        "concurrency": 4,
        "tasks_done": 1000,
        "failures": 2,
        "skipped": 0,
        "task_time_mean_s": 0.004,
        "task_time_p50_s": 0.003,
        "task_time_p90_s": 0.0125,
        "task_time_p99_s": 0.020,
        "busy_fraction": busy,
        "input_queue_mean": 3.5,
        "input_queue_capacity": 8,
        "blocked_input_s": 0.25,
        "blocked_output_s": 1.5,
        "slow_lane_limit_s": None,
        "slow_lane_moves": 0,
        "slow_lane_size": 0,
    }
    values.update(kw)
    return StageStats(name=name, **values)


STAGES = (stage("read", 0.30), stage("decode", 0.97, concurrency=2))


def gpu_snapshot() -> GpuSnapshot:
    snap = aggregate([reading(9.0, sm=70.0), reading(9.5, index=1, sm=90.0)], 5.0, 10.0)
    return replace(snap, errors=1, last_error="GPU 1: NVMLError: busy")


def make_stats(**kw: Any) -> LoaderStats:
    gpu = gpu_snapshot()
    values: dict[str, Any] = {
        "elapsed_s": 12.5,
        "samples": 6400,
        "batches": 200,
        "samples_per_s": 555.5,
        "samples_per_s_recent": 601.0,
        "batches_per_s": 17.4,
        "batches_per_s_recent": 18.8,
        "stall_fraction": 0.234,
        "stall_fraction_recent": 0.125,
        "stall_s": 2.5,
        "startup_s": 1.75,
        "gpu": gpu,
        "gpu_util_percent": gpu.util_percent,
        "gpu_idle_percent": gpu.idle_percent,
        "cpu_percent": 187.0,
        "cpu_percent_normalised": 93.5,
        "rss_bytes": 512 * 1024**2,
        "pss_bytes": 300 * 1024**2,
        "stages": STAGES,
        "bottleneck": "decode",
        "bottleneck_reason": "its workers are busy 97%",
        "failures": 4,
    }
    values.update(kw)
    return LoaderStats(**values)


def test_diagnose_no_batch_training_step_engine_and_busiest() -> None:
    assert diagnose(0.9, 0, STAGES) == (None, "no batch delivered yet")
    # One batch: its wait was start-up, so the stall reads 0 whatever the loader's speed.
    assert diagnose(0.0, 1, STAGES, "read", "busy")[0] is None
    name, reason = diagnose(0.01, 10, STAGES, "decode", "busy")
    assert name == "training step" and "1.0%" in (reason or "")
    name, reason = diagnose(0.5, 10, STAGES, "read", "its input queue is full")
    assert name == "read" and reason == (
        "the training loop waits for data 50.0% of the time lately; its input queue is full"
    )
    # No engine verdict, or the engine's "consumer" contradicted by a measured stall:
    for engine in (None, "consumer"):
        name, reason = diagnose(0.5, 10, STAGES, engine, "sink full")
        assert name == "decode" and "busy 97% with 2 thread(s)" in (reason or "")
    assert diagnose(0.5, 10, ())[0] == "loader"


def test_as_dict_is_flat_and_json_serialisable() -> None:
    flat = make_stats().as_dict()
    assert all(isinstance(k, str) for k in flat)
    assert all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in flat.values())
    assert json.loads(json.dumps(flat, allow_nan=False)) == flat
    assert flat["samples_per_s"] == 555.5 and flat["stall_fraction"] == 0.234
    assert flat["gpu_util_percent"] == pytest.approx(80.0)
    assert flat["gpu_idle_percent"] == pytest.approx(20.0)
    assert flat["gpu.0.sm_util_percent"] == 70.0 and flat["gpu.1.sm_util_percent"] == 90.0
    assert flat["gpu.available"] == 1 and flat["gpu.errors"] == 1
    assert flat["stage.decode.p90_ms"] == pytest.approx(12.5)
    assert flat["stage.decode.concurrency"] == 2 and flat["stage.read.tasks_done"] == 1000
    assert flat["stage.decode.blocked_out_s"] == 1.5
    assert flat["stage.decode.input_queue_capacity"] == 8  # engine extras come along
    assert "stage.decode.slow_lane_limit_s" not in flat  # None is left out
    assert flat["bottleneck"] == "decode" and flat["failures"] == 4


def test_as_dict_without_gpu_leaves_gpu_out() -> None:
    flat = make_stats(
        gpu=GpuSnapshot.unavailable("NVML sees no NVIDIA device"),
        gpu_util_percent=None,
        gpu_idle_percent=None,
        pss_bytes=None,
        startup_s=None,
        stages=(),
    ).as_dict()
    assert "gpu_util_percent" not in flat and "pss_bytes" not in flat and "startup_s" not in flat
    assert flat["gpu.available"] == 0 and flat["gpu.reason"] == "NVML sees no NVIDIA device"
    assert not any(k.startswith("stage.") for k in flat)


def test_stage_names_become_one_key_level() -> None:
    flat = flatten_stage(stage("aggregate(32)", 0.0))
    assert "stage.aggregate_32_.p99_ms" in flat


def test_stats_validate() -> None:
    with pytest.raises(ValueError, match="stall_fraction"):
        make_stats(stall_fraction=math.nan)
    with pytest.raises(ValueError, match="samples"):
        make_stats(samples=-1)


def test_summary_contains_the_numbers() -> None:
    text = format_summary(make_stats())
    for expected in (
        "555.5 samples/s",
        "23.4%",  # stall
        "start-up 1.75 s",
        "util 80.0%, idle 20.0%",
        "GPU 1",
        "NVML read errors: 1",
        "187%",  # CPU
        "RSS 512 MiB, PSS 300 MiB",
        "failures     : 4",
        "bottleneck   : decode (its workers are busy 97%)",
    ):
        assert expected in text, expected
    lines = text.splitlines()
    at = lines.index("stages (the last epoch):")
    table = lines[at + 1 : at + 4]
    assert table[0].split()[:3] == ["stage", "threads", "tasks"]
    decode = table[2].split()
    assert decode[0] == "decode" and decode[1] == "2" and "12.50" in decode and "97%" in decode
    # QA65: the columns were nowhere explained, and "tasks 25, 11 ms" for 200 images
    # read as 11 ms an image; the rate read as samples / elapsed, start-up and all.
    assert "times\n  are per call; fail counts samples" in text
    assert "samples/s after the first batch" in text
    # print(loader.stats()) prints this report, not the dataclass on one line.
    assert str(make_stats()) == text and repr(make_stats()).startswith("LoaderStats(")


def test_summary_says_no_gpu() -> None:
    stats = make_stats(
        gpu=GpuSnapshot.unavailable("NVML did not initialise (NVMLError: Driver Not Loaded)"),
        gpu_util_percent=None,
        gpu_idle_percent=None,
    )
    assert "no GPU (NVML did not initialise" in format_summary(stats)
    assert "gpu=no GPU" in progress_postfix(stats)
    assert "not monitored" in format_summary(replace(stats, gpu=None))


def test_summary_and_postfix_tell_a_gpu_without_utilisation_from_none() -> None:
    # QA55: a MIG instance (memory read, no utilisation) was "no readings yet" and
    # gpu=no GPU; a loader not iterated yet was "no GPU (not started)" on a GPU machine;
    # a sampler that gave up on errors showed its last figures as current.
    mig = aggregate([reading(9.0, sm=None, memory_used_bytes=2**30)], 5.0, 10.0)
    stats = make_stats(gpu=mig, gpu_util_percent=None, gpu_idle_percent=None)
    text = format_summary(stats)
    assert "util n/a" in text and "GPU 0: SM n/a, memory 1024 MiB" in text
    assert "no readings yet" not in text and "gpu=n/a" in progress_postfix(stats)
    never = replace(stats, gpu=GpuSnapshot.unavailable("not started"))
    assert "GPU          : no readings yet (not started)" in format_summary(never)
    assert "gpu=-" in progress_postfix(never)
    gave_up = replace(gpu_snapshot(), available=False, reason="every NVML read failed")
    text = format_summary(make_stats(gpu=gave_up))
    assert "util 80.0%" in text and "sampling stopped (every NVML read failed)" in text
    # Gave up, its readings older than the window: not the MIG explanation (QA56).
    lost = replace(mig, available=False, reason="GPU lost")
    text = format_summary(make_stats(gpu=lost, gpu_util_percent=None, gpu_idle_percent=None))
    assert "util n/a (sampling stopped (GPU lost))" in text and "no SM activity" not in text


def test_progress_postfix() -> None:
    text = progress_postfix(make_stats())
    assert text == "img/s=601 stall=12.5% gpu=80% bottleneck=decode failed=4"
    # The first batch: no rate yet, so no figures that look measured and no verdict.
    first = progress_postfix(make_stats(batches=1, samples_per_s_recent=0.0, failures=0))
    assert first == "img/s=- stall=- gpu=80%"
    # Later, a loop that got nothing lately is a measurement: zero, and a verdict.
    stalled = progress_postfix(make_stats(samples_per_s_recent=0.0, stall_fraction_recent=1.0))
    assert stalled.startswith("img/s=0 stall=100.0%") and "bottleneck=decode" in stalled


def test_stage_task_times_are_flattened_in_milliseconds() -> None:
    flat = flatten_stage(stage("decode", 0.5))
    assert flat["stage.decode.mean_ms"] == pytest.approx(4.0)  # task_time_mean_s 0.004
    assert flat["stage.decode.p90_ms"] == pytest.approx(12.5)
