"""Typed records of the GPU view: one reading, per-device aggregates, the snapshot."""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_percent(name: str, value: float | None) -> None:
    if value is not None and not (0.0 <= value <= 100.0):
        raise ValueError(f"`{name}` must be a percentage in [0, 100], got {value!r}")


def _check_non_negative(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class GpuReading:
    """One NVML reading of one device."""

    time_s: float
    """When it was taken, on the sampler's clock (seconds)."""
    index: int
    """NVML device index."""
    sm_util_percent: float | None
    """Percent of the last sample period in which a kernel ran on the device (NVML "gpu");
    None where NVML does not support it (MIG instances, some vGPUs)."""
    mem_util_percent: float | None
    """Percent of the last sample period in which device memory was read or written; None
    where NVML does not support it."""
    memory_used_bytes: int
    """Device memory in use by all processes."""
    memory_total_bytes: int
    """Device memory installed."""
    pcie_tx_kbps: float | None
    """PCIe traffic out of the device in KB/s; None where NVML does not support it."""
    pcie_rx_kbps: float | None
    """PCIe traffic into the device in KB/s; None where NVML does not support it."""

    def __post_init__(self) -> None:
        _check_percent("sm_util_percent", self.sm_util_percent)
        _check_percent("mem_util_percent", self.mem_util_percent)
        _check_non_negative("memory_used_bytes", self.memory_used_bytes)
        _check_non_negative("memory_total_bytes", self.memory_total_bytes)
        _check_non_negative("pcie_tx_kbps", self.pcie_tx_kbps)
        _check_non_negative("pcie_rx_kbps", self.pcie_rx_kbps)


@dataclass(frozen=True)
class DeviceStats:
    """One device over the recent window: means of the readings in it, and the latest one."""

    index: int
    """NVML device index."""
    name: str
    """Device name as NVML reports it (e.g. "NVIDIA H100 80GB HBM3"), or "GPU <index>"."""
    samples: int
    """Readings inside the window (0: the device has not been read recently)."""
    sm_util_percent: float | None
    """Mean SM utilisation over the window; None without readings."""
    mem_util_percent: float | None
    """Mean memory-bandwidth utilisation over the window; None without readings."""
    memory_used_bytes: int | None
    """Memory in use at the latest reading."""
    memory_total_bytes: int | None
    """Memory installed (from the latest reading)."""
    pcie_tx_kbps: float | None
    """Mean PCIe transmit rate (KB/s) over the window; None without support or readings."""
    pcie_rx_kbps: float | None
    """Mean PCIe receive rate (KB/s) over the window; None without support or readings."""
    latest: GpuReading | None
    """The most recent reading, inside the window or not."""


NOT_STARTED = "not started"
"""`GpuSnapshot.reason` of a sampler that has not started (a loader not iterated yet)."""


@dataclass(frozen=True)
class GpuSnapshot:
    """What the NVML sampler knows now."""

    available: bool
    """False when NVML is missing, failed to start, sees no device, or stopped on errors."""
    reason: str | None
    """Why it is not available (or why it stopped); None while it works."""
    devices: tuple[DeviceStats, ...]
    """One entry per sampled device, by index."""
    window_s: float
    """Length of the window the means cover (seconds)."""
    errors: int = 0
    """NVML read failures so far (each failed device read counts once)."""
    last_error: str | None = None
    """The most recent read failure, "GPU <i>: <ExcType>: <message>"."""

    @property
    def util_percent(self) -> float | None:
        """Mean SM utilisation over the devices with readings; None without any."""
        values = [d.sm_util_percent for d in self.devices if d.sm_util_percent is not None]
        return sum(values) / len(values) if values else None

    @property
    def idle_percent(self) -> float | None:
        """``100 - util_percent``: how much of the time the GPUs ran no kernel."""
        util = self.util_percent
        return None if util is None else 100.0 - util

    @staticmethod
    def unavailable(reason: str, window_s: float = 0.0) -> GpuSnapshot:
        """The snapshot of a sampler that cannot read any GPU."""
        return GpuSnapshot(available=False, reason=reason, devices=(), window_s=window_s)
