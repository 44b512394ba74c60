"""The three narrow ports the GPU batch stage talks to, and the values they exchange.

Each port has a CUDA implementation (``_device_cuda.py``, ``_nvimgcodec.py``) and a CPU
stand-in (``_standins.py``), so the orchestration in ``_gpu_stage.py`` runs unchanged in
the CPU test suite. Nothing here imports torch, CuPy or nvImageCodec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpu_loader.cuda._launch import ImageRef, OutputDtype

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch


@dataclass(frozen=True, eq=False)
class DeviceImage:
    """A decoded HWC uint8 RGB image in device memory (host memory for the stand-ins).

    ``owner`` keeps the memory alive (an nvImageCodec ``Image``, a torch tensor): drop
    the DeviceImage only after every kernel that reads ``ptr`` has finished.
    """

    ptr: int
    """Address of pixel (0, 0)."""
    height: int
    """Rows."""
    width: int
    """Columns."""
    pitch: int
    """Bytes from one row to the next (>= 3 * width)."""
    owner: object = field(repr=False)
    """The object that owns the memory."""

    def __post_init__(self) -> None:
        if self.ptr <= 0 or self.height < 1 or self.width < 1 or self.pitch < 3 * self.width:
            raise ValueError(
                f"not a valid HWC uint8 RGB image: ptr={self.ptr:#x}, {self.height}x{self.width},"
                f" pitch {self.pitch} bytes (must be >= {3 * self.width})"
            )

    @property
    def ref(self) -> ImageRef:
        """(pointer, height, width, pitch): what the kernel launcher takes."""
        return (self.ptr, self.height, self.width, self.pitch)


@runtime_checkable
class Event(Protocol):
    """A point in a stream's work (``torch.cuda.Event`` has this shape)."""

    def query(self) -> bool:
        """True once all work before the event has finished."""
        ...

    def synchronize(self) -> None:
        """Block the calling host thread until the event has fired."""
        ...


@runtime_checkable
class BatchDecoder(Protocol):
    """Decodes a batch of encoded images on ``stream``. One instance per worker thread."""

    def decode(
        self, blobs: Sequence[memoryview], stream: Any, exif_orientation: bool = True
    ) -> list[DeviceImage | None]:
        """One entry per blob, None where the image could not be decoded (never raises per image).

        Images are turned upright by their EXIF orientation, unless ``exif_orientation`` is
        False (pixels as stored, the transforms' ``exif_orientation=False``). The stage
        passes it by keyword, and only when False: a decoder written without the
        parameter still serves every transform that keeps the default (with a decoder
        class as `GpuPorts.make_decoder`, a transform that needs it is refused when its
        epoch starts).

        The decoder may read ``blobs`` until ``stream`` has passed the decode: the caller
        records an event after this call and keeps the bytes until it has fired.
        """
        ...


@runtime_checkable
class KernelLauncher(Protocol):
    """Enqueues the fused crop/resize/flip/normalise/cast kernel for a batch on ``stream``."""

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
        """``interpolation`` is "bilinear" or "bicubic"; the stage passes it by keyword,
        and only when not "bilinear": a launcher written without the parameter still
        serves every transform that keeps the default, and a transform that needs it is
        refused when its epoch starts."""
        ...


@runtime_checkable
class DeviceRuntime(Protocol):
    """Streams, events and memory on one device (torch's CUDA runtime, or the stand-in)."""

    @property
    def device(self) -> torch.device:
        """Where outputs live."""
        ...

    def new_stream(self) -> Any:
        """A new stream for one worker thread (``torch.cuda.Stream`` on CUDA)."""
        ...

    def record_event(self, stream: Any) -> Event:
        """An event recorded on ``stream`` after the work enqueued so far."""
        ...

    def empty_output(self, shape: tuple[int, ...], dtype: OutputDtype, stream: Any) -> torch.Tensor:
        """An uninitialised tensor from torch's caching allocator, allocated for ``stream``."""
        ...

    def upload_image(self, array: np.ndarray, stream: Any) -> DeviceImage:
        """Copy a host HWC uint8 RGB image to the device on ``stream`` (CPU-decoded fallbacks)."""
        ...

    def upload_labels(self, labels: np.ndarray, stream: Any) -> torch.Tensor:
        """Copy int64 labels to the device on ``stream``."""
        ...

    def handoff(self, tensors: Sequence[torch.Tensor], event: Event) -> None:
        """Consumer side: the current stream waits on ``event``; each tensor is
        ``record_stream``-ed on it so the allocator cannot reuse its memory too early."""
        ...

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        """A flat uint8 host buffer, page-locked on CUDA (the arena's backing store)."""
        ...
