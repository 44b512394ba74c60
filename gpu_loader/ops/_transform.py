"""Crop box -> antialiased bilinear resize -> flip -> normalize -> CHW -> cast, into `out`.

With the native backend (``cpu_backend() == "native"``) all of it is one C call
(``_native.resize_into``: separable float resize with Pillow's weights, normalise and cast
fused into the slot, GIL released). Otherwise, the Pillow path below: the resize is
Pillow's own `Image.resize(BILINEAR, box=...)` (the reference semantics, in C, GIL
released). Decoded JPEGs arrive as RGBX buffers, which Pillow maps without a copy. The
flip is a negative-stride view, and normalize + CHW + cast are two fused numpy passes straight
into the caller's slot, so the only full-size buffer is the decoded image itself.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_loader.ops._backend import native_module
from gpu_loader.ops._decode import DecodedImage
from gpu_loader.ops._transforms import OUTPUT_DTYPES, CropParams, Interpolation, OutputDtype

if TYPE_CHECKING:
    from collections.abc import Sequence

# The numpy dtypes `out` may have for each output dtype (bfloat16: raw bit patterns).
_OUT_DTYPES: dict[str, tuple[np.dtype, ...]] = {
    "float32": (np.dtype(np.float32),),
    "float16": (np.dtype(np.float16),),
    "bfloat16": (np.dtype(np.int16), np.dtype(np.uint16)),
    "uint8": (np.dtype(np.uint8),),
}
_BOX_TOLERANCE = 1e-3  # pixels of float overshoot accepted (and clamped) at the image edge


def transform_into(
    image: DecodedImage | np.ndarray,
    params: CropParams,
    out: np.ndarray,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: OutputDtype,
    interpolation: Interpolation = "bilinear",
) -> None:
    """Resize ``params``' box of ``image`` to ``out.shape[1:]`` and write it normalised into ``out``.

    ``params`` is in ``image``'s own pixel coordinates (scale it first for a reduced decode).
    ``interpolation``: the filter ("bilinear" or "bicubic", antialiased as Pillow's).
    ``out`` is ``[3, H, W]``: float32 / float16 for those dtypes, uint8 for "uint8" (no
    normalisation), int16 or uint16 receiving bfloat16 bit patterns for "bfloat16".
    """
    _check_out(out, dtype)
    native = native_module()
    if native is not None and out.flags.c_contiguous:
        src = _native_source(image)
        height, width, channels = src.shape
        clamp_box(params, height, width)  # the same error as the Pillow path for a bad box
        native.resize_into(
            src,
            height,
            width,
            channels,
            *native_target(params, out, dtype, mean, std, interpolation),
        )
        return
    resized = resize_box(image, params, (int(out.shape[1]), int(out.shape[2])), interpolation)
    if out.flags.c_contiguous:
        _normalize_planes(resized, params.flip, out, mean, std, dtype)
        return
    rgb = resized[:, ::-1, :3] if params.flip else resized[:, :, :3]
    chw = rgb.transpose(2, 0, 1)  # a view: the copy happens in the fused pass below
    normalize_uint8_into(chw, out, mean=mean, std=std, dtype=dtype)


def normalize_uint8_into(
    chw: np.ndarray,
    out: np.ndarray,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: str,
) -> None:
    """``[3, H, W]`` uint8 pixels (any strides) normalised ``(x / 255 - mean) / std`` and
    cast into ``out``, as ``x * scale + offset`` in float32: bit for bit the values the
    Pillow path's tables hold (uint8: copied as they are)."""
    if dtype == "uint8":
        np.copyto(out, chw)
        return
    scale, offset = _affine(tuple(float(m) for m in mean), tuple(float(s) for s in std))
    if dtype == "float32":
        np.multiply(chw, scale, out=out)
        np.add(out, offset, out=out)
        return
    tmp = np.empty(out.shape, np.float32)  # C order (np.multiply would follow chw's HWC order)
    np.multiply(chw, scale, out=tmp)
    tmp += offset
    cast_into(tmp, out, dtype)


def _native_source(image: DecodedImage | np.ndarray) -> np.ndarray:
    """A C-contiguous HWC uint8 buffer with 3 or 4 (RGBX) channels for the native resize."""
    if isinstance(image, DecodedImage):
        if image.rgbx is not None and image.rgbx.flags.c_contiguous:
            return image.rgbx
        image = image.array
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"`image` must be HWC uint8 RGB, got {image.dtype} {image.shape}")
    return np.ascontiguousarray(image)


