"""The float64 reference weights are Pillow's BILINEAR (antialiased) weights."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gpu_loader.ops import CropParams
from gpu_loader.ops._resample import resize_reference, triangle_weights, weight_matrix


def pillow_1d(row: np.ndarray, box0: float, box1: float, out_size: int) -> np.ndarray:
    """Pillow's resize of a 1-row float image ("F" mode: float math, no uint8 rounding)."""
    im = Image.fromarray(row.astype(np.float32)[None, :])
    res = im.resize((out_size, 1), Image.Resampling.BILINEAR, box=(box0, 0, box1, 1))
    return np.asarray(res, np.float64)[0]


CASES = [
    (500, 0.0, 500.0, 224),  # shrink ~2.2x
    (375, 20.5, 350.25, 224),  # fractional box, shrink
    (100, 3.0, 90.0, 224),  # enlarge
    (64, 0.0, 64.0, 64),  # identity
    (1000, 13.7, 987.1, 31),  # strong shrink
    (7, 0.5, 6.5, 50),  # tiny source
    (300, 299.0, 300.0, 5),  # one-pixel box at the edge
]


@pytest.mark.parametrize(("in_size", "b0", "b1", "out"), CASES)
def test_weights_reproduce_pillow(in_size: int, b0: float, b1: float, out: int) -> None:
    row = np.random.default_rng(in_size).uniform(0, 255, in_size)
    dense = weight_matrix(in_size, b0, b1, out)
    np.testing.assert_allclose(dense @ row, pillow_1d(row, b0, b1, out), atol=2e-3)


@pytest.mark.parametrize(("in_size", "b0", "b1", "out"), CASES)
def test_weights_are_a_partition_of_unity(in_size: int, b0: float, b1: float, out: int) -> None:
    xmin, weights = triangle_weights(in_size, b0, b1, out)
    assert xmin.shape == (out,) and weights.shape[0] == out
    assert np.all(weights >= 0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(xmin >= 0) and np.all(xmin < in_size)
    # Taps beyond the image edge are zero.
    for i in range(out):
        beyond = np.arange(weights.shape[1]) + xmin[i] >= in_size
        assert not weights[i, beyond].any()


def test_enlarging_is_plain_bilinear_with_half_pixel_centres() -> None:
    xmin, _ = triangle_weights(10, 0.0, 10.0, 20)
    # Output 5 has centre 2.75 -> between pixel centres 2.5 and 3.5: 0.75 / 0.25.
    dense = weight_matrix(10, 0.0, 10.0, 20)
    np.testing.assert_allclose(dense[5, 2:4], [0.75, 0.25])
    assert xmin[5] <= 2


def test_resize_reference_matches_pillow_rgb_within_a_level() -> None:
    from gpu_loader.datasets import photo_like

    image = photo_like(150, 210, np.random.default_rng(0))
    p = CropParams(top=10.5, left=7.25, height=120.0, width=190.5, flip=True)
    ref = resize_reference(image, p, (50, 64))
    pil = Image.fromarray(image).resize(
        (64, 50), Image.Resampling.BILINEAR, box=(p.left, p.top, p.right, p.bottom)
    )
    expected = np.asarray(pil, np.float64)[:, ::-1]
    assert np.abs(ref - expected).max() <= 1.0 + 1e-9


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="box"):
        triangle_weights(10, 5.0, 11.0, 4)
    with pytest.raises(ValueError, match="sizes"):
        triangle_weights(10, 0.0, 10.0, 0)
