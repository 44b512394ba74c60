"""The whole per-sample CPU path: header -> params -> reduced decode -> transform, into a slot."""

from __future__ import annotations

import numpy as np

from gpu_loader.ops._decode import (
    _MIN_SIDE_FOR_DCT,
    DCT_FACTORS,
    DEFAULT_MAX_PIXELS,
    _as_bytes,
    decode_at,
    probe_size,
)
from gpu_loader.ops._transform import transform_into
from gpu_loader.ops._transforms import CropParams, EvalTransform, OutputDtype, TrainTransform


def load_into(
    data: bytes | bytearray | memoryview | np.ndarray,
    transform: TrainTransform | EvalTransform,
    rng: np.random.Generator,
    out: np.ndarray,
    *,
    dtype: OutputDtype,
    key: str = "?",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[int, int]:
    """Decode ``data``, apply ``transform`` with parameters from ``rng``, write into ``out``.

    Parameters are drawn on the ORIGINAL (EXIF-oriented) size, so they do not depend on the
    decode path. A JPEG is decoded with the largest DCT downscale (1/8, 1/4, 1/2) that keeps
    the crop box at least as large as the output. Returns the original (height, width).
    Raises DecodeError (naming ``key``) for undecodable input.
    """
    buf = _as_bytes(data)
    size = probe_size(buf, key=key)
    if size is None:
        # Not a JPEG: no header-only size and no reduced decode; decode first.
        image = decode_at(buf, key=key, max_pixels=max_pixels, factor=1)
        height, width = image.height, image.width
        params = transform.make_params(height, width, rng)
    else:
        height, width = size
        params = transform.make_params(height, width, rng)
        factor = dct_factor_for(params, transform.output_size, height, width)
        image = decode_at(buf, key=key, max_pixels=max_pixels, factor=factor)
        if image.scale != 1.0:
            params = params.scaled(image.scale)
    transform_into(image, params, out, mean=transform.mean, std=transform.std, dtype=dtype)
    return height, width


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
