"""The whole per-sample CPU path: header -> params -> reduced decode -> transform, into a slot.

With the native backend a plain JPEG (no EXIF rotation; YCbCr, RGB or grey) takes one C
call that decodes only the region the crop box needs, at the DCT scale, and streams it into
the fused transform; everything else takes the general path (decode, then transform_into).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from gpu_loader.ops._backend import native_module
from gpu_loader.ops._decode import (
    _MIN_SIDE_FOR_DCT,
    DCT_FACTORS,
    DEFAULT_MAX_PIXELS,
    DecodeError,
    _as_bytes,
    _check_pixels,
    _jpeg_header,
    cap_dct_factor,
    decode_at,
    probe_size,
    scan_limit,
    too_many_scans,
)
from gpu_loader.ops._formats import sniff
from gpu_loader.ops._transform import _check_out, native_target, transform_into
from gpu_loader.ops._transforms import (
    CropParams,
    EvalTransform,
    OutputDtype,
    Random,
    TrainTransform,
)


def load_into(
    data: bytes | bytearray | memoryview | np.ndarray,
    transform: TrainTransform | EvalTransform,
    rng: Random,
    out: np.ndarray,
    *,
    dtype: OutputDtype,
    key: str = "?",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[int, int]:
    """Decode ``data``, apply ``transform`` with parameters from ``rng``, write into ``out``.

    Parameters are drawn on the ORIGINAL (EXIF-oriented) size, so they do not depend on the
    decode path. A JPEG is decoded with the largest DCT downscale (1/8, 1/4, 1/2) that keeps
    the crop box at least as large as the output, unless the transform's
    ``reduced_decode`` is False. Returns the original (height, width).
    Raises DecodeError (naming ``key``) for undecodable input.
    """
    # A plain JPEG: one C call, region + DCT-scaled decode streamed into the fused
    # transform. Else (nothing drawn from ``rng``, nothing written) the general path.
    job = prepare_load(data, transform, rng, out, dtype=dtype, key=key, max_pixels=max_pixels)
    if job is not None:
        return decode_prepared(job)
    buf = _as_bytes(data)
    exif = transform.exif_orientation
    size = probe_size(buf, key=key, exif=exif)
    if size is None:
        # Not a JPEG: no header-only size and no reduced decode; decode first.
        image = decode_at(buf, key=key, max_pixels=max_pixels, factor=1, exif=exif)
        height, width = image.height, image.width
        params = transform.make_params(height, width, rng)
    else:
        height, width = size
        params = transform.make_params(height, width, rng)
        factor = _dct_factor(transform, params, height, width)
        factor = cap_dct_factor(factor, buf)
        image = decode_at(buf, key=key, max_pixels=max_pixels, factor=factor, exif=exif)
        params = image.box(params)
    transform_into(
        image,
        params,
        out,
        mean=transform.mean,
        std=transform.std,
        dtype=dtype,
        interpolation=transform.interpolation,
    )
    return height, width


# JPEG colour spaces (simplejpeg's header names) the native decoder converts to RGB itself.
_NATIVE_COLORSPACES = ("YCbCr", "RGB", "Gray")


def dct_factor_for(
    params: CropParams, output_size: tuple[int, int], height: int, width: int
) -> int:
    """Largest k in (8, 4, 2) keeping the crop box >= ``output_size`` at 1/k scale, else 1."""
    if min(height, width) < _MIN_SIDE_FOR_DCT:
        return 1
    out_h, out_w = output_size
    for k in DCT_FACTORS:
        if params.height / k >= out_h and params.width / k >= out_w:
            return k
    return 1


def _dct_factor(
    transform: TrainTransform | EvalTransform, params: CropParams, height: int, width: int
) -> int:
    if not transform.reduced_decode:
        return 1
    return dct_factor_for(params, transform.output_size, height, width)


class NativeJpeg(NamedTuple):
    """A JPEG the native decoder takes whole, ready for `decode_resize_jpeg`: its arguments,
    and what `load_into` returns and its errors name."""

    args: tuple[Any, ...]
    key: str
    height: int
    width: int
    max_scans: int


def _native_jpeg(
    native: ModuleType,
    buf: bytes | memoryview,
    transform: TrainTransform | EvalTransform,
    rng: Random,
    out: np.ndarray,
    dtype: OutputDtype,
    key: str,
    max_pixels: int,
) -> NativeJpeg | None:
    """Header, checks and parameters for the one C call; None (nothing drawn from ``rng``)
    for the JPEGs left to the general path: EXIF-rotated ones (when the transform applies
    EXIF orientation) and colour spaces other than YCbCr, RGB and grey."""
    height, width, colorspace, orientation, chroma = _jpeg_header(buf, key)
    rotated = orientation != 1 and transform.exif_orientation  # else: as stored
    if rotated or colorspace not in _NATIVE_COLORSPACES:
        return None
    _check_pixels(key, height, width, max_pixels)
    max_scans = scan_limit(height, width, max_pixels)
    params = transform.make_params(height, width, rng)
    factor = cap_dct_factor(_dct_factor(transform, params, height, width), buf, chroma)
    if factor != 1:
        params = params.scaled(1.0 / factor)
    args = (
        buf,
        factor,
        -(-height // factor),  # libjpeg's scaled size: ceil(height / factor)
        -(-width // factor),
        *native_target(params, out, dtype, transform.mean, transform.std, transform.interpolation),
        max_scans,  # its progress monitor stops libjpeg past it
    )
    return NativeJpeg(args, key, height, width, max_scans)


def _native_error(message: str, key: str, max_scans: int) -> DecodeError:
    """The DecodeError for the native decoder's JpegError ``message``."""
    if message == f"more than {max_scans} scans":
        return too_many_scans(key, max_scans)
    return DecodeError(f"cannot decode image {key!r}: corrupt or truncated JPEG data ({message})")


