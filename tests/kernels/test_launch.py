"""The launch helper shared by the CUDA and emulated launchers: shapes, packing, validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_loader.cuda._launch import (
    BLOCK,
    KERNEL_NAMES,
    MAX_GRID_YZ,
    OUTPUT_DTYPES,
    SAMPLE_DTYPE,
    launch_shape,
    normalization,
    pack_samples,
    plan_fused,
)
from gpu_loader.ops._transforms import INTERPOLATIONS

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@given(
    n=st.integers(0, MAX_GRID_YZ),
    out_h=st.integers(1, 5000),
    out_w=st.integers(1, 5000),
)
def test_grid_covers_every_output_pixel_exactly(n: int, out_h: int, out_w: int) -> None:
    grid, block = launch_shape(n, out_h, out_w)
    assert block == BLOCK
    assert grid[2] == n
    # Enough threads to cover the output, and no block lies wholly outside it.
    assert grid[0] * block[0] >= out_w > (grid[0] - 1) * block[0]
    assert grid[1] * block[1] >= out_h > (grid[1] - 1) * block[1]


def test_launch_shape_of_a_typical_batch() -> None:
    assert launch_shape(256, 224, 224) == ((7, 28, 256), (32, 8, 1))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 4, 4), "batch size"),
        ((MAX_GRID_YZ + 1, 4, 4), "split the batch"),
        ((1, 0, 4), "out_h"),
        ((1, 4, 0), "out_w"),
    ],
)
def test_launch_shape_rejects_bad_sizes(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        launch_shape(*args)


def test_normalization_reproduces_the_formula() -> None:
    scale, shift = normalization(MEAN, STD, "float32")
    x = np.array([0.0, 17.0, 128.0, 255.0])
    for c in range(3):
        np.testing.assert_allclose(
            x * scale[c] + shift[c], (x / 255 - MEAN[c]) / STD[c], rtol=1e-12
        )


def test_uint8_ignores_mean_and_std() -> None:
    assert normalization((9, 9, 9), (0, 0, 0), "uint8") == ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0))


@pytest.mark.parametrize(
    ("mean", "std"), [((0.5, 0.5), STD), (MEAN, (0.2, 0.0, 0.2)), (MEAN, (0.2, float("nan"), 0.2))]
)
def test_normalization_rejects_bad_values(mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match=r"mean|std"):
        normalization(mean, std, "float16")


def test_pack_samples_writes_every_field() -> None:
    images = [(0x1000, 10, 20, 64), (0x2000, 3, 1, 3)]
    boxes = [(1.5, 2.25, 4.0, 8.5), (0, 0, 3, 1)]
    records = pack_samples(images, boxes, [True, False])
    assert records.dtype == SAMPLE_DTYPE and records.flags.c_contiguous
    assert records["src"].tolist() == [0x1000, 0x2000]
    assert records["height"].tolist() == [10, 3]
    assert records["width"].tolist() == [20, 1]
    assert records["pitch"].tolist() == [64, 3]
    assert records["box_top"].tolist() == [1.5, 0.0]
    assert records["box_left"].tolist() == [2.25, 0.0]
    assert records["box_height"].tolist() == [4.0, 3.0]
    assert records["box_width"].tolist() == [8.5, 1.0]
    assert records["flip"].tolist() == [1, 0]
    assert records["reserved"].tolist() == [0, 0]


def test_every_interpolation_of_the_transforms_has_its_kernels() -> None:
    assert set(KERNEL_NAMES) == {(i, d) for i in INTERPOLATIONS for d in OUTPUT_DTYPES}
    assert len(set(KERNEL_NAMES.values())) == len(KERNEL_NAMES)


def test_an_unknown_interpolation_is_refused() -> None:
    with pytest.raises(ValueError, match=r"`interpolation` must be one of.*'lanczos'"):
        plan_fused([(1, 4, 4, 12)], [(0, 0, 4, 4)], [False], 2, 3, MEAN, STD, "float32", "lanczos")


def test_plan_moves_each_origin_next_to_its_box() -> None:
    # The same pixels, addressed from a whole-pixel origin before what the filter reads
    # (the bicubic support, 2 output-pixel widths here, and one more), in float64.
    image = (0x10000, 100, 3000, 9024)  # pointer, height, width, pitch (padded rows)
    plan = plan_fused(
        [image, image], [(50.25, 2500.5, 20.0, 60.0), (0.5, 1.0, 10.0, 10.0)], [False, True],
        10, 20, MEAN, STD, "float32",
    )  # fmt: skip
    far, near = plan.samples
    oy, ox = 50 - 4 - 1, 2500 - 6 - 1  # floor(start - 2 * max(size / out, 1)) - 1
    assert far["src"] == 0x10000 + oy * 9024 + 3 * ox
    assert (far["height"], far["width"], far["pitch"]) == (100 - oy, 3000 - ox, 9024)
    assert (far["box_top"], far["box_left"]) == (50.25 - oy, 2500.5 - ox)
    assert (far["box_height"], far["box_width"]) == (20.0, 60.0)
    # Near the origin there is no room before the box: the record is as given.
    assert near["src"] == 0x10000 and (near["height"], near["width"]) == (100, 3000)
    assert (near["box_top"], near["box_left"], near["flip"]) == (0.5, 1.0, 1)


def test_pack_samples_empty_batch() -> None:
    assert pack_samples([], [], []).shape == (0,)


@pytest.mark.parametrize(
    ("image", "box", "message"),
    [
        ((0, 4, 4, 12), (0, 0, 4, 4), "null"),
        ((1, 0, 4, 12), (0, 0, 1, 1), "at least 1x1"),
        ((1, 4, 4, 11), (0, 0, 4, 4), "pitch"),
        ((1, 4, 4, 12), (0, 0, 0, 4), "positive height"),
        ((1, 4, 4, 12), (0, 0, 4, float("inf")), "finite"),
        ((1, 4, 4, 12), (0.5, 0, 4, 4), "leaves the 4x4 image"),
        ((1, 4, 4, 12), (0, 0, 4, 4.002), "leaves"),
        ((1, 4, 4, 12), (0, -0.1, 2, 2), "leaves"),
        ((1, 4, 4, 12), (-0.25, 0, 2, 2), "leaves"),  # the kernel would read row -1
        ((1, 4, 2**31 // 3, 2**31), (0, 0, 1, 1), "too large for 32-bit indexing"),
        ((1, 2**31, 4, 12), (0, 0, 1, 1), "too large for 32-bit indexing"),
    ],
)
def test_pack_samples_rejects_bad_samples(
    image: tuple[int, int, int, int], box: tuple[float, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pack_samples([image], [box], [False])


def test_round_off_past_the_edge_is_clamped() -> None:
    records = pack_samples([(1, 4, 6, 18)], [(1.0, 2.0, 3.0005, 4.0004)], [False])
    assert records["box_height"][0] == 3.0 and records["box_width"][0] == 4.0


def test_pack_samples_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="boxes"):
        pack_samples([(1, 4, 4, 12)], [(0, 0, 4, 4), (0, 0, 4, 4)], [False])
    with pytest.raises(ValueError, match="flips"):
        pack_samples([(1, 4, 4, 12)], [(0, 0, 4, 4)], [False, True])


def test_plan_picks_the_kernel_per_filter_and_dtype() -> None:
    for (interpolation, dtype), name in KERNEL_NAMES.items():
        plan = plan_fused(
            [(1, 4, 4, 12)], [(0, 0, 4, 4)], [False], 2, 3, MEAN, STD, dtype, interpolation
        )
        assert plan.kernel_name == name
        assert plan.grid == (1, 1, 1) and plan.batch_size == 1


def test_plan_rejects_an_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="float64"):
        plan_fused([], [], [], 2, 2, MEAN, STD, "float64")  # type: ignore[arg-type]