def native_target(
    params: CropParams,
    out: np.ndarray,
    dtype: str,
    mean: Sequence[float],
    std: Sequence[float],
    interpolation: str = "bilinear",
) -> tuple[Any, ...]:
    """The arguments both native calls end with: box, out, its size, flip, dtype code,
    the (scale, shift) of the normalisation, and the filter code."""
    scale, shift = native_affine(mean, std)
    box = (params.top, params.left, params.height, params.width)
    size = (int(out.shape[1]), int(out.shape[2]))
    filter_code = NATIVE_FILTER_CODES[interpolation]
    return (box, out, *size, params.flip, NATIVE_DTYPE_CODES[dtype], scale, shift, filter_code)


def native_affine(
    mean: Sequence[float], std: Sequence[float]
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """The native stores' (scale, shift) triples: the float32 values of :func:`_affine`."""
    if type(mean) is tuple and type(std) is tuple:  # the transforms' own: floats already
        return _native_affine(mean, std)
    return _native_affine(tuple(float(m) for m in mean), tuple(float(s) for s in std))


@functools.lru_cache(maxsize=64)
def _native_affine(
    mean: tuple[float, ...], std: tuple[float, ...]
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    scale, offset = _affine(mean, std)
    s, o = scale.ravel().tolist(), offset.ravel().tolist()
    return (s[0], s[1], s[2]), (o[0], o[1], o[2])


# The native module's output dtype codes (OUT_F32 ... OUT_U8 in _native.c).
NATIVE_DTYPE_CODES: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2, "uint8": 3}
# Its filter codes (FILTER_BILINEAR, FILTER_BICUBIC).
NATIVE_FILTER_CODES: dict[str, int] = {"bilinear": 0, "bicubic": 1}


def _normalize_planes(
    resized: np.ndarray,
    flip: bool,
    out: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: str,
) -> None:
    """HWC -> CHW, flip and normalize with OpenCV: split into planes, then one table lookup
    per plane straight into ``out[c]``.

    Reading HWC pixels channel by channel with numpy is a strided gather (measured: as slow
    as the resize itself); cv2.split and cv2.LUT are vectorised and release the GIL. The
    table holds ``float32(x * scale + offset)`` computed exactly as the numpy path does, so
    both give bit-identical results.
    """
    import cv2

    planes = cv2.split(resized)
    if dtype == "uint8":
        for c in range(3):
            cv2.flip(planes[c], 1, dst=out[c]) if flip else np.copyto(out[c], planes[c])
        return
    tables = _tables(tuple(float(m) for m in mean), tuple(float(s) for s in std))
    target = out if dtype == "float32" else np.empty(out.shape, np.float32)
    for c in range(3):
        plane = cv2.flip(planes[c], 1) if flip else planes[c]
        cv2.LUT(plane, tables[c], dst=target[c])
    if dtype != "float32":
        cast_into(target, out, dtype)


@functools.lru_cache(maxsize=64)
def _tables(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """Per channel, the 256 normalised float32 values of the uint8 levels."""
    scale, offset = _affine(mean, std)
    levels = np.arange(256, dtype=np.uint8).astype(np.float32)
    tables = []
    for c in range(3):
        table = levels * scale[c, 0, 0] + offset[c, 0, 0]
        table.flags.writeable = False
        tables.append(table.reshape(1, 256))
    return tuple(tables)


# torch runs an elementwise op on one thread below this many elements (at::internal::
# GRAIN_SIZE); chunking keeps the cast off torch's intra-op pool, which would otherwise spin
# up OpenMP teams inside every loader thread.
_TORCH_CHUNK = 32768


def cast_into(values: np.ndarray, out: np.ndarray, dtype: str, *, use_torch: bool = True) -> None:
    """Cast float32 ``values`` into ``out`` as float16 or bfloat16 bits (round to nearest even).

    torch's vectorised casts are ~10x faster than numpy's float16 conversion; numpy is the
    fallback when torch is missing or ``out`` is not contiguous. ``values`` is clobbered.
    """
    torch = _torch() if use_torch else None
    if torch is not None and out.flags.c_contiguous and values.flags.c_contiguous:
        src = torch.from_numpy(values).view(-1)
        if dtype == "float16":
            dst = torch.from_numpy(out).view(-1)
        else:
            dst = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).view(-1)
        for start in range(0, src.numel(), _TORCH_CHUNK):
            dst[start : start + _TORCH_CHUNK].copy_(src[start : start + _TORCH_CHUNK])
    elif dtype == "float16":
        np.copyto(out, values, casting="same_kind")
    else:
        np.copyto(out.view(np.uint16), float32_to_bfloat16_bits(values), casting="unsafe")


@functools.cache
def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint32 holding 16 bits) of float32 ``values``, round to nearest even.

    Overwrites ``values`` (a scratch buffer) to avoid another allocation. Inputs here are
    finite, so the NaN special case of a general converter is not needed.
    """
    bits = values.view(np.uint32)
    lsb = bits >> 16
    lsb &= 1
    bits += 0x7FFF
    bits += lsb
    bits >>= 16
    return bits


@functools.lru_cache(maxsize=64)
def _affine(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale, offset) with ``y = x * scale + offset == (x/255 - mean) / std``."""
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f"`mean` and `std` must be 3 numbers with std > 0, got {mean}, {std}")
    m = np.asarray(mean, np.float64)
    s = np.asarray(std, np.float64)
    scale = (1.0 / (255.0 * s)).astype(np.float32).reshape(3, 1, 1)
    offset = (-m / s).astype(np.float32).reshape(3, 1, 1)
    scale.flags.writeable = False
    offset.flags.writeable = False
    return scale, offset


