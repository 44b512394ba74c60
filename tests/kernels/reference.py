"""A float64 NumPy version of the fused kernel's function, written from transform-semantics.md.

Independent of the kernel source: dense per-axis weight matrices built exactly as
Pillow's ``precompute_coeffs`` does (Resample.c), applied as two einsums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def cubic(t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """transform-semantics.md's bicubic kernel (a = -0.5), support 2."""
    a, x = -0.5, np.abs(t)
    inner = ((a + 2) * x - (a + 3)) * x**2 + 1
    outer = a * (x**3 - 5 * x**2 + 8 * x - 4)
    return np.where(x < 1, inner, np.where(x < 2, outer, 0.0))


def axis_weights(
    start: float, size: float, out: int, in_size: int, interpolation: str = "bilinear"
) -> npt.NDArray[np.float64]:
    """``[out, in_size]`` normalised triangle (or cubic) weights for the source span
    [start, start+size)."""
    bicubic = interpolation == "bicubic"
    scale = size / out
    filterscale = max(scale, 1.0)
    support = (2.0 if bicubic else 1.0) * filterscale
    weights = np.zeros((out, in_size), dtype=np.float64)
    for i in range(out):
        center = start + (i + 0.5) * scale
        # Python's int() truncates toward zero, like the C cast in Pillow.
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), in_size)
        xs = np.arange(first, last, dtype=np.float64)
        t = (xs - center + 0.5) / filterscale
        w = cubic(t) if bicubic else np.maximum(0.0, 1.0 - np.abs(t))
        total = w.sum()
        if total > 0:
            weights[i, first:last] = w / total
    return weights


def resize_one(
    image: npt.NDArray[np.uint8],
    box: Sequence[float],
    flip: bool,
    out_h: int,
    out_w: int,
    interpolation: str = "bilinear",
) -> npt.NDArray[np.float64]:
    """``[3, out_h, out_w]`` in 0..255 units: crop ``box`` (top, left, h, w), resize, flip
    (bicubic: clamped to 0..255 once, at the end)."""
    top, left, bh, bw = (float(v) for v in box)
    wy = axis_weights(top, bh, out_h, image.shape[0], interpolation)
    wx = axis_weights(left, bw, out_w, image.shape[1], interpolation)
    rows = np.einsum("yh,hwc->ywc", wy, image.astype(np.float64))  # vertical pass
    out = np.einsum("ywc,xw->cyx", rows, wx)  # horizontal pass
    if interpolation == "bicubic":
        out = np.clip(out, 0.0, 255.0)
    return out[:, :, ::-1] if flip else out


def fused_reference(
    images: Sequence[npt.NDArray[np.uint8]],
    boxes: npt.NDArray[np.float64],
    flips: npt.NDArray[np.bool_],
    out_h: int,
    out_w: int,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: str,
    interpolation: str = "bilinear",
) -> npt.NDArray[np.float64]:
    """``[N, 3, out_h, out_w]`` float64: normalised, or 0..255 for uint8 (before the cast)."""
    out = np.zeros((len(images), 3, out_h, out_w), dtype=np.float64)
    for i, image in enumerate(images):
        out[i] = resize_one(image, boxes[i], bool(flips[i]), out_h, out_w, interpolation)
    if dtype == "uint8":
        return out
    m = np.asarray(mean, dtype=np.float64).reshape(1, 3, 1, 1)
    s = np.asarray(std, dtype=np.float64).reshape(1, 3, 1, 1)
    return (out / 255.0 - m) / s
