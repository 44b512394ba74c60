"""Float64 NumPy reference of the antialiased bilinear resize (Pillow BILINEAR semantics),
and of the bicubic one (Pillow BICUBIC: ``interpolation="bicubic"``).

This is the specification in executable form (transform-semantics.md, "Antialiased bilinear
resize"): the CPU fast path, the CUDA kernels and their CPU emulation are all tested against
it. It is deliberately simple and slow; nothing on the hot path calls it.
"""

from __future__ import annotations

import math

import numpy as np

from gpu_loader.ops._transforms import CropParams, _check_interpolation


def bicubic_kernel(x: np.ndarray) -> np.ndarray:
    """Pillow's bicubic kernel (Keys, a = -0.5), support 2."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def triangle_weights(
    in_size: int, box0: float, box1: float, out_size: int, interpolation: str = "bilinear"
) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-pixel taps of the 1-D antialiased triangle filter (or, with
    ``interpolation="bicubic"``, of Pillow's bicubic one, support 2).

    Returns ``(xmin, weights)``: ``xmin`` int64 ``[out_size]`` is the first source pixel of
    each output pixel, ``weights`` float64 ``[out_size, taps]`` its normalised weights (zero
    padded on the right); output ``i`` = ``sum_k weights[i, k] * src[xmin[i] + k]``.
    """
    if out_size < 1 or in_size < 1:
        raise ValueError(f"sizes must be >= 1, got in_size={in_size}, out_size={out_size}")
    if not 0 <= box0 < box1 <= in_size:
        raise ValueError(f"box must satisfy 0 <= box0 < box1 <= in_size, got {box0}, {box1}")
    scale = (box1 - box0) / out_size
    filterscale = max(scale, 1.0)
    _check_interpolation(interpolation)
    bicubic = interpolation == "bicubic"
    support = (2.0 if bicubic else 1.0) * filterscale  # the triangle's support is 1
    taps = math.ceil(support) * 2 + 1  # Pillow's ksize
    xmin = np.zeros(out_size, np.int64)
    weights = np.zeros((out_size, taps), np.float64)
    for i in range(out_size):
        center = box0 + (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        x = np.arange(lo, hi, dtype=np.float64)
        t = (x - center + 0.5) / filterscale
        w = bicubic_kernel(t) if bicubic else np.maximum(0.0, 1.0 - np.abs(t))
        total = w.sum()
        if total != 0:
            w /= total
        xmin[i] = lo
        weights[i, : hi - lo] = w
    return xmin, weights


def weight_matrix(
    in_size: int, box0: float, box1: float, out_size: int, interpolation: str = "bilinear"
) -> np.ndarray:
    """The dense ``[out_size, in_size]`` float64 matrix of :func:`triangle_weights`."""
    xmin, weights = triangle_weights(in_size, box0, box1, out_size, interpolation)
    dense = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        n = min(weights.shape[1], in_size - int(xmin[i]))
        dense[i, xmin[i] : xmin[i] + n] = weights[i, :n]
    return dense


def resize_reference(
    image: np.ndarray,
    params: CropParams,
    out_size: tuple[int, int],
    interpolation: str = "bilinear",
) -> np.ndarray:
    """Crop box -> antialiased bilinear (or bicubic) resize -> flip, in float64 (HWC, 0-255
    scale; bicubic clamped to [0, 255] at the end).

    ``params`` is in ``image``'s own pixel coordinates. No rounding between the passes, so
    the result is Pillow's within about one level.
    """
    height, width = image.shape[:2]
    out_h, out_w = out_size
    rows = weight_matrix(height, params.top, min(params.bottom, height), out_h, interpolation)
    cols = weight_matrix(width, params.left, min(params.right, width), out_w, interpolation)
    src = image.astype(np.float64)
    out = np.einsum("ih,hwc->iwc", rows, src)
    out = np.einsum("jw,iwc->ijc", cols, out)
    if interpolation == "bicubic":
        out = np.clip(out, 0.0, 255.0)
    result: np.ndarray = out[:, ::-1] if params.flip else out
    return result


def normalize_reference(
    resized: np.ndarray, mean: tuple[float, float, float], std: tuple[float, float, float]
) -> np.ndarray:
    """``(x / 255 - mean) / std`` per channel and HWC -> CHW, in float64."""
    m = np.asarray(mean, np.float64)
    s = np.asarray(std, np.float64)
    return np.ascontiguousarray(((resized / 255.0 - m) / s).transpose(2, 0, 1))
