"""Shared benchmark plumbing: machine metadata, process-tree measurement, tables, JSON."""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where results go by default in a checkout: ``benchmarks/results/``, beside the code."""


def default_results_dir() -> Path:
    """`RESULTS_DIR` in a checkout; installed from a wheel (no ``pyproject.toml`` above
    the scripts, which sit in site-packages), ``./benchmark-results`` in the working
    directory rather than inside the environment."""
    if (RESULTS_DIR.parent.parent / "pyproject.toml").is_file():
        return RESULTS_DIR
    return Path.cwd() / "benchmark-results"


def add_out_argument(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    """Each script's ``--out`` (None: `write_results` picks `default_results_dir`)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=default,
        help="JSON path (default benchmarks/results/ in a checkout, ./benchmark-results/ "
        "when installed)",
    )


BENCH_EXTRA_HINT = "pip install '.[bench]' in the checkout"
"""How to get the peers a benchmark compares with (SPDL, DALI): the ``[bench]`` extra."""


_VERSIONED = (
    "gpu-loader",
    "torch",
    "numpy",
    "simplejpeg",
    "opencv-python-headless",
    "pillow",
    "spdl",
    "nvidia-dali-cuda120",
    "cupy-cuda12x",
    "nvidia-nvimgcodec-cu12",
)


def machine_metadata() -> dict[str, Any]:
    """Where and with what a result was measured (stored beside every benchmark row)."""
    versions: dict[str, str] = {}
    for dist in _VERSIONED:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        # Other jobs on a shared machine skew every system; the load says how much.
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "cpu_model": _cpu_model(),
        "versions": versions,
        "gpu": _gpu_name(),
    }
    try:
        import psutil

        meta["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return meta


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User+system CPU seconds of a process and all its live descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class PeakPss:
    """Samples the PSS of a process tree in a thread; `peak_mb` is the highest sum seen."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-pss", daemon=True)

    def __enter__(self) -> PeakPss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                except psutil.Error:
                    continue
                total += getattr(info, "pss", info.rss)
            self.peak_mb = max(self.peak_mb, total / 2**20)
            self._stop.wait(self.interval_s)


def run_worker(argv: Sequence[str], *, timeout_s: float = 900) -> tuple[dict[str, Any], float]:
    """Run one benchmark worker in its own process; return its JSON result and peak PSS (MB).

    The worker prints exactly one JSON object on its last stdout line.
    """
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with PeakPss(proc.pid) as pss:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": f"timed out after {timeout_s:.0f} s"}, pss.peak_mb
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}, pss.peak_mb
    return json.loads(lines[-1]), pss.peak_mb


def format_table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A GitHub-markdown table of `rows` with (key, header) `columns`."""
    rows = list(rows)

    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) < 10 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(h for _, h in columns) + " |"]
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines += ["| " + " | ".join(cell(r, k) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_results(name: str, payload: dict[str, Any], out: Path | None = None) -> Path:
    """Write `payload` plus machine metadata as JSON; returns the path."""
    path = out or default_results_dir() / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"benchmark": name, "machine": machine_metadata(), **payload}
    path.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
    return path


def reaped_children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Timer:
    """Wall and process-tree CPU time between `start()` and `stop()`.

    Worker processes (a DataLoader's) may exit before `stop()`: their CPU time then
    moves from the live tree to the reaped children's usage, so both are summed.
    """

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = tree_cpu_seconds() + reaped_children_cpu_seconds()

    def stop(self) -> tuple[float, float]:
        wall = time.perf_counter() - self.t0
        return wall, tree_cpu_seconds() + reaped_children_cpu_seconds() - self.c0
