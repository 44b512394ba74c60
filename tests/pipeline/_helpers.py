"""Shared helpers for the pipeline tests."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

PREFIX = "gpu_loader-pipeline-"


def pipeline_threads() -> list[threading.Thread]:
    """Live threads that belong to any pipeline (named by the engine)."""
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX)]


def wait_no_pipeline_threads(timeout: float = 3.0) -> list[threading.Thread]:
    """Wait until no pipeline thread is alive; return the ones left (empty is good)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = pipeline_threads()
        if not left:
            return []
        time.sleep(0.01)
    return pipeline_threads()


class CallCounter:
    """Thread-safe count of calls per item."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[Any] = Counter()

    def add(self, item: Any) -> None:
        with self.lock:
            self.calls[item] += 1


class CountingSource:
    """An iterable that records how many items have been pulled from it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pulled = 0
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            with self.lock:
                self.pulled += 1
            yield i


class Keyed:
    def __init__(self, key: str) -> None:
        self.key = key
