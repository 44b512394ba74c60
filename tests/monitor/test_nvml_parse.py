"""NVML parsing and aggregation as pure functions on literal inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpu_loader.monitor import (
    GpuReading,
    GpuSnapshot,
    aggregate,
    nvml_indices_for_cuda,
    parse_memory,
    parse_name,
    parse_pcie,
    parse_utilization,
)


def reading(t: float, index: int = 0, sm: float = 50.0, **kw: float | None) -> GpuReading:
    values: dict[str, float | None] = {
        "mem_util_percent": 10.0,
        "memory_used_bytes": 1000,
        "memory_total_bytes": 4000,
        "pcie_tx_kbps": 100.0,
        "pcie_rx_kbps": 200.0,
    }
    values.update(kw)
    return GpuReading(time_s=t, index=index, sm_util_percent=sm, **values)  # type: ignore[arg-type]


def test_parse_utilization() -> None:
    assert parse_utilization(SimpleNamespace(gpu=87, memory=31)) == (87.0, 31.0)
    assert parse_utilization(SimpleNamespace(gpu=0, memory=100)) == (0.0, 100.0)


@pytest.mark.parametrize(
    "raw",
    [
        SimpleNamespace(gpu=101, memory=0),
        SimpleNamespace(gpu=-1, memory=0),
        SimpleNamespace(gpu=5),
        SimpleNamespace(gpu="5", memory=0),
        SimpleNamespace(gpu=True, memory=0),
    ],
)
def test_parse_utilization_rejects_nonsense(raw: object) -> None:
    with pytest.raises(ValueError, match="utilization"):
        parse_utilization(raw)


def test_parse_memory() -> None:
    assert parse_memory(SimpleNamespace(used=1 << 30, total=80 << 30, free=79 << 30)) == (
        1 << 30,
        80 << 30,
    )
    with pytest.raises(ValueError, match="used <= total"):
        parse_memory(SimpleNamespace(used=5, total=4))
    with pytest.raises(ValueError, match="total > 0"):
        parse_memory(SimpleNamespace(used=0, total=0))


def test_parse_pcie_and_name() -> None:
    assert parse_pcie(12345) == 12345.0
    with pytest.raises(ValueError, match="KB/s"):
        parse_pcie(-1)
    with pytest.raises(ValueError, match="KB/s"):
        parse_pcie(None)
    assert parse_name(b"NVIDIA A100", 0) == "NVIDIA A100"
    assert parse_name("  NVIDIA H100 ", 1) == "NVIDIA H100"
    assert parse_name("", 3) == "GPU 3"
    assert parse_name(None, 2) == "GPU 2"


def test_aggregate_means_over_the_window_and_latest() -> None:
    samples = [
        reading(1.0, sm=10.0),  # outside the window (now - 5 = 5)
        reading(6.0, sm=40.0, pcie_tx_kbps=100.0, memory_used_bytes=1000),
        reading(8.0, sm=60.0, pcie_tx_kbps=300.0, memory_used_bytes=3000),
        reading(11.0, sm=99.0),  # in the future: ignored
    ]
    snap = aggregate(samples, window_s=5.0, now=10.0, names={0: "A100"})
    assert snap.available and snap.reason is None and snap.window_s == 5.0
    (dev,) = snap.devices
    assert (dev.index, dev.name, dev.samples) == (0, "A100", 2)
    assert dev.sm_util_percent == pytest.approx(50.0)
    assert dev.pcie_tx_kbps == pytest.approx(200.0)
    assert dev.memory_used_bytes == 3000  # latest, not mean
    assert dev.latest is not None and dev.latest.time_s == 8.0
    assert snap.util_percent == pytest.approx(50.0)
    assert snap.idle_percent == pytest.approx(50.0)


def test_aggregate_window_edge_is_exclusive() -> None:
    snap = aggregate([reading(5.0, sm=0.0), reading(10.0, sm=100.0)], window_s=5.0, now=10.0)
    assert snap.devices[0].samples == 1
    assert snap.devices[0].sm_util_percent == 100.0


def test_aggregate_several_devices_sorted_and_stale_device_kept() -> None:
    samples = [reading(9.0, index=1, sm=80.0), reading(2.0, index=0, sm=30.0)]
    snap = aggregate(samples, window_s=5.0, now=10.0)
    assert [d.index for d in snap.devices] == [0, 1]
    stale, fresh = snap.devices
    assert fresh.samples == 1 and fresh.sm_util_percent == 80.0
    assert stale.samples == 0 and stale.sm_util_percent is None
    assert stale.memory_used_bytes == 1000  # latest reading still reported
    assert stale.name == "GPU 0"
    # Only devices with readings in the window count towards utilisation.
    assert snap.util_percent == pytest.approx(80.0)


def test_aggregate_missing_pcie_stays_none_and_empty_input() -> None:
    snap = aggregate([reading(9.0, pcie_tx_kbps=None, pcie_rx_kbps=None)], 5.0, 10.0)
    assert snap.devices[0].pcie_tx_kbps is None and snap.devices[0].pcie_rx_kbps is None
    empty = aggregate([], 5.0, 10.0)
    assert empty.devices == () and empty.util_percent is None and empty.idle_percent is None
    with pytest.raises(ValueError, match="window_s"):
        aggregate([], 0.0, 10.0)


def test_reading_validates() -> None:
    with pytest.raises(ValueError, match="sm_util_percent"):
        reading(1.0, sm=150.0)
    with pytest.raises(ValueError, match="pcie_rx_kbps"):
        reading(1.0, pcie_rx_kbps=-3.0)


def test_unavailable_snapshot() -> None:
    snap = GpuSnapshot.unavailable("no driver")
    assert not snap.available and snap.reason == "no driver" and snap.util_percent is None


@pytest.mark.parametrize(
    ("cuda", "visible", "expected"),
    [
        ([0, 1], None, (0, 1)),
        ([0, 1], "3,1", (3, 1)),
        ([1], " 2, 5 ", (5,)),
        ([0], "GPU-8e3c-uuid", None),
        ([2], "0,1", None),
    ],
)
def test_nvml_indices_for_cuda(
    cuda: list[int],
    visible: str | None,
    expected: tuple[int, ...] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_indices_for_cuda(cuda, visible) == expected


def test_a_plain_cuda_device_is_watched_on_torchs_current_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DDP ranks call torch.cuda.set_device(local_rank) and pass device="cuda": each rank
    # reported GPU 0's utilisation.
    import torch

    from gpu_loader.loader import _cuda_index

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _cuda_index(torch.device("cuda")) == 3
    assert _cuda_index(torch.device("cuda:1")) == 1

    def no_cuda() -> int:
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "current_device", no_cuda)
    assert _cuda_index(torch.device("cuda")) == 0


def test_a_cuda_loader_names_its_gpu_to_the_monitor_by_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With UUIDs in CUDA_VISIBLE_DEVICES the index mapping gives up (every GPU sampled),
    # and with integers it is exact only in PCI bus order: the UUID names the device.
    import types

    import torch

    import gpu_loader as gl
    from gpu_loader.loader import _make_monitor
    from gpu_loader.monitor import MonitorConfig

    uuid = "ffc79498-8ff3-c2dc-3b0d-fafd804516ae"
    props = {3: types.SimpleNamespace(uuid=uuid)}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c,GPU-ffc79498")
    loader = types.SimpleNamespace(options=gl.LoaderOptions(), device=torch.device("cuda"))
    config = _make_monitor(loader).config  # type: ignore[arg-type]
    assert config.gpu_uuids == (uuid,) and config.gpu_devices is None
    assert MonitorConfig(gpu_uuids=f"GPU-{uuid}").gpu_uuids == (f"GPU-{uuid}",)  # not chars

    # A monitor made for one stats() snapshot never samples: it must not initialise CUDA
    # (a process that forks after loader.stats() then failed).
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: calls.append("current") or 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: calls.append("props"))
    config = _make_monitor(loader, for_sampling=False).config  # type: ignore[arg-type]
    assert calls == [] and config.gpu_uuids is None and config.gpu_devices is None
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)

    def cpu_only_torch(index: int) -> object:
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_properties", cpu_only_torch)
    config = _make_monitor(loader).config  # type: ignore[arg-type]
    assert config.gpu_uuids is None
