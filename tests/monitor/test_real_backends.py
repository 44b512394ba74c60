"""The samplers against the real pynvml / psutil of this machine, and import hygiene."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_loader.monitor import NvmlSampler

from ._fakes import monitor_threads, wait_until


def test_real_nvml_is_available_or_says_why() -> None:
    # Runs anywhere: without a driver NVML is unavailable with a reason, never an exception.
    with NvmlSampler(interval_s=0.01) as sampler:
        snap = sampler.snapshot()
        if snap.available:
            assert wait_until(lambda: bool(sampler.snapshot().devices))
        else:
            assert snap.reason and snap.devices == ()
    assert not monitor_threads()


@pytest.mark.needs_cuda
def test_real_nvml_reads_a_gpu() -> None:
    with NvmlSampler(interval_s=0.01, window_s=5.0) as sampler:
        assert wait_until(lambda: bool(sampler.snapshot().devices))
        snap = sampler.snapshot()
    assert snap.available and snap.errors == 0, snap.reason
    device = snap.devices[0]
    assert device.memory_total_bytes is not None and device.memory_total_bytes > 1 << 30
    assert device.sm_util_percent is not None and 0.0 <= device.sm_util_percent <= 100.0
    assert device.name.startswith("NVIDIA") or device.name.startswith("GPU")


def test_importing_the_monitor_loads_no_sampler_backend() -> None:
    code = (
        "import sys, gpu_loader.monitor\n"
        "print(sorted(m for m in ('pynvml', 'psutil', 'tqdm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
