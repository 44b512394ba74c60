"""The one kernel loader: ``kernels/*.cu`` -> ``cupy.RawModule``, lazily, memoized per device.

Nothing here touches CuPy or a device at import. The first :func:`get_kernel` on a
device reads the source through ``gpu_loader._resources.read_kernel``, builds a
``cupy.RawModule`` with exactly :data:`NVRTC_OPTIONS` plus the CUDA include directory
(:func:`nvrtc_options`), and keeps it for that device. The tests compile the same
sources through the raw NVRTC binding with the same :func:`nvrtc_options`, so what
runs on a GPU is what was compiled in CI.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from pathlib import Path
from typing import Any

from gpu_loader._optional import require
from gpu_loader._resources import read_kernel

# Every CUDA source the package ships; each compiles on its own.
KERNEL_SOURCES: tuple[str, ...] = ("fused_resize.cu",)

# The fixed NVRTC options. No fast-math: the kernels must compute what the float64
# reference and the CPU emulation compute (IEEE division, denormals kept).
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)

_lock = threading.Lock()
_modules: dict[tuple[int, str], Any] = {}
_functions: dict[tuple[int, str, str], Any] = {}


def cuda_include_dir() -> str | None:
    """The directory holding ``cuda_fp16.h``: the pip CUDA runtime headers or a toolkit.

    Looks at cuda-pathfinder (the ``nvidia-cuda-runtime-cu12`` or, for CUDA 13,
    ``nvidia-cuda-runtime`` wheel's headers), then
    ``$CUDA_PATH``/``$CUDA_HOME``, then ``/usr/local/cuda``. None when none has the header.
    """
    candidates: list[Path] = []
    wheel_headers = _pathfinder_include()
    if wheel_headers is not None:
        candidates.append(wheel_headers)
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for candidate in candidates:
        if (candidate / "cuda_fp16.h").is_file():
            return str(candidate)
    return None


def _pathfinder_include() -> Path | None:
    """The ``nvidia-cuda-runtime`` wheel's include directory, found by cuda-pathfinder."""
    try:
        pathfinder = importlib.import_module("cuda.pathfinder")
    except ImportError:
        return None  # CuPy < 14 has no cuda-pathfinder: the toolkit paths may still work
    found = pathfinder.find_nvidia_header_directory("cudart")
    return Path(found) if found else None


@functools.cache
def nvrtc_options() -> tuple[str, ...]:
    """NVRTC_OPTIONS plus ``-I`` for the CUDA headers the kernels include (cuda_fp16.h)."""
    include = cuda_include_dir()
    if include is None:
        raise FileNotFoundError(
            "the fused kernels include cuda_fp16.h/cuda_bf16.h, which were not found; "
            "install the CUDA runtime headers: pip install 'nvidia-cuda-runtime-cu12' for "
            "CUDA 12 or 'nvidia-cuda-runtime>=13' for CUDA 13 (parts of the [cuda12] and "
            "[cuda13] extras), or set CUDA_PATH to a CUDA toolkit"
        )
    return (*NVRTC_OPTIONS, f"-I{include}")


def get_module(source: str = "fused_resize.cu") -> Any:
    """The ``cupy.RawModule`` for ``kernels/<source>`` on the current CuPy device."""
    cupy = require("cupy", "the fused CUDA kernels")
    with _lock:
        return _module_locked(cupy, int(cupy.cuda.Device().id), source)


def get_kernel(name: str, source: str = "fused_resize.cu") -> Any:
    """The ``cupy.RawKernel`` ``name`` from ``kernels/<source>`` on the current device.

    The first call per device compiles the module (NVRTC, a second or so); holding the
    lock meanwhile keeps two worker threads from compiling the same thing twice.
    """
    cupy = require("cupy", "the fused CUDA kernels")
    device = int(cupy.cuda.Device().id)
    with _lock:
        function = _functions.get((device, source, name))
        if function is None:
            function = _module_locked(cupy, device, source).get_function(name)
            _functions[(device, source, name)] = function
        return function


def clear_cache() -> None:
    """Forget every built module and kernel (tests; or after a device reset)."""
    with _lock:
        _modules.clear()
        _functions.clear()


def _module_locked(cupy: Any, device: int, source: str) -> Any:
    if source not in KERNEL_SOURCES:
        raise ValueError(f"unknown kernel source {source!r}; known: {list(KERNEL_SOURCES)}")
    module = _modules.get((device, source))
    if module is None:
        module = cupy.RawModule(code=read_kernel(source), options=nvrtc_options())
        _modules[(device, source)] = module
    return module