def prepare_load(
    data: bytes | bytearray | memoryview | np.ndarray,
    transform: TrainTransform | EvalTransform,
    rng: Random,
    out: np.ndarray,
    *,
    dtype: OutputDtype,
    key: str = "?",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> NativeJpeg | None:
    """`load_into`'s work up to its one C call, for a JPEG the native decoder takes whole;
    `load_prepared` then decodes many such at once. None: ``data`` takes another path
    (`load_into` it); raises what `load_into` raises before decoding. ``data`` and ``out``
    must stay alive and unchanged until `load_prepared` returns."""
    buf = _as_bytes(data)
    _check_out(out, dtype)  # the clear error for a wrong `out`, before either path uses it
    native = native_module()
    if native is None or not out.flags.c_contiguous or sniff(buf) != "jpeg":
        return None
    return _native_jpeg(native, buf, transform, rng, out, dtype, key, max_pixels)


def decode_prepared(job: NativeJpeg) -> tuple[int, int]:
    """Decode one `prepare_load` job alone (`load_into`'s own call; the GIL released but
    for a small one): the original (height, width), or the error `load_into` raises."""
    native = native_module()
    if native is None:
        raise RuntimeError("decode_prepared needs the native backend (prepare_load gave a job)")
    try:
        native.decode_resize_jpeg(*job.args)
    except native.JpegError as exc:
        raise _native_error(str(exc), job.key, job.max_scans) from None
    return job.height, job.width


def load_prepared(jobs: Sequence[NativeJpeg]) -> list[Exception | None]:
    """Decode `prepare_load`'s ``jobs`` into their ``out``, all in one release of the GIL
    (with runs of small JPEGs, a release per image cost more than the decodes; holding it
    kept the decode threads from running side by side): per job None, or the error
    `load_into` would have raised."""
    if not jobs:
        return []
    native = native_module()
    if native is None:
        raise RuntimeError("load_prepared needs the native backend (prepare_load gave jobs)")
    results = native.decode_resize_jpegs([job.args for job in jobs])
    errors: list[Exception | None] = []
    for job, result in zip(jobs, results, strict=True):
        if result is None:
            errors.append(None)
        elif isinstance(result, str):
            errors.append(_native_error(result, job.key, job.max_scans))
        else:
            errors.append(MemoryError(f"out of memory decoding {job.key!r}"))
    return errors
