"""The whole per-sample CPU path: header -> params -> reduced decode -> transform, into a slot.

With the native backend a plain JPEG (no EXIF rotation; YCbCr, RGB or grey) takes one C
call that decodes only the region the crop box needs, at the DCT scale, and streams it into
the fused transform; everything else takes the general path (decode, then transform_into).
"""

from __future__ import annotations

from types import ModuleType

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
    buf = _as_bytes(data)
    _check_out(out, dtype)  # the clear error for a wrong `out`, before either path uses it
    native = native_module()
    if native is not None and out.flags.c_contiguous and sniff(buf) == "jpeg":
        done = _load_jpeg_native(native, buf, transform, rng, out, dtype, key, max_pixels)
        if done is not None:
            return done
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


def _load_jpeg_native(
    native: ModuleType,
    buf: bytes | memoryview,
    transform: TrainTransform | EvalTransform,
    rng: Random,
    out: np.ndarray,
    dtype: OutputDtype,
    key: str,
    max_pixels: int,
) -> tuple[int, int] | None:
    """One C call: region + DCT-scaled decode streamed into the fused transform.

    Returns None (nothing drawn from ``rng``, nothing written) for the JPEGs it leaves to the
    general path: EXIF-rotated ones (when the transform applies EXIF orientation) and
    colour spaces other than YCbCr, RGB and grey.
    """
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
    try:
        native.decode_resize_jpeg(
            buf,
            factor,
            -(-height // factor),  # libjpeg's scaled size: ceil(height / factor)
            -(-width // factor),
            *native_target(
                params, out, dtype, transform.mean, transform.std, transform.interpolation
            ),
            max_scans,  # its progress monitor stops libjpeg past it
        )
    except native.JpegError as exc:
        if str(exc) == f"more than {max_scans} scans":
            raise too_many_scans(key, max_scans) from None
        raise DecodeError(
            f"cannot decode image {key!r}: corrupt or truncated JPEG data ({exc})"
        ) from None
    return height, width
