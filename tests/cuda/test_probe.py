"""cuda_available: torch decides, as every CUDA piece of the loader goes through it."""

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
