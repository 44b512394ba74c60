"""The kernel loader and the CUDA launcher, driven through a fake CuPy.

The fake records what the loader asks of CuPy, and its RawKernel runs the emulated
kernel with the arguments exactly as launch_fused passes them, converted the way
CuPy converts them (numpy scalars by their own C type, arrays as pointers, anything
else refused). So the shared checker verifies the CUDA launcher's argument list
end to end without a GPU.
"""

from __future__ import annotations

import ctypes
import threading
import types
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pytest

import gpu_loader.cuda._device_cuda as device_cuda
import gpu_loader.cuda._fused as fused
import gpu_loader.cuda._kernels as kernels
from gpu_loader.cuda._emulation import load_library
from gpu_loader.cuda._launch import KERNEL_NAMES, OUTPUT_DTYPES, OutputDtype
from tests.kernels.checker import check_fused_kernel, random_case, run_host

# The C parameter list of every fused kernel, in order.
SIGNATURE = ("ptr", "int32", "int32", *("float32",) * 6, "ptr")


class FakeStream(AbstractContextManager["FakeStream"]):
    def __init__(self, ptr: int = 0) -> None:
        self.ptr = ptr
        self.entered = 0

    def __enter__(self) -> FakeStream:
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeKernel:
    def __init__(self, name: str, log: list[tuple[str, Any]]) -> None:
        self.name = name
        self.log = log

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]
    ) -> None:
        assert len(args) == len(SIGNATURE), args
        c_args: list[Any] = []
        for value, kind in zip(args, SIGNATURE, strict=True):
            if kind == "ptr" and isinstance(value, np.ndarray):
                c_args.append(ctypes.c_void_p(value.ctypes.data))
            elif kind == "ptr" and type(value) is np.uint64:
                c_args.append(ctypes.c_void_p(int(value)))
            elif kind == "int32" and type(value) is np.int32:
                c_args.append(ctypes.c_int(int(value)))
            elif kind == "float32" and type(value) is np.float32:
                c_args.append(ctypes.c_float(float(value)))
            else:  # CuPy would pass e.g. a Python float as a double: a silent ABI bug
                raise TypeError(f"argument {value!r} ({type(value)}) for a {kind} parameter")
        self.log.append(("launch", (self.name, grid, block)))
        fn = getattr(load_library(), f"emulated_{self.name}")
        fn(*(ctypes.c_uint(v) for v in (*grid, *block)), *c_args)


def make_fake_cupy(device: list[int], log: list[tuple[str, Any]]) -> types.SimpleNamespace:
    current = FakeStream()

    class RawModule:
        def __init__(self, *, code: str, options: tuple[str, ...]) -> None:
            log.append(("module", (device[0], options)))
            assert "fused_resize_f32" in code

        def get_function(self, name: str) -> FakeKernel:
            log.append(("get_function", name))
            return FakeKernel(name, log)

    class Device(AbstractContextManager["Device"]):
        def __init__(self, index: int | None = None) -> None:
            self.index = index

        @property
        def id(self) -> int:
            return device[0]

        def __enter__(self) -> Device:
            log.append(("device", self.index))
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    cuda = types.SimpleNamespace(
        Device=Device,
        Stream=FakeStream,
        ExternalStream=FakeStream,
        get_current_stream=lambda: current,
    )
    return types.SimpleNamespace(
        RawModule=RawModule, cuda=cuda, asarray=lambda a: np.array(a, copy=True)
    )


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[int], list[tuple[str, Any]]]]:
    device = [0]
    log: list[tuple[str, Any]] = []
    fake = make_fake_cupy(device, log)
    monkeypatch.setattr(kernels, "require", lambda module, feature: fake)
    monkeypatch.setattr(fused, "require", lambda module, feature: fake)
    monkeypatch.setattr(device_cuda, "require", lambda module, feature: fake)
    monkeypatch.setattr(kernels, "nvrtc_options", lambda: ("--std=c++17", "-I/fake"))
    kernels.clear_cache()
    yield device, log
    kernels.clear_cache()


def test_modules_are_built_lazily_and_once_per_device(fake_cupy: Any) -> None:
    device, log = fake_cupy
    assert log == []  # nothing happens before the first request
    first = kernels.get_kernel("fused_resize_f32")
    again = kernels.get_kernel("fused_resize_f32")
    assert first is again
    kernels.get_kernel("fused_resize_u8")
    assert [e for e in log if e[0] == "module"] == [("module", (0, ("--std=c++17", "-I/fake")))]
    device[0] = 1
    kernels.get_kernel("fused_resize_f32")
    assert [e[1][0] for e in log if e[0] == "module"] == [0, 1]


def test_concurrent_first_use_builds_one_module(fake_cupy: Any) -> None:
    _, log = fake_cupy
    threads = [
        threading.Thread(target=kernels.get_kernel, args=("fused_resize_f16",)) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for e in log if e[0] == "module") == 1
    assert sum(1 for e in log if e[0] == "get_function") == 1


