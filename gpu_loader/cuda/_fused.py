"""The CUDA launcher of the fused kernel (the GPU side of the kernel-launch port).

Same signature as :func:`gpu_loader.cuda._emulation.launch_fused_emulated`; both plan
with :func:`gpu_loader.cuda._launch.plan_fused`. Written against CuPy's documented
API (``RawModule.get_function``, ``RawKernel(grid, block, args)`` on the current
stream); it cannot run on the CI machines, which have no GPU: the tests in
``tests/gpu/`` run it where one exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_loader._optional import require
from gpu_loader.cuda._kernels import get_kernel
from gpu_loader.cuda._launch import FusedPlan, ImageRef, OutputDtype, plan_fused


def launch_fused(
    images: Sequence[ImageRef],
    boxes: npt.ArrayLike,
    flips: npt.ArrayLike,
    out_ptr: int,
    out_h: int,
    out_w: int,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: OutputDtype,
    stream: Any = None,
    interpolation: str = "bilinear",
) -> None:
    """Enqueue one fused crop/resize/flip/normalise/cast launch for a whole batch.

    ``images`` are (device pointer, height, width, row pitch in bytes) of HWC uint8 RGB
    pixels; ``out_ptr`` is a device pointer to a C-contiguous ``[N, 3, out_h, out_w]``
    buffer of ``dtype``. ``stream`` is a ``cupy.cuda.Stream`` (or anything with a
    ``ptr``, wrapped as an external stream); None uses CuPy's current stream.
    ``interpolation`` is "bilinear" or "bicubic" (Pillow's filters, antialiased). The call
    returns once the work is enqueued: the caller records an event on ``stream`` and
    keeps the source and output buffers alive until it has fired.
    """
    plan = plan_fused(images, boxes, flips, out_h, out_w, mean, std, dtype, interpolation)
    if plan.batch_size == 0:
        return
    cupy = require("cupy", "the fused CUDA kernels")
    with _as_cupy_stream(cupy, stream):
        _enqueue(cupy, plan, out_ptr)


def _enqueue(cupy: Any, plan: FusedPlan, out_ptr: int) -> None:
    kernel = get_kernel(plan.kernel_name)
    # One host-to-device copy of all records, ordered on the current stream before the
    # kernel. CuPy's pool is stream-ordered, so freeing `records` when it goes out of
    # scope cannot hand its memory to other work on this stream before the kernel ran.
    records = cupy.asarray(np.ascontiguousarray(plan.samples).view(np.uint8))
    f32 = np.float32
    args = (
        records,
        np.int32(plan.out_h),
        np.int32(plan.out_w),
        *(f32(v) for v in plan.scale),
        *(f32(v) for v in plan.shift),
        np.uint64(out_ptr),  # a raw pointer goes as an 8-byte value: same ABI as T*
    )
    kernel(plan.grid, plan.block, args)


def _as_cupy_stream(cupy: Any, stream: Any) -> Any:
    """A context manager making ``stream`` current (a no-op context for None)."""
    if stream is None:
        return cupy.cuda.get_current_stream()
    cupy_streams = (cupy.cuda.Stream, getattr(cupy.cuda, "ExternalStream", cupy.cuda.Stream))
    if isinstance(stream, cupy_streams):
        return stream
    # torch.cuda.Stream has `cuda_stream`, other wrappers `ptr`; 0 (the legacy default
    # stream) is a valid handle, so test for presence, not truthiness.
    ptr = getattr(stream, "cuda_stream", getattr(stream, "ptr", None))
    if not isinstance(ptr, int):
        raise TypeError(
            f"`stream` must be a cupy.cuda.Stream, a torch.cuda.Stream or None, got {stream!r}"
        )
    # CuPy 14 deprecates ExternalStream (a DeprecationWarning per call) for
    # Stream.from_external, which takes an object speaking the CUDA stream protocol.
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is None:
        return cupy.cuda.ExternalStream(int(ptr))
    return from_external(_StreamHandle(int(ptr)))


class _StreamHandle:
    """A raw ``cudaStream_t`` speaking the CUDA stream protocol (``__cuda_stream__``)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)
