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
