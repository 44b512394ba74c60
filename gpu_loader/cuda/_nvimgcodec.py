"""The batch-decode port on nvImageCodec: one ``nvimgcodec.Decoder`` per worker thread.

On a GPU the decoder uses the hardware JPEG engine and the CUDA backend only
(``HW_GPU_ONLY``, ``GPU_ONLY``) and decodes the whole batch on the worker's stream;
images those backends cannot handle come back as None and the stage decodes them on
the CPU. On a machine without a GPU the same class runs nvImageCodec's CPU backend:
that needs BOTH ``device_id=NVIMGCODEC_DEVICE_CPU_ONLY`` and a ``CPU_ONLY`` backend
(either alone fails for lack of a driver), and it is what the CPU suite runs.

Seen on an H100 with nvImageCodec 0.9 (CUDA 13): ``GPU_ONLY`` alone could not be created
(``Could not create decoder. Code: 7``) with any thread count, ``HW_GPU_ONLY`` alone
decoded 4,100 images/s from one thread, and the pair with 8 CPU threads 7,400.

``CodeStream(np.frombuffer(blob))`` does not copy: nvImageCodec reads the arena slice
itself, so the caller keeps the slice until the stream has passed the decode.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np

from gpu_loader._optional import require
from gpu_loader.cuda._ports import DeviceImage

DecodeBackend = Literal["hw_gpu", "gpu", "hybrid", "cpu"]
GPU_BACKENDS: tuple[DecodeBackend, ...] = ("hw_gpu", "gpu")
DECODER_THREADS = 4
"""Default CPU threads of each GPU decoder (nvImageCodec's ``max_num_cpu_threads``, whose
own default, 0, means one per core: too many once every worker has a decoder)."""
_KINDS = {"hw_gpu": "HW_GPU_ONLY", "gpu": "GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "cpu": "CPU_ONLY"}


class NvImageCodecDecoder:
    """Decodes lists of encoded images to HWC uint8 RGB, EXIF orientation applied (unless
    a call asks for the pixels as stored).

    ``device_id=None`` selects nvImageCodec's CPU-only mode (and the CPU backend);
    otherwise ``backends`` picks among hardware, CUDA and hybrid decoding. Not
    thread-safe: make one per worker thread.
    """

    def __init__(
        self,
        *,
        device_id: int | None = 0,
        backends: Sequence[DecodeBackend] = GPU_BACKENDS,
        max_cpu_threads: int = DECODER_THREADS,
    ) -> None:
        nvimgcodec = import_quietly()
        if (version := getattr(nvimgcodec, "__version__", None)) is not None:
            check_version(str(version))
        if device_id is None:
            backends = ("cpu",)
        unknown = [b for b in backends if b not in _KINDS]
        if not backends or unknown:
            raise ValueError(
                f"`backends` must be a non-empty subset of {list(_KINDS)}, got {backends!r}"
            )
        kinds = [nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, _KINDS[b])) for b in backends]
        device = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY if device_id is None else device_id
        self.on_host = device_id is None
        self._nvimgcodec = nvimgcodec
        self._decoder = nvimgcodec.Decoder(
            device_id=device, max_num_cpu_threads=max_cpu_threads, backends=kinds
        )
        # sRGB, interleaved RGB (grey is replicated), EXIF orientation applied or not (as
        # the transform asks): the CPU path's conventions, so crop boxes drawn on
        # probe_size(exif=...) fit the decoded image.
        self._params = {
            upright: nvimgcodec.DecodeParams(
                apply_exif_orientation=upright,
                color_spec=nvimgcodec.ColorSpec.SRGB,
                sample_format=nvimgcodec.SampleFormat.I_RGB,
            )
            for upright in (True, False)
        }

    def decode_images(
        self, blobs: Sequence[memoryview], stream: Any, exif_orientation: bool = True
    ) -> list[Any]:
        """nvImageCodec ``Image`` objects (None where decoding failed), in blob order."""
        if not blobs:
            return []
        code_streams = [self._nvimgcodec.CodeStream(np.frombuffer(b, np.uint8)) for b in blobs]
        images = self._decoder.decode(
            code_streams,
            params=self._params[bool(exif_orientation)],
            cuda_stream=stream_handle(stream),
        )
        return list(images)

    def decode(
        self, blobs: Sequence[memoryview], stream: Any, exif_orientation: bool = True
    ) -> list[DeviceImage | None]:
        images = self.decode_images(blobs, stream, exif_orientation)
        return [None if im is None else as_device_image(im) for im in images]


VERBOSITY_ENV = "PYNVIMGCODEC_VERBOSITY"


def import_quietly() -> ModuleType:
    """``nvidia.nvimgcodec``, imported with its log off unless the user set its level.

    nvImageCodec writes a coloured ``[ERROR]``/``[WARNING]`` line to stderr for every file
    it cannot parse or decode, two lines per bad file, and reads its level
    (``PYNVIMGCODEC_VERBOSITY``) once, at import. Each such file is decoded again on the
    CPU here, and one that fails there too is reported with its key and the CPU decoder's
    error, so those lines only repeat it. The variable is set for the import alone and
    removed again, so the process environment (and its children) keep what they had;
    a level the user set, ``PYNVIMGCODEC_VERBOSITY=1`` to see the lines, is kept.
    """
    if "nvidia.nvimgcodec" in sys.modules or VERBOSITY_ENV in os.environ:
        return require("nvidia.nvimgcodec", "GPU batch decode")
    os.environ[VERBOSITY_ENV] = "0"
    try:
        return require("nvidia.nvimgcodec", "GPU batch decode")
    finally:
        os.environ.pop(VERBOSITY_ENV, None)


MIN_VERSION = (0, 9)
"""nvImageCodec's first version with what the decoder uses: ``DecodeParams(sample_format=)``
and ``NVIMGCODEC_DEVICE_CPU_ONLY`` (QA, against the real 0.7 and 0.8 wheels: a TypeError
at the first decoder, so every GPU-path epoch failed)."""


def check_version(version: str) -> None:
    """Refuse an nvImageCodec older than `MIN_VERSION`, saying what to install."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]]
    if tuple(parts + [0] * (2 - len(parts))) < MIN_VERSION:
        from gpu_loader._optional import _PROVIDERS

        _, cuda12, cuda13 = _PROVIDERS["nvidia.nvimgcodec"]
        raise ImportError(
            f"nvImageCodec {version} is too old for the GPU path: it needs "
            f"{'.'.join(map(str, MIN_VERSION))} or newer (pip install -U {cuda12}, or "
            f"{cuda13} for CUDA 13)"
        )


def stream_handle(stream: Any) -> int:
    """The ``cudaStream_t`` of a torch or CuPy stream as an int (0: the legacy default)."""
    if stream is None:
        return 0
    handle: Any = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = getattr(stream, "ptr", 0)
    return int(handle)


def as_device_image(image: Any) -> DeviceImage | None:
    """Wrap an nvImageCodec ``Image`` (device or host buffer); None if it is not HWC RGB uint8."""
    on_device = "DEVICE" in str(image.buffer_kind)  # STRIDED_DEVICE vs STRIDED_HOST
    iface = image.__cuda_array_interface__ if on_device else image.__array_interface__
    shape = tuple(iface["shape"])
    if len(shape) != 3 or shape[2] != 3 or np.dtype(iface["typestr"]) != np.uint8:
        return None
    # The image's own strides: nvImageCodec leaves the interface's None for interleaved
    # images (packed rows today; a padded row pitch would otherwise be read as 3 * width).
    strides = getattr(image, "strides", None) or iface.get("strides")
    pitch = int(strides[0]) if strides else 3 * int(shape[1])
    return DeviceImage(int(iface["data"][0]), int(shape[0]), int(shape[1]), pitch, owner=image)
