"""Pure functions: NVML return values into numbers, readings into a snapshot.

Kept free of NVML itself so they are tested on literal inputs. A value outside its
range raises ``ValueError``; the sampler counts that as a failed read instead of
reporting nonsense.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._gpu_types import DeviceStats, GpuReading, GpuSnapshot


def _number(raw: Any, field: str, what: str) -> float:
    value = getattr(raw, field, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"NVML {what} has no numeric `{field}`: got {raw!r}")
    return float(value)


def parse_utilization(raw: Any) -> tuple[float, float]:
    """``nvmlDeviceGetUtilizationRates`` (fields ``gpu``, ``memory``) -> (SM %, memory %)."""
    sm = _number(raw, "gpu", "utilization")
    mem = _number(raw, "memory", "utilization")
    for name, value in (("gpu", sm), ("memory", mem)):
        if not 0.0 <= value <= 100.0:
            raise ValueError(f"NVML utilization `{name}` must be in [0, 100], got {value!r}")
    return sm, mem


def parse_memory(raw: Any) -> tuple[int, int]:
    """``nvmlDeviceGetMemoryInfo`` (fields ``used``, ``total`` in bytes) -> (used, total)."""
    used = _number(raw, "used", "memory info")
    total = _number(raw, "total", "memory info")
    if total <= 0 or not 0 <= used <= total:
        raise ValueError(f"NVML memory info must have 0 <= used <= total, total > 0: got {raw!r}")
    return int(used), int(total)


def parse_pcie(raw: Any) -> float:
    """``nvmlDeviceGetPcieThroughput`` (an int, KB/s over NVML's 20 ms window) -> KB/s."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
        raise ValueError(f"NVML PCIe throughput must be a number of KB/s >= 0, got {raw!r}")
    return float(raw)


def parse_name(raw: Any, index: int) -> str:
    """``nvmlDeviceGetName`` (str, or bytes in old bindings) -> str; "GPU <i>" if empty."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    text = str(raw).strip() if raw is not None else ""
    return text or f"GPU {index}"


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _device(index: int, name: str, window: list[GpuReading], latest: GpuReading) -> DeviceStats:
    return DeviceStats(
        index=index,
        name=name,
        samples=len(window),
        sm_util_percent=_mean(r.sm_util_percent for r in window),
        mem_util_percent=_mean(r.mem_util_percent for r in window),
        memory_used_bytes=latest.memory_used_bytes,
        memory_total_bytes=latest.memory_total_bytes,
        pcie_tx_kbps=_mean(r.pcie_tx_kbps for r in window),
        pcie_rx_kbps=_mean(r.pcie_rx_kbps for r in window),
        latest=latest,
    )


def aggregate(
    samples: Iterable[GpuReading],
    window_s: float,
    now: float,
    names: Mapping[int, str] | None = None,
) -> GpuSnapshot:
    """Per-device means over readings with ``now - window_s < time_s <= now``.

    ``latest`` is the newest reading at or before ``now`` whatever its age, so a
    device read once long ago still shows its memory figures (with ``samples=0``).
    Readings after ``now`` are ignored. Devices are listed by index.
    """
    if window_s <= 0:
        raise ValueError(f"`window_s` must be > 0, got {window_s!r}")
    names = names or {}
    latest: dict[int, GpuReading] = {}
    window: dict[int, list[GpuReading]] = {}
    for reading in samples:
        if reading.time_s > now:
            continue
        previous = latest.get(reading.index)
        if previous is None or reading.time_s >= previous.time_s:
            latest[reading.index] = reading
        if reading.time_s > now - window_s:
            window.setdefault(reading.index, []).append(reading)
    devices = tuple(
        _device(i, names.get(i, f"GPU {i}"), window.get(i, []), latest[i]) for i in sorted(latest)
    )
    return GpuSnapshot(available=True, reason=None, devices=devices, window_s=window_s)
