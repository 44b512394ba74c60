"""NvmlSampler with an injected fake NVML: unavailable, one device, failure mid-run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

import gpu_loader.monitor._nvml as nvml_module
from gpu_loader.monitor import NvmlSampler

from ._fakes import FakeGpu, FakeNvml, FakeNVMLError, ScriptedClock, monitor_threads, wait_until

MS = 0.001


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # "GPU monitoring is off" is logged as a warning once per process and reason.
    monkeypatch.setattr(nvml_module, "_warned", set())


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(monitor_threads())
    yield
    assert set(monitor_threads()) - before == set()


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (FakeNvml(init_error=FakeNVMLError(9)), "NVML did not initialise"),
        (FakeNvml(init_error=OSError("libnvidia-ml.so.1: cannot open")), "libnvidia-ml"),
        (FakeNvml(gpus=[]), "no NVIDIA device"),
    ],
)
def test_unavailable_says_so_once(
    nvml: FakeNvml, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gpu_loader.monitor")
    sampler = NvmlSampler(interval_s=MS, nvml=nvml)
    with sampler:
        sampler.start()  # a second start must not retry nor warn again
        assert not sampler.running
        snap = sampler.snapshot()
        snap2 = sampler.snapshot()
    assert not snap.available and reason in (snap.reason or "")
    assert snap.devices == () and snap.util_percent is None and snap2 == snap
    messages = warnings_from(caplog)
    assert len(messages) == 1 and reason in messages[0]
    assert nvml.inits == 1


def test_a_machine_without_an_nvidia_driver_is_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # NVML_ERROR_LIBRARY_NOT_FOUND (12): no driver, so no GPU. Said at INFO, not WARNING.
    caplog.set_level(logging.INFO, logger="gpu_loader.monitor")
    with NvmlSampler(interval_s=MS, nvml=FakeNvml(init_error=FakeNVMLError(12))) as sampler:
        snap = sampler.snapshot()
    assert not snap.available and "NVML did not initialise" in (snap.reason or "")
    assert warnings_from(caplog) == []
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(info) == 1 and "GPU monitoring is off" in info[0]


def test_the_same_reason_warns_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    # Every loader on a machine without NVML makes a sampler; one warning is enough.
    caplog.set_level(logging.DEBUG, logger="gpu_loader.monitor")
    for _ in range(3):
        with NvmlSampler(interval_s=MS, nvml=FakeNvml(init_error=FakeNVMLError(9))) as sampler:
            assert not sampler.snapshot().available
    assert len(warnings_from(caplog)) == 1
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 2 and all("GPU monitoring is off" in r.getMessage() for r in debug)


@pytest.mark.parametrize("driver", [True, False])
def test_missing_pynvml_module_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, driver: bool
) -> None:
    # The install hint is a warning where a GPU could be monitored; on a machine with no
    # NVIDIA driver it read as advice to install GPU packages on every CPU run (QA).
    import gpu_loader._optional as optional

    def fail(module: str, feature: str) -> object:
        raise ImportError(f"{feature} needs NVML; pip install 'gpu-loader[cuda12]'")

    monkeypatch.setattr(optional, "require", fail)
    monkeypatch.setattr(nvml_module, "nvidia_driver_present", lambda: driver)
    caplog.set_level(logging.INFO, logger="gpu_loader.monitor")
    with NvmlSampler(interval_s=MS) as sampler:
        snap = sampler.snapshot()
    assert not snap.available and "gpu-loader[cuda12]" in (snap.reason or "")
    assert len(warnings_from(caplog)) == (1 if driver else 0)
    assert any("GPU monitoring is off" in r.getMessage() for r in caplog.records)


def test_bad_device_index_is_unavailable_not_a_crash() -> None:
    nvml = FakeNvml()
    with NvmlSampler([0, 3], interval_s=MS, nvml=nvml) as sampler:
        snap = sampler.snapshot()
    assert not snap.available and "[3]" in (snap.reason or "")
    assert nvml.shutdowns == 1  # initialised, so shut down


def uuid_of(n: int) -> str:
    return f"{n:08x}-8ff3-c2dc-3b0d-fafd804516ae"


@pytest.mark.parametrize("nvml_form", [str.upper, lambda u: f"GPU-{u}".encode()])
def test_device_uuids_pick_the_device_whatever_the_indices_say(
    nvml_form: Callable[[str], str | bytes],
) -> None:
    # CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and
    # CUDA_VISIBLE_DEVICES may list UUIDs: an index from it named another GPU, or none.
    gpus = [FakeGpu(sm=10 * i, uuid=nvml_form(uuid_of(i))) for i in range(3)]
    nvml = FakeNvml(gpus=gpus)
    with NvmlSampler([0], device_uuids=[uuid_of(2)], interval_s=MS, nvml=nvml) as sampler:
        assert wait_until(lambda: nvml.reads >= 1)
        snap = sampler.snapshot()
    (dev,) = snap.devices
    assert dev.index == 2 and dev.sm_util_percent == 20.0

    # One UUID given bare is that UUID, not its characters (every GPU was sampled), and a
    # device whose UUID cannot be read does not stop the others matching (QA).
    class OneUnreadable(FakeNvml):
        def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
            if handle == 0:
                raise FakeNVMLError(4)  # NVML_ERROR_NO_PERMISSION
            return super().nvmlDeviceGetUUID(handle)

    nvml = OneUnreadable(gpus=gpus)
    with NvmlSampler(device_uuids=uuid_of(1), interval_s=MS, nvml=nvml) as sampler:
        assert wait_until(lambda: nvml.reads >= 1)
        assert [d.index for d in sampler.snapshot().devices] == [1]


def test_a_uuid_nvml_does_not_list_falls_back_to_the_indices(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A MIG instance's UUID is not among NVML's top-level devices (and an old driver or
    # a fake may have no UUIDs at all): the indices decide, as without UUIDs.
    gpus = [FakeGpu(sm=10 * i, uuid=f"GPU-{uuid_of(i)}") for i in range(2)]
    caplog.set_level(logging.DEBUG, logger="gpu_loader.monitor")
    for indices, expected in (([1], [1]), (None, [0, 1])):
        nvml = FakeNvml(gpus=gpus)
        with NvmlSampler(indices, device_uuids=[uuid_of(7)], interval_s=MS, nvml=nvml) as s:
            assert wait_until(lambda: nvml.reads >= 2)  # noqa: B023 (waited on at once)
            assert [d.index for d in s.snapshot().devices] == expected
    assert any("no NVML device has UUID 00000007" in r.getMessage() for r in caplog.records)


def test_one_device_values_flow_into_the_snapshot() -> None:
    gpu = FakeGpu(sm=87, mem=31, used=3 << 30, total=80 << 30, tx=1500, rx=2500, name=b"H100")
    nvml = FakeNvml(gpus=[gpu])
    with NvmlSampler(interval_s=MS, window_s=60.0, nvml=nvml) as sampler:
        assert wait_until(lambda: nvml.reads >= 3)
        assert sampler.running and sampler.available
        snap = sampler.snapshot()
    assert not sampler.running
    assert snap.available and snap.reason is None and snap.errors == 0
    (dev,) = snap.devices
    assert dev.index == 0 and dev.name == "H100" and dev.samples >= 3
    assert dev.sm_util_percent == 87.0 and dev.mem_util_percent == 31.0
    assert (dev.memory_used_bytes, dev.memory_total_bytes) == (3 << 30, 80 << 30)
    assert (dev.pcie_tx_kbps, dev.pcie_rx_kbps) == (1500.0, 2500.0)
    assert snap.util_percent == 87.0 and snap.idle_percent == pytest.approx(13.0)
    assert nvml.shutdowns == 1


def test_window_means_with_scripted_clock() -> None:
    clock = ScriptedClock()
    gpu = FakeGpu(sm=20)
    nvml = FakeNvml(gpus=[gpu, FakeGpu(sm=90)])
    sampler = NvmlSampler([0], interval_s=1.0, window_s=5.0, nvml=nvml, clock=clock)
    assert sampler._setup()  # open devices without a thread; ticks are driven by hand
    try:
        for sm in (20, 40, 60):
            gpu.sm = sm
            assert sampler.sample_once() == 1
            clock.advance(2.0)
        # now = 106: the window (101, 106] holds the readings at 102 and 104.
        (dev,) = sampler.snapshot().devices
        assert dev.samples == 2 and dev.sm_util_percent == pytest.approx(50.0)
        assert dev.latest is not None and dev.latest.sm_util_percent == 60.0
        clock.advance(100.0)
        (stale,) = sampler.snapshot().devices  # nothing recent, latest still known
        assert stale.samples == 0 and stale.sm_util_percent is None
        assert stale.latest is not None and stale.latest.sm_util_percent == 60.0
    finally:
        sampler.close()
    assert nvml.shutdowns == 1


def test_pcie_not_supported_reads_as_none_without_errors() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(pcie_supported=False)])
    sampler = NvmlSampler(interval_s=1.0, nvml=nvml)
    assert sampler._setup()
    try:
        assert sampler.sample_once() == 1
        assert sampler.sample_once() == 1
        snap = sampler.snapshot()
    finally:
        sampler.close()
    assert snap.errors == 0
    assert snap.devices[0].pcie_tx_kbps is None and snap.devices[0].sm_util_percent == 50.0


def test_utilisation_not_supported_mig_reads_as_none_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A MIG instance: NVML has memory figures but no utilisation. Before, each read
    # failed as a whole and the sampler stopped after five ticks, memory included.
    nvml = FakeNvml(gpus=[FakeGpu(util_supported=False, pcie_supported=False), FakeGpu(sm=70)])
    sampler = NvmlSampler(interval_s=1.0, nvml=nvml)
    assert sampler._setup()
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_loader.monitor"):
            for _ in range(8):
                assert sampler._tick()
                assert sampler.sample_once() == 2
        snap = sampler.snapshot()
    finally:
        sampler.close()
    assert snap.available and snap.errors == 0
    mig, whole = snap.devices
    assert mig.sm_util_percent is None and mig.mem_util_percent is None
    assert mig.memory_used_bytes == 2 * 1024**3 and mig.samples > 0
    assert whole.sm_util_percent == 70.0
    assert snap.util_percent == 70.0  # the mean of the devices that report it
    warned = [m for m in warnings_from(caplog) if "no utilisation" in m]
    assert len(warned) == 1 and "GPU 0" in warned[0] and "idle" in warned[0]
    only_mig = FakeNvml(gpus=[FakeGpu(util_supported=False)])
    sampler = NvmlSampler(interval_s=1.0, nvml=only_mig)
    assert sampler._setup()
    try:
        assert sampler.sample_once() == 1
        assert sampler.snapshot().idle_percent is None  # not 100 % idle: unknown
    finally:
        sampler.close()


def test_transient_failure_is_recorded_and_sampling_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gpu_loader.monitor")
    good, flaky = FakeGpu(sm=10), FakeGpu(sm=70)
    nvml = FakeNvml(gpus=[good, flaky])
    sampler = NvmlSampler(interval_s=1.0, nvml=nvml)
    assert sampler._setup()
    try:
        flaky.lost = True
        assert sampler.sample_once() == 1
        assert sampler.sample_once() == 1
        flaky.lost = False
        assert sampler.sample_once() == 2
        snap = sampler.snapshot()
    finally:
        sampler.close()
    assert snap.available and snap.errors == 2
    assert snap.last_error is not None and snap.last_error.startswith("GPU 1: FakeNVMLError")
    assert [d.samples for d in snap.devices] == [3, 1]
    assert len(warnings_from(caplog)) == 1  # the first failure only


def test_a_device_whose_reads_fail_keeps_its_last_memory_figures() -> None:
    # Its readings leave the window (and the sampler's buffer) while the other device is
    # read on; the snapshot still shows the memory it had, with no recent samples.
    clock = ScriptedClock()
    flaky, good = FakeGpu(used=3 * 1024**3), FakeGpu(used=5 * 1024**3)
    nvml = FakeNvml(gpus=[flaky, good])
    sampler = NvmlSampler(interval_s=1.0, window_s=5.0, nvml=nvml, clock=clock)
    assert sampler._setup()
    try:
        assert sampler.sample_once() == 2
        flaky.lost = True
        for _ in range(10):
            clock.advance(1.0)
            assert sampler.sample_once() == 1
        old, fresh = sampler.snapshot().devices
    finally:
        sampler.close()
    assert (old.samples, old.sm_util_percent) == (0, None)
    assert (old.memory_used_bytes, old.memory_total_bytes) == (flaky.used, flaky.total)
    assert fresh.samples == 5 and fresh.memory_used_bytes == good.used


def test_persistent_failure_stops_the_thread_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpu_loader.monitor")
    gpu = FakeGpu()
    nvml = FakeNvml(gpus=[gpu])
    sampler = NvmlSampler(interval_s=MS, nvml=nvml, max_consecutive_failures=3)
    sampler.start()
    try:
        assert wait_until(lambda: nvml.reads >= 1)
        gpu.lost = True
        assert wait_until(lambda: not sampler.running)
        snap = sampler.snapshot()
    finally:
        sampler.close()
    sampler.close()  # idempotent
    assert not snap.available and "stopped after 3 ticks" in (snap.reason or "")
    assert snap.errors == 3 and "code 15" in (snap.last_error or "")
    assert snap.devices[0].latest is not None  # what it read before stays visible
    assert nvml.shutdowns == 1
    assert len(warnings_from(caplog)) == 2  # first failure, then the stop


def test_nonsense_value_counts_as_a_failed_read() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(sm=250)])
    sampler = NvmlSampler(interval_s=1.0, nvml=nvml)
    assert sampler._setup()
    try:
        assert sampler.sample_once() == 0
        snap = sampler.snapshot()
    finally:
        sampler.close()
    assert snap.errors == 1 and "ValueError" in (snap.last_error or "")


def test_lifecycle_errors_and_validation() -> None:
    sampler = NvmlSampler(interval_s=MS, nvml=FakeNvml())
    sampler.close()
    with pytest.raises(RuntimeError, match="closed"):
        sampler.start()
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler(interval_s=0)
    with pytest.raises(ValueError, match="device_indices"):
        NvmlSampler([-1])
    with pytest.raises(ValueError, match="max_consecutive_failures"):
        NvmlSampler(max_consecutive_failures=0)


def test_failures_that_are_not_consecutive_never_stop_sampling() -> None:
    # A flaky driver failing every other read must not add up to the consecutive limit.
    gpu = FakeGpu()
    sampler = NvmlSampler(interval_s=1.0, nvml=FakeNvml(gpus=[gpu]), max_consecutive_failures=3)
    assert sampler._setup()
    try:
        for tick in range(12):
            gpu.lost = tick % 2 == 0
            assert sampler._tick(), tick
        snap = sampler.snapshot()
    finally:
        sampler.close()
    assert snap.available and snap.errors == 6
