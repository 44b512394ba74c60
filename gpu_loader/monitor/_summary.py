"""format_summary: the plain-text report printed at the end of a run."""

from __future__ import annotations

from typing import Any

from ._gpu_types import NOT_STARTED
from ._stages import stage_name, stage_value
from ._stats import LoaderStats

_MIB = 1024 * 1024

# (header, canonical field, scale, format)
_STAGE_COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("threads", "concurrency", 1.0, "{:.0f}"),
    ("tasks", "tasks_done", 1.0, "{:.0f}"),
    ("fail", "failures", 1.0, "{:.0f}"),
    ("mean ms", "mean_s", 1000.0, "{:.2f}"),
    ("p50 ms", "p50_s", 1000.0, "{:.2f}"),
    ("p90 ms", "p90_s", 1000.0, "{:.2f}"),
    ("p99 ms", "p99_s", 1000.0, "{:.2f}"),
    ("busy", "busy_fraction", 100.0, "{:.0f}%"),
    ("in-queue", "queue_mean", 1.0, "{:.1f}"),
    ("wait-in s", "blocked_in_s", 1.0, "{:.2f}"),
    ("wait-out s", "blocked_out_s", 1.0, "{:.2f}"),
)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / _MIB:.0f} MiB"


def _gpu_line(stats: LoaderStats) -> str:
    gpu = stats.gpu
    if gpu is None:
        return "GPU          : not monitored"
    if not gpu.devices:
        if gpu.reason == NOT_STARTED:  # a loader not iterated yet: no claim about GPUs
            return "GPU          : no readings yet (not started)"
        if not gpu.available:
            return f"GPU          : no GPU ({gpu.reason or 'NVML unavailable'})"
        return "GPU          : no readings yet"
    stopped = f"sampling stopped ({gpu.reason or 'NVML errors'})"
    if stats.gpu_util_percent is None or stats.gpu_idle_percent is None:
        if gpu.available:
            # A GPU whose utilisation NVML does not report (MIG, vGPU): its memory still is.
            head = "GPU          : util n/a (NVML reports no SM activity for these devices)"
        else:  # gave up after read errors, and its readings are older than the window
            head = f"GPU          : util n/a ({stopped})"
    else:
        head = (
            f"GPU          : util {stats.gpu_util_percent:.1f}%, idle "
            f"{stats.gpu_idle_percent:.1f}% (SM activity, mean over the last {gpu.window_s:g} s)"
        )
        if not gpu.available:  # gave up after read errors: what it shows is from before
            head += f"; {stopped}, figures from before"
    parts = [head]
    for d in gpu.devices:
        memory = ""
        if d.memory_used_bytes is not None and d.memory_total_bytes is not None:
            memory = f", memory {_mib(d.memory_used_bytes)} / {_mib(d.memory_total_bytes)}"
        util = "n/a" if d.sm_util_percent is None else f"{d.sm_util_percent:.1f}%"
        label = d.name if d.name == f"GPU {d.index}" else f"GPU {d.index} {d.name}"
        parts.append(f"  {label}: SM {util}{memory}")
    if gpu.errors:
        parts.append(f"  NVML read errors: {gpu.errors} (last: {gpu.last_error})")
    return "\n".join(parts)


def format_stage_table(stages: tuple[Any, ...]) -> str:
    """A fixed-width table, one row per stage, "-" where a record lacks a field."""
    header = ["stage", *(h for h, _, _, _ in _STAGE_COLUMNS)]
    rows = [header]
    for stage in stages:
        row = [stage_name(stage)]
        for _, field, scale, fmt in _STAGE_COLUMNS:
            value = stage_value(stage, field)
            row.append("-" if value is None else fmt.format(value * scale))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_summary(stats: LoaderStats) -> str:
    """The end-of-run report: throughput, stall, GPU, CPU, memory, stages, bottleneck."""
    startup = "n/a" if stats.startup_s is None else f"{stats.startup_s:.2f} s"
    cpu = "n/a" if stats.cpu_percent is None else f"{stats.cpu_percent:.0f}% (100% = one core)"
    lines = [
        f"elapsed      : {stats.elapsed_s:.2f} s (start-up {startup})",
        f"delivered    : {stats.samples} samples in {stats.batches} batches",
        f"throughput   : {stats.samples_per_s:.1f} samples/s after the first batch "
        f"({stats.batches_per_s:.2f} batches/s; recent {stats.samples_per_s_recent:.1f} samples/s)",
        f"data stall   : {stats.stall_fraction:.1%} of the time waiting in next() "
        f"(recent {stats.stall_fraction_recent:.1%})",
        _gpu_line(stats),
        f"CPU          : {cpu}",
        f"memory       : RSS {_mib(stats.rss_bytes)}, PSS {_mib(stats.pss_bytes)}",
        f"failures     : {stats.failures}",
        f"bottleneck   : {stats.bottleneck or 'n/a'}"
        + (f" ({stats.bottleneck_reason})" if stats.bottleneck_reason else ""),
    ]
    if stats.stages:
        lines += ["", "stages (the last epoch):", format_stage_table(stats.stages), *_LEGEND]
    return "\n".join(lines)


# QA65: "tasks 25" for 200 images, at 11 ms each, read as 11 ms an image.
_LEGEND = (
    "  tasks: the stage's calls, each of one sample or (CPU path) a run of several; times",
    "  are per call; fail counts samples; busy: share of the threads' time in calls;",
    "  in-queue: items waiting on average; wait-in/out: thread-seconds blocked on input/output",
)
