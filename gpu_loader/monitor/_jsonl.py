"""JsonlLogger: periodic ``LoaderStats.as_dict()`` snapshots, one JSON object per line.

Each line is the flat dict plus ``"time_unix"`` (seconds since the epoch) and the
``fields`` given: an ImageLoader adds ``"epoch"``, ``"rank"``, ``"world_size"``,
``"host"`` and ``"pid"``, so that lines from several runs or ranks can be merged and
told apart. The file is
appended to and flushed per line, so a crash loses at most the line being written. A
final line is written at ``close()``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ._periodic import PeriodicThread
from ._stats import LoaderStats

_log = logging.getLogger("gpu_loader.monitor")

# (path, error type, errno) already warned about: `JsonlLogger._failed`.
_warned: set[tuple[str, str, int | None]] = set()
_warned_lock = threading.Lock()


class JsonlLogger(PeriodicThread):
    """Writes ``source().as_dict()`` to ``path`` every ``interval_s`` on a daemon thread.

    ``source`` is usually ``loader.stats``; without one, call :meth:`write` yourself.
    ``fields`` adds keys to each line (the loader adds its epoch, rank, world size, host
    and pid).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        interval_s: float = 10.0,
        *,
        source: Callable[[], LoaderStats] | None = None,
        fields: Callable[[], dict[str, int | float | str]] | None = None,
    ) -> None:
        super().__init__("gpu_loader-jsonl-logger", interval_s)
        self.path = Path(path)
        parent = self.path.parent
        if not parent.is_dir():
            raise FileNotFoundError(
                f"cannot log stats to {str(self.path)!r}: folder {str(parent)!r} does not exist; "
                "create it first"
            )
        self._source = source
        self._fields = fields  # more keys for each line (the loader's epoch, rank, ...)
        self._write_lock = threading.Lock()
        # Opened on the first line, so a logger that never writes leaves no open file.
        self._file: TextIO | None = None
        self._file_closed = False
        self.lines = 0
        self.failure: str | None = None
        """Why writing failed (``Type: message``), None while it works."""

    def _setup(self) -> bool:
        return self._source is not None

    def _tick(self) -> bool:
        if self._source is None:
            return False
        try:
            self.write(self._source())
        except Exception as exc:  # a failing stats() must not kill training; stop logging
            self._failed(exc, "stats logging stopped")
            return False
        return True

    def _failed(self, exc: Exception, what: str) -> None:
        """Say why the log failed: a warning the first time for this path and error kind,
        then at DEBUG (a loader makes a logger per epoch, and an unwritable path would
        otherwise warn twice an epoch); each epoch still tries again."""
        self.failure = f"{type(exc).__name__}: {exc}"
        key = (str(self.path), type(exc).__name__, getattr(exc, "errno", None))
        with _warned_lock:
            first = key not in _warned
            _warned.add(key)
        level = logging.WARNING if first else logging.DEBUG
        _log.log(level, "%s (%s): %s", what, self.path, self.failure)

    def write(self, stats: LoaderStats) -> None:
        """Append one line now."""
        record: dict[str, float | int | str] = {"time_unix": time.time()}
        if self._fields is not None:
            record.update(self._fields())
        record.update(stats.as_dict())
        line = json.dumps(record, allow_nan=False, separators=(",", ":"))
        with self._write_lock:
            if self._file_closed:
                raise RuntimeError(f"JsonlLogger for {str(self.path)!r} is closed")
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(line + "\n")
            self._file.flush()
            self.lines += 1

    def _teardown(self) -> None:
        if self._source is not None and self.failure is None:
            try:
                self.write(self._source())
            except Exception as exc:  # the final line is best effort, the file must close
                self._failed(exc, "final stats line not written")
        with self._write_lock:
            self._file_closed = True
            file, self._file = self._file, None
            if file is not None:
                try:
                    file.close()  # flushes what a failed write left in its buffer
                except OSError as exc:  # a full disk: training goes on without the lines
                    self._failed(exc, "stats log not closed cleanly")
