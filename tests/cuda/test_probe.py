"""The CUDA probe (torch decides) and reading an nvImageCodec image's layout."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from gpu_loader.cuda import _device


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    _device.cuda_available.cache_clear()
    yield
    _device.cuda_available.cache_clear()


def test_a_device_only_cupy_sees_is_not_usable(
    fresh_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU build of torch beside cupy-cuda12x on a GPU machine: device="auto" picked
    # CUDA, and the first pinned allocation failed with "Torch not compiled with CUDA".
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1)
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _device.cuda_available() is False
    _device.cuda_available.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device.cuda_available() is True


def test_cuda_ports_without_a_usable_device_say_so(
    fresh_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # QA: cuda_ports("cuda") on a CPU build of torch raised torch's bare AssertionError.
    from gpu_loader.cuda import cuda_ports

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"torch .* sees none .*standin_ports"):
        cuda_ports("cuda")


def test_an_images_row_pitch_comes_from_its_own_strides() -> None:
    # nvImageCodec leaves the array interface's strides None for interleaved images; a
    # padded row (its `strides` say so) must not be read as 3 * width.
    from gpu_loader.cuda._nvimgcodec import as_device_image

    class Image:
        buffer_kind = "ImageBufferKind.STRIDED_HOST"

        def __init__(self, strides: tuple[int, int, int] | None) -> None:
            self.strides = strides
            self.__array_interface__ = {"shape": (2, 5, 3), "typestr": "|u1", "data": (4096, 0)}

    padded = as_device_image(Image((32, 3, 1)))
    assert padded is not None and padded.pitch == 32 and (padded.height, padded.width) == (2, 5)
    packed = as_device_image(Image(None))
    assert packed is not None and packed.pitch == 15


def test_an_nvimagecodec_too_old_for_the_decoder_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 0.7 and 0.8 lack DecodeParams(sample_format=) and the CPU-only device: a TypeError
    # at the first decoder, on every GPU-path epoch.
    import nvidia.nvimgcodec as nvimgcodec

    from gpu_loader.cuda._nvimgcodec import NvImageCodecDecoder, check_version

    for ok in ("0.9.0", "0.10.1", "1.0"):
        check_version(ok)
    monkeypatch.setattr(nvimgcodec, "__version__", "0.8.0", raising=False)
    with pytest.raises(ImportError, match=r"nvImageCodec 0\.8\.0 is too old .* needs 0\.9") as info:
        NvImageCodecDecoder(device_id=None)
    assert "pip install -U 'nvidia-nvimgcodec-cu12[nvjpeg]', or 'nvidia-nvimgcodec-cu13" in str(
        info.value
    )


def test_the_gpu_extras_ask_for_the_nvimagecodec_the_decoder_needs() -> None:
    from pathlib import Path

    from gpu_loader.cuda._nvimgcodec import MIN_VERSION

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    wanted = ">=" + ".".join(map(str, MIN_VERSION))
    for extra in ("cuda12", "cuda13"):
        (spec,) = [
            d for d in extras["project"]["optional-dependencies"][extra] if "nvimgcodec" in d
        ]
        assert spec.endswith(wanted), spec


def test_the_events_a_worker_waits_on_block_instead_of_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A non-blocking event's synchronize() spins a CPU core for a whole decode + kernel,
    # the core a fetch thread beside it needs (cudaEventBlockingSync sleeps instead).
    from gpu_loader.cuda._device_cuda import CudaRuntime

    made: list[dict[str, object]] = []

    class Recorded:
        def __init__(self, **kw: object) -> None:
            made.append(kw)
            self.streams: list[object] = []

        def record(self, stream: object) -> None:
            self.streams.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Recorded)
    runtime = object.__new__(CudaRuntime)  # no device here: only the event is made
    event = runtime.record_event("stream")  # type: ignore[arg-type]
    assert made == [{"blocking": True}] and event.streams == ["stream"]  # type: ignore[attr-defined]
