"""Everything that touches a GPU. Importing this package touches no device and needs no GPU package.

See README.md in this folder: the pinned arena, the three ports (batch decode, kernel
launch, device runtime) with their CUDA implementations and CPU stand-ins, and the GPU
batch stage with its consumer-side hand-off.
"""

from gpu_loader.cuda._arena import (
    ArenaFullError,
    ArenaStats,
    ArenaTooSmallError,
    PinnedArena,
    Slice,
)
from gpu_loader.cuda._device import cuda_available
from gpu_loader.cuda._device_cuda import CudaKernelLauncher, CudaRuntime, cuda_ports
from gpu_loader.cuda._gpu_stage import (
    FetchedSample,
    GpuBatch,
    GpuBatchStage,
    GpuFetcher,
    GpuPorts,
    WorkerPool,
    WorkerState,
    handoff,
)
from gpu_loader.cuda._nvimgcodec import NvImageCodecDecoder
from gpu_loader.cuda._ports import BatchDecoder, DeviceImage, DeviceRuntime, Event, KernelLauncher
from gpu_loader.cuda._standin_device import StandinEvent, StandinRuntime, StandinStream
from gpu_loader.cuda._standins import StandinDecoder, StandinKernelLauncher, standin_ports

__all__ = [
    "ArenaFullError",
    "ArenaStats",
    "ArenaTooSmallError",
    "BatchDecoder",
    "CudaKernelLauncher",
    "CudaRuntime",
    "DeviceImage",
    "DeviceRuntime",
    "Event",
    "FetchedSample",
    "GpuBatch",
    "GpuBatchStage",
    "GpuFetcher",
    "GpuPorts",
    "KernelLauncher",
    "NvImageCodecDecoder",
    "PinnedArena",
    "Slice",
    "StandinDecoder",
    "StandinEvent",
    "StandinKernelLauncher",
    "StandinRuntime",
    "StandinStream",
    "WorkerPool",
    "WorkerState",
    "cuda_available",
    "cuda_ports",
    "handoff",
    "standin_ports",
]