def test_unknown_source_is_refused(fake_cupy: Any) -> None:
    with pytest.raises(ValueError, match=r"unknown kernel source 'nope\.cu'"):
        kernels.get_module("nope.cu")


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
def test_cuda_launcher_passes_what_the_kernel_expects(
    fake_cupy: Any, dtype: OutputDtype, interpolation: str
) -> None:
    _, log = fake_cupy
    rng = np.random.default_rng(42)
    case = random_case(rng, dtype, n=3, label="via launch_fused", interpolation=interpolation)
    check_fused_kernel(run_host(fused.launch_fused), case)
    launches = [e[1] for e in log if e[0] == "launch"]
    want = KERNEL_NAMES[(interpolation, dtype)]
    assert launches and all(name == want for name, _, _ in launches)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_the_kernel_launch_port_passes_the_filter_on(fake_cupy: Any, interpolation: str) -> None:
    # The GPU path calls the port (CudaKernelLauncher), not launch_fused: the filter must
    # reach the kernel through it, on the port's device.
    from gpu_loader.cuda import CudaKernelLauncher

    _, log = fake_cupy
    rng = np.random.default_rng(8)
    case = random_case(rng, "float32", n=3, label="via the port", interpolation=interpolation)
    check_fused_kernel(run_host(CudaKernelLauncher(3).launch), case)
    assert ("device", 3) in log


def test_cuda_launcher_uses_the_given_stream(fake_cupy: Any) -> None:
    stream = FakeStream(ptr=1234)
    rng = np.random.default_rng(1)
    case = random_case(rng, "float32", n=1)
    out = np.zeros((1, 3, case.out_h, case.out_w), np.float32)
    b = case.buffers[0]
    fused.launch_fused(
        [(b.ctypes.data, b.shape[0], case.widths[0], b.strides[0])], case.boxes, case.flips,
        out.ctypes.data, case.out_h, case.out_w, case.mean, case.std, "float32", stream,
    )  # fmt: skip
    assert stream.entered == 1


def launch_on_foreign_streams() -> None:
    """One 2x2 launch on a torch-like stream (`cuda_stream` 0, the legacy default) and
    one on a wrapper exposing `ptr` 77."""
    out = np.zeros((1, 3, 2, 2), np.float32)
    src = np.zeros((2, 6), np.uint8)
    image = [(src.ctypes.data, 2, 2, 6)]
    for handle in (types.SimpleNamespace(cuda_stream=0), types.SimpleNamespace(ptr=77)):
        fused.launch_fused(
            image, [(0, 0, 2, 2)], [False], out.ctypes.data, 2, 2, (0, 0, 0), (1, 1, 1),
            "float32", handle,
        )  # fmt: skip


def test_cuda_launcher_wraps_a_foreign_stream_even_the_default_one(
    fake_cupy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapped: list[int] = []

    class External(FakeStream):
        def __init__(self, ptr: int) -> None:
            super().__init__(ptr)
            wrapped.append(ptr)

    fake = fused.require("cupy", "")
    monkeypatch.setattr(fake.cuda, "ExternalStream", External)
    monkeypatch.setattr(fake.cuda, "Stream", type("OtherStream", (), {}))
    launch_on_foreign_streams()
    assert wrapped == [0, 77]


def test_cuda_launcher_wraps_a_foreign_stream_through_the_stream_protocol(
    fake_cupy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CuPy >= 14: Stream.from_external(obj with __cuda_stream__) replaces the deprecated
    # ExternalStream; the launcher must use it when it exists.
    wrapped: list[tuple[int, int]] = []

    class Stream(FakeStream):
        @classmethod
        def from_external(cls, obj: Any) -> FakeStream:
            version, ptr = obj.__cuda_stream__()
            wrapped.append((version, ptr))
            return FakeStream(ptr)

    class NoExternal(FakeStream):
        def __init__(self, ptr: int) -> None:
            raise AssertionError("the deprecated ExternalStream was used")

    fake = fused.require("cupy", "")
    monkeypatch.setattr(fake.cuda, "Stream", Stream)
    monkeypatch.setattr(fake.cuda, "ExternalStream", NoExternal)
    launch_on_foreign_streams()
    assert wrapped == [(0, 0), (0, 77)]


def test_cuda_launcher_refuses_a_non_stream(fake_cupy: Any) -> None:
    image = [(0x1000, 2, 2, 6)]
    with pytest.raises(TypeError, match="stream"):
        fused.launch_fused(
            image, [(0, 0, 2, 2)], [False], 0x2000, 2, 2, (0, 0, 0), (1, 1, 1), "float32", object()
        )


def test_empty_batch_touches_no_cuda(fake_cupy: Any) -> None:
    _, log = fake_cupy
    fused.launch_fused([], [], [], 0, 2, 2, (0, 0, 0), (1, 1, 1), "float32", None)
    assert log == []


def test_missing_headers_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "cuda_include_dir", lambda: None)
    kernels.nvrtc_options.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="nvidia-cuda-runtime-cu12"):
            kernels.nvrtc_options()
    finally:
        kernels.nvrtc_options.cache_clear()
