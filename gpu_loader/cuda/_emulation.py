"""Run ``kernels/*.cu`` on the CPU: host C++ compiler + ``kernels/cuda_emulation.h`` + ctypes.

The kernels compile with ``g++ -DGPU_LOADER_EMULATION`` into a shared library, cached in
the package's cache folder (`gpu_loader._resources.cache_root`, under ``emulation/``) under a name
keyed by the hash of the sources and the compiler command, so an edited kernel is
rebuilt and an unchanged one is not. :func:`launch_fused_emulated` has the CUDA
launcher's signature and shares its planning (:func:`gpu_loader.cuda._launch.plan_fused`),
so the tests exercise the same packing, grid and block the GPU gets.

Used by the tests, and usable as the CPU stand-in for the kernel-launch port.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpu_loader._resources import cache_root, read_kernel
from gpu_loader.cuda._launch import SAMPLE_DTYPE, FusedPlan, ImageRef, OutputDtype, plan_fused

EMULATION_HEADER = "cuda_emulation.h"
CXX_FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "-O2",
    "-shared",
    "-fPIC",
    "-DGPU_LOADER_EMULATION",
    "-x",
    "c++",
)

_build_lock = threading.Lock()


def compiler() -> str:
    """The host C++ compiler: ``$CXX``, else g++, else c++ (clang works too)."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise FileNotFoundError(
        "the CPU emulation of the CUDA kernels needs a C++ compiler and none was found; "
        "install one (apt-get install g++) or set CXX"
    )


def cache_dir() -> Path:
    """Where built emulation libraries are kept."""
    return cache_root() / "emulation"


@functools.cache
def load_library(source: str = "fused_resize.cu") -> ctypes.CDLL:
    """Build (or reuse) and load the emulation library of ``kernels/<source>``."""
    kernel = read_kernel(source)
    header = read_kernel(EMULATION_HEADER)
    cxx = compiler()
    digest = hashlib.sha256(
        "\0".join((kernel, header, cxx, *CXX_FLAGS)).encode("utf-8")
    ).hexdigest()[:20]
    target = cache_dir() / f"{Path(source).stem}-{digest}.so"
    with _build_lock:
        if not target.is_file():
            _build(kernel, header, source, cxx, target)
    return ctypes.CDLL(str(target))


def _build(kernel: str, header: str, source: str, cxx: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_loader-emu-") as tmp:
        work = Path(tmp)
        (work / source).write_text(kernel, encoding="utf-8")
        (work / EMULATION_HEADER).write_text(header, encoding="utf-8")
        built = work / "kernel.so"
        cmd = [cxx, *CXX_FLAGS, f"-I{work}", str(work / source), "-o", str(built)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(
                f"building the CPU emulation of kernels/{source} failed "
                f"({' '.join(cmd)}):\n{result.stderr}"
            )
        # Rename is atomic: a concurrent process sees the old state or the whole library.
        staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(built, staged)
        os.replace(staged, target)


def sample_layout() -> dict[str, int]:
    """``sizeof`` and field offsets of the compiled ``struct FusedSample``."""
    names = ("itemsize", *(SAMPLE_DTYPE.names or ()))
    out = (ctypes.c_longlong * len(names))()
    load_library().emulated_fused_sample_layout(out)
    return dict(zip(names, (int(v) for v in out), strict=True))


def convert(
    values: npt.ArrayLike,
) -> tuple[npt.NDArray[np.uint16], npt.NDArray[np.uint16], npt.NDArray[np.int32]]:
    """The kernels' float -> (half bits, bfloat16 bits, round-half-even int) conversions."""
    x = np.ascontiguousarray(values, dtype=np.float32).ravel()
    half = np.empty(x.shape, dtype=np.uint16)
    bf16 = np.empty(x.shape, dtype=np.uint16)
    rint = np.empty(x.shape, dtype=np.int32)
    load_library().emulated_convert(
        ctypes.c_void_p(x.ctypes.data),
        ctypes.c_longlong(x.size),
        ctypes.c_void_p(half.ctypes.data),
        ctypes.c_void_p(bf16.ctypes.data),
        ctypes.c_void_p(rint.ctypes.data),
    )
    return half, bf16, rint


def run_plan(plan: FusedPlan, out_ptr: int) -> None:
    """Run one planned launch on the CPU, writing to host memory at ``out_ptr``."""
    if plan.batch_size == 0:
        return
    samples = np.ascontiguousarray(plan.samples)
    fn = getattr(load_library(), f"emulated_{plan.kernel_name}")
    c_float = ctypes.c_float
    fn(
        *(ctypes.c_uint(v) for v in (*plan.grid, *plan.block)),
        ctypes.c_void_p(samples.ctypes.data),
        ctypes.c_int(plan.out_h),
        ctypes.c_int(plan.out_w),
        *(c_float(v) for v in plan.scale),
        *(c_float(v) for v in plan.shift),
        ctypes.c_void_p(out_ptr),
    )


def launch_fused_emulated(
    images: Sequence[ImageRef],
    boxes: npt.ArrayLike,
    flips: npt.ArrayLike,
    out_ptr: int,
    out_h: int,
    out_w: int,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: OutputDtype,
    stream: object = None,
    interpolation: str = "bilinear",
) -> None:
    """The CPU twin of ``launch_fused``: same arguments, host pointers instead of device ones.

    ``images`` are (pointer, height, width, row pitch in bytes) of HWC uint8 RGB pixels;
    ``out_ptr`` addresses a C-contiguous ``[N, 3, out_h, out_w]`` buffer of ``dtype``
    (bfloat16 as its 16-bit pattern). ``stream`` is ignored: the call is synchronous.
    ``interpolation`` is "bilinear" or "bicubic" (Pillow's filters, antialiased).
    The caller keeps the buffers alive for the call.
    """
    del stream  # synchronous: nothing to order against
    plan = plan_fused(images, boxes, flips, out_h, out_w, mean, std, dtype, interpolation)
    run_plan(plan, out_ptr)
