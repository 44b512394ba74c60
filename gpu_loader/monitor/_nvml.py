"""NvmlSampler: a daemon thread reading SM/memory utilisation, memory and PCIe per device.

Decisions (tested in tests/monitor/test_nvml_sampler.py):

- Without NVML (module missing, ``nvmlInit`` fails, zero devices, a bad index) the
  sampler logs ONE warning, starts no thread, and its snapshot says
  ``available=False`` with the reason. Monitoring never breaks training.
- A read that fails mid-run (``NVMLError`` or an out-of-range value) drops that
  device's reading for that tick, counts it in ``errors`` and keeps ``last_error``;
  the first failure is logged once. The thread keeps going: a transient error (a
  busy driver) costs one reading. After ``max_consecutive_failures`` ticks in which
  every device failed (e.g. "GPU is lost") it stops cleanly; the snapshot then says
  ``available=False`` and why. ``close()`` joins either way.
- PCIe counters that NVML reports as NOT_SUPPORTED (some VMs, MIG) are read as None
  from then on, not counted as failures. So is utilisation (MIG instances and some vGPUs
  have none in NVML): idle % is then not reported (None, "n/a"), memory still is, and
  one warning per process says why.

Overhead: one tick is ~5 ctypes calls per device. ``nvmlDeviceGetPcieThroughput``
blocks ~20 ms inside the driver (it measures a 20 ms window) but ctypes releases the
GIL, so the training loop does not pay for it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._gpu_types import NOT_STARTED, GpuReading, GpuSnapshot
from ._nvml_parse import aggregate, parse_memory, parse_name, parse_pcie, parse_utilization
from ._periodic import PeriodicThread, check_interval

_log = logging.getLogger("gpu_loader.monitor")
_warned: set[str] = set()  # reasons already logged as warnings in this process
_warned_lock = threading.Lock()

_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED, used when the module lacks the constant


def nvml_indices_for_cuda(
    cuda_indices: Sequence[int], visible: str | None = None
) -> tuple[int, ...] | None:
    """Map CUDA device ordinals to NVML indices through ``CUDA_VISIBLE_DEVICES``.

    ``visible`` defaults to the environment variable. Returns None when the mapping
    is unknown (UUIDs or MIG names in the variable, or an ordinal it does not list);
    callers then sample every device. Assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or
    identical GPUs, since NVML numbers devices in PCI bus order.
    """
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(cuda_indices)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        return None
    listed = [int(e) for e in entries]
    if any(not 0 <= i < len(listed) for i in cuda_indices):
        return None
    return tuple(listed[i] for i in cuda_indices)


def _plain_uuid(uuid: object) -> str:
    """A device UUID as torch and NVML both give it, without NVML's "GPU-"/"MIG-" prefix
    (torch writes none), lower case: ``str(torch.cuda.get_device_properties(i).uuid)``
    against ``nvmlDeviceGetUUID``."""
    text = (uuid.decode("ascii", "replace") if isinstance(uuid, bytes) else str(uuid)).strip()
    text = text.lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


NVML_ERROR_LIBRARY_NOT_FOUND = 12
"""NVML's return code when libnvidia-ml is not installed: no NVIDIA driver here."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (its kernel module, or NVML's library)."""
    import ctypes.util

    return (
        os.path.exists("/proc/driver/nvidia") or ctypes.util.find_library("nvidia-ml") is not None
    )


class NvmlSampler(PeriodicThread):
    """Samples NVML every ``interval_s`` on a daemon thread.

    ``device_indices`` are NVML indices (None: every device; see
    :func:`nvml_indices_for_cuda`). ``device_uuids``, when given, name the devices
    exactly (torch's ``get_device_properties(i).uuid``, or NVML's form): they are matched
    against NVML's devices at start and win over ``device_indices``, which stay the
    fallback when one does not match (a MIG instance is not among NVML's top-level
    devices). ``nvml`` is a module-like object with pynvml's
    names (the real ``pynvml`` by default); tests pass a fake. ``snapshot()`` gives
    means over the last ``window_s`` seconds and the latest reading per device.
    """

    def __init__(
        self,
        device_indices: Sequence[int] | None = None,
        *,
        device_uuids: Sequence[str] | None = None,
        interval_s: float = 0.5,
        window_s: float = 5.0,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        max_consecutive_failures: int = 5,
    ) -> None:
        super().__init__("gpu_loader-nvml-sampler", interval_s)
        if device_indices is not None:
            device_indices = tuple(device_indices)
            bad = [i for i in device_indices if isinstance(i, bool) or not isinstance(i, int)]
            if bad or any(i < 0 for i in device_indices):
                raise ValueError(
                    f"`device_indices` must be NVML indices (ints >= 0), got {device_indices!r}"
                )
        if max_consecutive_failures < 1:
            raise ValueError(
                f"`max_consecutive_failures` must be >= 1, got {max_consecutive_failures!r}"
            )
        self.window_s = check_interval("window_s", window_s)
        self._requested = device_indices
        if isinstance(device_uuids, str | bytes):  # one UUID, not its characters (QA)
            device_uuids = [device_uuids]
        self._uuids = None if device_uuids is None else tuple(map(_plain_uuid, device_uuids))
        self._nvml = nvml
        self._clock = clock
        self._max_failures = max_consecutive_failures
        self._data_lock = threading.Lock()
        self._readings: collections.deque[GpuReading] = collections.deque()
        self._latest: dict[int, GpuReading] = {}
        self._handles: dict[int, Any] = {}
        self._names: dict[int, str] = {}
        self._no_pcie: set[int] = set()
        self._no_util: set[int] = set()
        self._reason: str | None = NOT_STARTED
        self._available = False
        self._initialised = False
        self._errors = 0
        self._last_error: str | None = None
        self._failed_ticks = 0

    # -- setup -------------------------------------------------------------------------
    def _unavailable(self, reason: str, *, no_driver: bool = False) -> bool:
        self._reason = reason
        # Once per process and reason: every loader on a machine without NVML would
        # otherwise print it again (the stats and the report still say "no GPU"). A
        # machine with no NVIDIA driver at all is simply a machine without a GPU: that
        # is said at INFO, not as a warning on every CPU run.
        with _warned_lock:
            first = reason not in _warned
            _warned.add(reason)
        level = (logging.INFO if no_driver else logging.WARNING) if first else logging.DEBUG
        _log.log(level, "GPU monitoring is off: %s", reason)
        return False

    def _setup(self) -> bool:
        if self._nvml is None:
            from gpu_loader._optional import require

            try:
                self._nvml = require("pynvml", "GPU monitoring")
            except ImportError as exc:
                # The install hint is advice only where there is a GPU to monitor.
                return self._unavailable(str(exc), no_driver=not nvidia_driver_present())
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError...
            return self._unavailable(
                f"NVML did not initialise ({_describe(exc)})",
                no_driver=getattr(exc, "value", None) == NVML_ERROR_LIBRARY_NOT_FOUND,
            )
        self._initialised = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            indices = self._match_uuids(count)
            if indices is None:
                indices = self._requested if self._requested is not None else tuple(range(count))
            if count == 0 or not indices:
                return self._unavailable("NVML sees no NVIDIA device")
            missing = [i for i in indices if i >= count]
            if missing:
                return self._unavailable(
                    f"device indices {missing} do not exist; NVML sees {count} device(s)"
                )
            for i in indices:
                self._handles[i] = nvml.nvmlDeviceGetHandleByIndex(i)
                self._names[i] = self._read_name(i)
        except Exception as exc:
            return self._unavailable(f"NVML could not open the devices ({_describe(exc)})")
        self._available = True
        self._reason = None
        return True

    def _match_uuids(self, count: int) -> tuple[int, ...] | None:
        """The NVML indices of ``device_uuids``, or None when not given or one does not
        match (then ``device_indices`` decide, as before)."""
        if not self._uuids:
            return None
        found: dict[str, int] = {}
        for i in range(count):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i)
                found.setdefault(_plain_uuid(self._nvml.nvmlDeviceGetUUID(handle)), i)
            except Exception as exc:  # that device only (no permission, an old driver)
                _log.debug("NVML device %d's UUID could not be read (%s)", i, _describe(exc))
        missing = [u for u in self._uuids if u not in found]
        if missing:
            _log.debug("no NVML device has UUID %s; sampling by index", ", ".join(missing))
            return None
        return tuple(found[u] for u in self._uuids)

    def _read_name(self, index: int) -> str:
        try:
            return parse_name(self._nvml.nvmlDeviceGetName(self._handles[index]), index)
        except Exception:  # a name is cosmetic: fall back to "GPU <i>"
            return f"GPU {index}"

    def _teardown(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # shutting down a broken driver: nothing left to do
                _log.debug("nvmlShutdown failed: %s", _describe(exc))

    # -- sampling ----------------------------------------------------------------------
    def _is_not_supported(self, exc: BaseException) -> bool:
        code = getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED)
        return getattr(exc, "value", None) == code

    def _read_pcie(self, index: int, counter_name: str, default: int) -> float | None:
        if index in self._no_pcie:
            return None
        counter = getattr(self._nvml, counter_name, default)
        try:
            return parse_pcie(self._nvml.nvmlDeviceGetPcieThroughput(self._handles[index], counter))
        except Exception as exc:
            if self._is_not_supported(exc):
                self._no_pcie.add(index)
                return None
            raise

    def _read_utilization(self, index: int) -> tuple[float | None, float | None]:
        if index in self._no_util:
            return None, None
        try:
            return parse_utilization(self._nvml.nvmlDeviceGetUtilizationRates(self._handles[index]))
        except Exception as exc:
            if not self._is_not_supported(exc):
                raise
        self._no_util.add(index)
        reason = (
            f"NVML reports no utilisation for GPU {index} ({self._names.get(index, '?')}; "
            "MIG instances and some vGPUs have none): GPU idle % is not reported, memory is"
        )
        with _warned_lock:
            first = reason not in _warned
            _warned.add(reason)
        _log.log(logging.WARNING if first else logging.DEBUG, "GPU monitoring: %s", reason)
        return None, None

    def _read(self, index: int) -> GpuReading:
        nvml, handle = self._nvml, self._handles[index]
        sm, mem = self._read_utilization(index)
        used, total = parse_memory(nvml.nvmlDeviceGetMemoryInfo(handle))
        tx = self._read_pcie(index, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx = self._read_pcie(index, "NVML_PCIE_UTIL_RX_BYTES", 1)
        return GpuReading(self._clock(), index, sm, mem, used, total, tx, rx)

    def sample_once(self) -> int:
        """Read every device now (also what the thread does); returns readings taken."""
        taken = 0
        for index in self._handles:
            try:
                reading = self._read(index)
            except Exception as exc:  # NVMLError or a nonsense value: count it, go on
                self._record_error(index, exc)
                continue
            taken += 1
            with self._data_lock:
                self._readings.append(reading)
                self._latest[index] = reading
                self._prune(reading.time_s)
        return taken

    def _record_error(self, index: int, exc: BaseException) -> None:
        message = f"GPU {index}: {_describe(exc)}"
        with self._data_lock:
            self._errors += 1
            self._last_error = message
            first = self._errors == 1
        if first:
            _log.warning("NVML read failed (counted, sampling goes on): %s", message)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self._readings and self._readings[0].time_s <= horizon:
            self._readings.popleft()

    def _tick(self) -> bool:
        if self.sample_once() > 0:
            self._failed_ticks = 0
            return True
        self._failed_ticks += 1
        if self._failed_ticks < self._max_failures:
            return True
        with self._data_lock:
            self._available = False
            self._reason = (
                f"stopped after {self._failed_ticks} ticks in which every NVML read failed; "
                f"last: {self._last_error}"
            )
        _log.warning("GPU monitoring %s", self._reason)
        return False

    # -- results -----------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """True while NVML is initialised and the sampler has not given up."""
        return self._available

    def snapshot(self) -> GpuSnapshot:
        """Means over the recent window and the latest reading of each device."""
        now = self._clock()
        with self._data_lock:
            readings = list(self._readings)
            horizon = now - self.window_s
            readings += [r for r in self._latest.values() if r.time_s <= horizon]
            available, reason = self._available, self._reason
            errors, last_error = self._errors, self._last_error
        if not self._handles:
            snap = GpuSnapshot.unavailable(reason or "no devices", self.window_s)
        else:
            snap = aggregate(readings, self.window_s, now, self._names)
        return dataclasses.replace(
            snap, available=available, reason=reason, errors=errors, last_error=last_error
        )
