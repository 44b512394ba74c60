"""The CUDA implementations of the device-runtime and kernel-launch ports (torch + CuPy).

Written against torch's documented CUDA semantics: ``torch.cuda.Stream``, ``Event``,
allocation under ``torch.cuda.stream(s)`` (the caching allocator ties the block to
``s``), ``current_stream().wait_event`` and ``Tensor.record_stream``. No machine these
were written on has a GPU: ``tests/gpu/`` runs them where one exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from gpu_loader._optional import require
from gpu_loader.cuda._device import cuda_available
from gpu_loader.cuda._gpu_stage import GpuPorts
from gpu_loader.cuda._launch import ImageRef, OutputDtype
from gpu_loader.cuda._nvimgcodec import (
    DECODER_THREADS,
    GPU_BACKENDS,
    DecodeBackend,
    NvImageCodecDecoder,
)
from gpu_loader.cuda._ports import DeviceImage, Event

if TYPE_CHECKING:
    import torch


class CudaRuntime:
    """Streams, events and memory on one CUDA device, through torch."""

    def __init__(self, device: str | int | torch.device = "cuda") -> None:
        require("torch", "the CUDA runtime port")
        import torch

        resolved = (
            torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        )
        if resolved.type != "cuda":
            raise ValueError(f"`device` must be a CUDA device ('cuda', 'cuda:N'), got {device!r}")
        if not cuda_available():  # torch's own error here is a bare AssertionError
            raise RuntimeError(
                f"the CUDA ports need a CUDA device that torch can use; torch "
                f"{torch.__version__} sees none (a CPU build, no driver, or no device). "
                "gpu_loader.cuda.standin_ports() runs the GPU path's orchestration on the CPU"
            )
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        self._device = resolved

    @property
    def device(self) -> torch.device:
        return self._device

    def new_stream(self) -> torch.cuda.Stream:
        import torch

        return torch.cuda.Stream(device=self._device)  # type: ignore[no-untyped-call]

    def record_event(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        import torch

        # Blocking: a host thread that synchronizes on it sleeps until the stream passes
        # it; the default spins a CPU core for the whole decode + kernel (QA, from CUDA's
        # cudaEventBlockingSync), which the fetch threads beside it need.
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def empty_output(
        self, shape: tuple[int, ...], dtype: OutputDtype, stream: torch.cuda.Stream
    ) -> torch.Tensor:
        import torch

        with torch.cuda.stream(stream):  # the block belongs to the worker's stream
            return torch.empty(shape, dtype=getattr(torch, dtype), device=self._device)

    def upload_image(self, array: np.ndarray, stream: torch.cuda.Stream) -> DeviceImage:
        import torch

        host = np.ascontiguousarray(array, dtype=np.uint8)
        with torch.cuda.stream(stream):
            image = _upload(torch.from_numpy(host), self._device)
        h, w = int(host.shape[0]), int(host.shape[1])
        return DeviceImage(int(image.data_ptr()), h, w, 3 * w, owner=image)

    def upload_labels(self, labels: np.ndarray, stream: torch.cuda.Stream) -> torch.Tensor:
        import torch

        host = np.ascontiguousarray(labels, dtype=np.int64)
        with torch.cuda.stream(stream):
            return _upload(torch.from_numpy(host), self._device)

    def handoff(self, tensors: Sequence[torch.Tensor], event: Event) -> None:
        import torch

        current = torch.cuda.current_stream(self._device)
        current.wait_event(event)  # type: ignore[arg-type]
        for tensor in tensors:
            tensor.record_stream(current)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        # .numpy() shares the page-locked memory and keeps the tensor alive as its base.
        import torch

        pinned = torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=True)
        return pinned.numpy()


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An asynchronous host-to-device copy on the current stream.

    A copy from pageable memory makes CUDA wait for the stream's earlier work (the batch
    decode) before it starts; staging through torch's caching pinned allocator does not,
    and that allocator keeps the pinned block until the copy's stream has passed it.
    Memory that is already page-locked (the arena) is copied from directly: the caller
    keeps it until the stream has passed the copy.
    """
    staged = host if host.is_pinned() else host.pin_memory()
    return staged.to(device, non_blocking=True)


class CudaKernelLauncher:
    """The kernel-launch port: ``gpu_loader.cuda._fused.launch_fused`` on ``device``'s CuPy device."""

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index

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
        from gpu_loader.cuda._fused import launch_fused

        cupy = require("cupy", "the fused CUDA kernels")
        with cupy.cuda.Device(self.device_index):
            launch_fused(
                images, boxes, flips, out_ptr, out_h, out_w, mean, std, dtype, stream,
                interpolation,
            )  # fmt: skip


def cuda_ports(
    device: str | int | torch.device = "cuda",
    *,
    backends: Sequence[DecodeBackend] = GPU_BACKENDS,
    decoder_threads: int = DECODER_THREADS,
) -> GpuPorts:
    """The CUDA implementations wired together for one device.

    ``decoder_threads`` is the size of each decoder's nvImageCodec CPU thread pool (its
    ``max_num_cpu_threads``; 0 means one per core). Each worker has its own decoder, so
    the default stays small: on a 16-core H100 machine one decoder took 15 ms per
    64-image batch with 0 and 10 ms with 8, and two decoders of 4 threads decoded 8,700
    images/s together.
    """
    runtime = CudaRuntime(device)
    index = int(runtime.device.index or 0)
    return GpuPorts(
        runtime=runtime,
        launcher=CudaKernelLauncher(index),
        make_decoder=lambda: NvImageCodecDecoder(
            device_id=index, backends=backends, max_cpu_threads=decoder_threads
        ),
    )
