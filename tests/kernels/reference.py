"""A float64 NumPy version of the fused kernel's function, written from transform-semantics.md.

Independent of the kernel source: dense per-axis weight matrices built exactly as
Pillow's ``precompute_coeffs`` does (Resample.c), applied as two einsums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def axis_weights(start: float, size: float, out: int, in_size: int) -> npt.NDArray[np.float64]:
    """``[out, in_size]`` normalised triangle weights for the source span [start, start+size)."""
    scale = size / out
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    weights = np.zeros((out, in_size), dtype=np.float64)
    for i in range(out):
        center = start + (i + 0.5) * scale
        # Python's int() truncates toward zero, like the C cast in Pillow.
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), in_size)
        xs = np.arange(first, last, dtype=np.float64)
        w = np.maximum(0.0, 1.0 - np.abs((xs - center + 0.5) / filterscale))
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
) -> npt.NDArray[np.float64]:
    """``[3, out_h, out_w]`` in 0..255 units: crop ``box`` (top, left, h, w), resize, flip."""
    top, left, bh, bw = (float(v) for v in box)
    wy = axis_weights(top, bh, out_h, image.shape[0])
    wx = axis_weights(left, bw, out_w, image.shape[1])
    rows = np.einsum("yh,hwc->ywc", wy, image.astype(np.float64))  # vertical pass
    out = np.einsum("ywc,xw->cyx", rows, wx)  # horizontal pass
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
) -> npt.NDArray[np.float64]:
    """``[N, 3, out_h, out_w]`` float64: normalised, or 0..255 for uint8 (before the cast)."""
    out = np.zeros((len(images), 3, out_h, out_w), dtype=np.float64)
    for i, image in enumerate(images):
        out[i] = resize_one(image, boxes[i], bool(flips[i]), out_h, out_w)
    if dtype == "uint8":
        return out
    m = np.asarray(mean, dtype=np.float64).reshape(1, 3, 1, 1)
    s = np.asarray(std, dtype=np.float64).reshape(1, 3, 1, 1)
    return (out / 255.0 - m) / s