def _check_out(out: np.ndarray, dtype: str) -> None:
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"`dtype` must be one of {OUTPUT_DTYPES}, got {dtype!r}")
    if not isinstance(out, np.ndarray):
        raise TypeError(
            f"`out` must be a numpy array (e.g. tensor.numpy()), got {type(out).__name__}"
        )
    if out.ndim != 3 or out.shape[0] != 3 or min(out.shape) < 1:
        raise ValueError(f"`out` must have shape [3, H, W] with H, W >= 1, got {out.shape}")
    allowed = _OUT_DTYPES[dtype]
    if out.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise ValueError(f"dtype={dtype!r} needs `out` of dtype {names}, got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("`out` is read-only; pass a writable array")


def clamp_box(params: CropParams, height: int, width: int) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of ``params`` inside a ``height`` x ``width`` image.

    Float round-off at the edge is clamped; a box really outside the image is an error.
    """
    right, bottom = params.right, params.bottom
    if right > width + _BOX_TOLERANCE or bottom > height + _BOX_TOLERANCE:
        raise ValueError(
            f"crop box (top={params.top}, left={params.left}, height={params.height}, "
            f"width={params.width}) exceeds the {height}x{width} image; for a reduced-size "
            "decode pass `image.box(params)`"
        )
    return params.left, params.top, min(right, float(width)), min(bottom, float(height))


def resize_box(
    image: DecodedImage | np.ndarray,
    params: CropParams,
    size: tuple[int, int],
    interpolation: str = "bilinear",
) -> np.ndarray:
    """The box of ``params`` resized to ``size`` = (H, W), unflipped: HWC uint8, 3 or 4 channels."""
    from PIL import Image

    if isinstance(image, DecodedImage) and image.rgbx is not None:
        rgbx = image.rgbx
        height, width = rgbx.shape[:2]
        # RGBX is Pillow's in-memory layout, so this maps the buffer instead of copying it.
        pil = Image.frombuffer("RGBX", (width, height), rgbx, "raw", "RGBX", 0, 1)
    else:
        array = image.array if isinstance(image, DecodedImage) else image
        if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
            raise ValueError(f"`image` must be HWC uint8 RGB, got {array.dtype} {array.shape}")
        height, width = array.shape[:2]
        pil = Image.fromarray(np.ascontiguousarray(array))
    box = clamp_box(params, height, width)
    resample = Image.Resampling.BICUBIC if interpolation == "bicubic" else Image.Resampling.BILINEAR
    resized = pil.resize((size[1], size[0]), resample, box=box)
    return np.asarray(resized)
