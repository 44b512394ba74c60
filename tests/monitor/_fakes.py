"""Test doubles: a scripted clock, a fake NVML module and a fake psutil process."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NOT_SUPPORTED = 3
GPU_IS_LOST = 15


class ScriptedClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: carries the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error code {self.value}"


@dataclass
class FakeGpu:
    sm: int = 50
    mem: int = 20
    used: int = 2 * 1024**3
    total: int = 80 * 1024**3
    tx: int = 1000
    rx: int = 2000
    name: str | bytes = "NVIDIA Fake H100"
    pcie_supported: bool = True
    util_supported: bool = True  # False: a MIG instance
    lost: bool = False
    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"


@dataclass
class FakeNvml:
    """The subset of pynvml the sampler uses; thread-safe enough for the tests."""

    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    init_error: BaseException | None = None
    inits: int = 0
    shutdowns: int = 0
    reads: int = 0
    read_event: threading.Event = field(default_factory=threading.Event)

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return self.gpus[handle].name

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        return self.gpus[handle].uuid

    def _gpu(self, handle: int) -> FakeGpu:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise FakeNVMLError(GPU_IS_LOST)
        return gpu

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        self.reads += 1
        self.read_event.set()
        if not gpu.util_supported:
            raise FakeNVMLError(NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.sm, memory=gpu.mem)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        return SimpleNamespace(used=gpu.used, total=gpu.total, free=gpu.total - gpu.used)

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        gpu = self._gpu(handle)
        if not gpu.pcie_supported:
            raise FakeNVMLError(NOT_SUPPORTED)
        return gpu.tx if counter == self.NVML_PCIE_UTIL_TX_BYTES else gpu.rx


@dataclass
class FakeProc:
    """The subset of psutil.Process the process sampler uses."""

    user: float = 0.0
    system: float = 0.0
    rss: int = 100 * 1024**2
    pss: int | None = 80 * 1024**2
    threads: int = 7
    fail: bool = False

    def cpu_times(self) -> Any:
        if self.fail:
            raise PermissionError("denied")
        return SimpleNamespace(user=self.user, system=self.system)

    def memory_info(self) -> Any:
        return SimpleNamespace(rss=self.rss)

    def memory_full_info(self) -> Any:
        if self.pss is None:
            return SimpleNamespace(rss=self.rss)  # like psutil on macOS: no pss field
        return SimpleNamespace(rss=self.rss, pss=self.pss)

    def num_threads(self) -> int:
        return self.threads


def wait_until(predicate: Any, timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` until true or timeout (for real sampler threads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return bool(predicate())


def monitor_threads() -> list[threading.Thread]:
    """The monitor's threads still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("gpu_loader-") and t.is_alive()]
