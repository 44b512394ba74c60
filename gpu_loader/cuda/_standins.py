"""CPU stand-ins for the batch-decode and kernel-launch ports (the runtime's is in ``_standin_device``).

- :class:`StandinDecoder` is nvImageCodec ITSELF, on its CPU backend: the real batch
  call, its None results and the stage's fallback all run in the CPU suite. Like a GPU
  decoder it may read the input bytes until its stream passes the decode: it enqueues
  an op that re-checks each blob's CRC, so bytes released (and poisoned, or refilled)
  before the stage waited for the decode are reported as a violation.
- :class:`StandinKernelLauncher` plans exactly as the CUDA launcher does and enqueues
  the emulated kernel (``kernels/*.cu`` compiled for the host) on the stream, declaring
  what it reads and writes.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_loader.cuda._gpu_stage import GpuPorts
from gpu_loader.cuda._launch import ImageRef, OutputDtype, plan_fused
from gpu_loader.cuda._nvimgcodec import NvImageCodecDecoder, as_device_image
from gpu_loader.cuda._ports import DeviceImage
from gpu_loader.cuda._standin_device import StandinRuntime, StandinStream


class StandinDecoder:
    """The batch-decode port on nvImageCodec's CPU backend, tracked by a stand-in runtime."""

    def __init__(self, runtime: StandinRuntime, *, max_cpu_threads: int = 1) -> None:
        self.runtime = runtime
        self._decoder = NvImageCodecDecoder(device_id=None, max_cpu_threads=max_cpu_threads)
        self.calls = 0
        self.sizes: list[int] = []

    def decode(
        self, blobs: Sequence[memoryview], stream: StandinStream, exif_orientation: bool = True
    ) -> list[DeviceImage | None]:
        self.calls += 1
        self.sizes.append(len(blobs))
        images = self._decoder.decode_images(blobs, stream, exif_orientation)
        out: list[DeviceImage | None] = []
        arrays: list[np.ndarray] = []
        for image in images:
            wrapped = None if image is None else as_device_image(image)
            if wrapped is not None:
                array = np.asarray(image)  # keeps the nvImageCodec buffer alive
                self.runtime.register_external(array, wrapped)
                arrays.append(array)
            out.append(wrapped)
        crcs = [zlib.crc32(b) for b in blobs]
        runtime = self.runtime

        def consumed() -> None:
            for i, (blob, crc) in enumerate(zip(blobs, crcs, strict=True)):
                if zlib.crc32(blob) != crc:
                    runtime.violations.append(
                        f"bitstream {i} of a decode batch changed before {stream.name} consumed "
                        "it (its arena slice was released too early)"
                    )

        runtime.enqueue(stream, consumed, writes=arrays)
        return out


class StandinKernelLauncher:
    """The kernel-launch port on the CPU: the emulated fused kernel, deferred on the stream."""

    def __init__(self) -> None:
        self.launches = 0

    def launch(
        self,
        images: Sequence[ImageRef],
        boxes: npt.ArrayLike,
        flips: npt.ArrayLike,
        out_ptr: int,
        out_h: int,
        out_w: int,
        mean: Sequence[float],
        std: Sequence[float],
        dtype: OutputDtype,
        stream: Any,
        interpolation: str = "bilinear",
    ) -> None:
        from gpu_loader.cuda._emulation import run_plan

        if not isinstance(stream, StandinStream):
            raise TypeError(f"the stand-in launcher needs a StandinStream, got {stream!r}")
        # Planned (and validated) at enqueue time, as the CUDA launcher does.
        plan = plan_fused(images, boxes, flips, out_h, out_w, mean, std, dtype, interpolation)
        if plan.batch_size == 0:
            return
        self.launches += 1
        stream.runtime.enqueue(
            stream,
            lambda: run_plan(plan, out_ptr),
            reads=[ref[0] for ref in images],
            writes=[out_ptr],
        )


def standin_ports(runtime: StandinRuntime | None = None, *, max_cpu_threads: int = 1) -> GpuPorts:
    """The three CPU stand-ins wired together (one runtime shared by decoder and launcher)."""
    rt = runtime or StandinRuntime()
    return GpuPorts(
        runtime=rt,
        launcher=StandinKernelLauncher(),
        make_decoder=lambda: StandinDecoder(rt, max_cpu_threads=max_cpu_threads),
    )
