"""ProgressReporter: a tqdm bar with img/s, stall %, GPU util % and the bottleneck.

Libraries create none by default (``LoaderOptions(progress=False)``); the CLI turns it on.
The bar is created on the first refresh, so constructing a reporter prints nothing,
and ``step()`` builds stats only when a refresh is due (at most every
``min_interval_s``), so calling it on every batch costs one clock read. Where the output
is not a terminal (a log file, a batch job), a bar's carriage-return redraws would pile
up on one line: the reporter writes a plain line per refresh instead, every 10 s by
default, and a last one when it closes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from ._gpu_types import NOT_STARTED
from ._periodic import check_interval
from ._stats import LoaderStats


def progress_postfix(stats: LoaderStats, unit: str = "img", failures: int | None = None) -> str:
    """``"img/s=1234 stall=3.2% gpu=87% bottleneck=decode"`` (``gpu=no GPU`` without NVML).

    Before the meters have a rate (the first batch), ``img/s=- stall=-`` and no bottleneck:
    zeros and a verdict from one batch would read as measurements. ``failures``: the count
    to show as ``failed=`` (default ``stats.failures``, which spans every epoch).
    """
    if failures is None:
        failures = stats.failures
    gpu = gpu_text(stats)
    measured = stats.batches > 1  # a rate needs two; later, zero is a measured stall
    parts = [
        f"{unit}/s={stats.samples_per_s_recent:.0f}" if measured else f"{unit}/s=-",
        f"stall={stats.stall_fraction_recent:.1%}" if measured else "stall=-",
        f"gpu={gpu}",
    ]
    if stats.bottleneck and measured:
        parts.append(f"bottleneck={stats.bottleneck}")
    if failures:
        parts.append(f"failed={failures}")
    return " ".join(parts)


def gpu_text(stats: LoaderStats) -> str:
    """``87%``; ``n/a`` for GPUs whose utilisation NVML does not report (MIG, vGPU), ``-``
    before the sampler has started, ``no GPU`` where NVML found none (QA55: the last two
    read "no GPU" on a machine with one)."""
    if stats.gpu_util_percent is not None:
        return f"{stats.gpu_util_percent:.0f}%"
    gpu = stats.gpu
    if gpu is not None and gpu.devices:
        return "n/a"
    if gpu is not None and gpu.reason == NOT_STARTED:
        return "-"
    return "no GPU"


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar redraws there; elsewhere, plain lines)."""
    isatty = getattr(stream, "isatty", None)
    return callable(isatty) and bool(isatty())


LINE_INTERVAL_S = 10.0
"""Default seconds between progress lines when the output is not a terminal."""


class ProgressReporter:
    """A throttled tqdm bar over samples delivered or failed, or plain lines off a terminal.

    ``lines``: None picks lines when ``file`` (default stderr) is not a terminal.
    ``min_interval_s``: None means 0.5 s for a bar and `LINE_INTERVAL_S` for lines.
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        desc: str = "loading",
        unit: str = "img",
        min_interval_s: float | None = None,
        file: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: int = 0,
        lines: bool | None = None,
        start_failures: int = 0,
    ) -> None:
        if total is not None and (isinstance(total, bool) or total < 0):
            raise ValueError(f"`total` must be None or an int >= 0, got {total!r}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"`start` must be an int >= 0, got {start!r}")
        self.total = total
        self.start = start
        """``stats.samples`` when this bar began: a loader's stats count every epoch."""
        self.start_failures = start_failures
        """``stats.failures`` not this bar's (a loader's other epochs): not shown."""
        self.desc = desc
        self.unit = unit
        if lines is None:
            lines = not is_terminal(file if file is not None else sys.stderr)
        self.lines = lines
        if min_interval_s is None:
            min_interval_s = LINE_INTERVAL_S if lines else 0.5
        self.min_interval_s = check_interval("min_interval_s", min_interval_s)
        self._file = file
        self._clock = clock
        self._bar: Any = None
        self._last: float | None = None
        self._closed = False

    def _make_bar(self) -> Any:
        from tqdm import tqdm

        if self.total is None:
            fmt = "{desc}: {n_fmt} " + self.unit + " [{elapsed}{postfix}]"
        else:
            fmt = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
        return tqdm(
            total=self.total,
            desc=self.desc,
            unit=self.unit,
            file=self._file,
            bar_format=fmt,
            mininterval=0.0,  # throttled here, where skipped refreshes also skip stats()
            dynamic_ncols=self._file is None,
        )

    def due(self) -> bool:
        """True when the last refresh is at least ``min_interval_s`` old."""
        return self._last is None or self._clock() - self._last >= self.min_interval_s

    def step(self, get_stats: Callable[[], LoaderStats]) -> bool:
        """Refresh from ``get_stats()`` if due; returns whether it refreshed."""
        if self._closed or not self.due():
            return False
        self.update(get_stats())
        return True

    def update(self, stats: LoaderStats) -> None:
        """Refresh the bar now from ``stats``."""
        if self._closed:
            return
        self._last = self._clock()
        if self.lines:
            self._write_line(stats)
            return
        if self._bar is None:
            self._bar = self._make_bar()
        delta = self._done(stats) - int(self._bar.n)
        self._bar.set_postfix_str(self._postfix(stats), refresh=False)
        if delta > 0:
            self._bar.update(delta)
        else:
            self._bar.refresh()

    def _done(self, stats: LoaderStats) -> int:
        """Samples this bar has seen through: delivered or failed (a failed sample is done
        with too, or an epoch with failures would end short of its total). At most the
        total: repeats that pad a rank's last batches are delivered samples too."""
        done = stats.samples - self.start + self._failures(stats)
        return done if self.total is None else min(done, self.total)

    def _failures(self, stats: LoaderStats) -> int:
        return max(0, stats.failures - self.start_failures)

    def _write_line(self, stats: LoaderStats) -> None:
        done = self._done(stats)
        count = f"{done} {self.unit}" if self.total is None else f"{done}/{self.total} {self.unit}"
        if self.total:
            count += f" ({done / self.total:.0%})"
        out = self._file if self._file is not None else sys.stderr
        out.write(f"{self.desc}: {count} {self._postfix(stats)}\n")
        out.flush()

    def _postfix(self, stats: LoaderStats) -> str:
        return progress_postfix(stats, self.unit, self._failures(stats))

    def close(self, stats: LoaderStats | None = None) -> None:
        """A last refresh from ``stats`` (if given), then close the bar (idempotent)."""
        if self._closed:
            return
        if stats is not None:
            self.update(stats)
        self._closed = True
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
