"""The fused kernel, compiled for the CPU through kernels/cuda_emulation.h, against the references."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gpu_loader.cuda._emulation import convert, launch_fused_emulated, sample_layout
from gpu_loader.cuda._launch import OUTPUT_DTYPES, SAMPLE_DTYPE, OutputDtype
from gpu_loader.ops._transforms import INTERPOLATIONS
from tests.kernels.checker import (
    Case,
    as_float64,
    bfloat16_bits,
    check_fused_kernel,
    random_case,
    run_host,
)
from tests.kernels.reference import axis_weights

RUN = run_host(launch_fused_emulated)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_random_batches_match_the_reference(
    dtype: OutputDtype, seed: int, interpolation: str
) -> None:
    rng = np.random.default_rng([seed, OUTPUT_DTYPES.index(dtype)])
    case = random_case(
        rng, dtype, n=int(rng.integers(2, 6)), label=f"seed {seed}", interpolation=interpolation
    )
    check_fused_kernel(RUN, case)


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_bicubic_overshoot_is_clamped_to_the_pixel_range(dtype: OutputDtype) -> None:
    # A checkerboard blown up 8x: the cubic lobes ring past 0 and 255 at every edge.
    # The kernel clamps once, before normalising, so the output stays within what 0
    # and 255 normalise to, and reaches both.
    board = (np.indices((8, 8)).sum(axis=0) % 2 * 255).astype(np.uint8)
    image = np.repeat(board[:, :, None], 3, axis=2)
    case = Case(
        [np.ascontiguousarray(image.reshape(8, 24))], [8], np.array([[0.0, 0.0, 8.0, 8.0]]),
        np.array([False]), 64, 64, dtype, label="checkerboard", interpolation="bicubic",
    )  # fmt: skip
    out = as_float64(check_fused_kernel(RUN, case), dtype)
    mean, std = np.asarray(case.mean), np.asarray(case.std)
    low, high = (0.0 - mean) / std, (1.0 - mean) / std
    if dtype == "uint8":
        low, high = np.zeros(3), np.full(3, 255.0)
    for c in range(3):
        assert out[0, c].min() == pytest.approx(low[c], abs=1e-5)
        assert out[0, c].max() == pytest.approx(high[c], abs=1e-5)
    # Unclamped, the same weights go well past the range (the clamp is what holds it).
    weights = axis_weights(0.0, 8.0, 64, 8, "bicubic")
    raw = weights @ board.astype(np.float64) @ weights.T
    assert raw.min() < -10 and raw.max() > 265


@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
def test_empty_batch(dtype: OutputDtype) -> None:
    case = random_case(np.random.default_rng(0), dtype, n=0, label="empty")
    out = check_fused_kernel(RUN, case)
    assert out.shape == (0, 3, case.out_h, case.out_w)


@pytest.mark.parametrize(
    ("sizes", "boxes", "out_hw"),
    [
        # one-pixel-wide and one-pixel-high sources, enlarged a lot
        ([(7, 1), (1, 9)], [(0, 0, 7, 1), (0, 0, 1, 9)], (16, 16)),
        # a single pixel to many: every output equals that pixel
        ([(1, 1)], [(0, 0, 1, 1)], (5, 3)),
        # strong shrink (antialiasing window many pixels wide), odd sizes
        ([(97, 61)], [(3.5, 2.25, 90.0, 55.5)], (4, 5)),
        # a fractional sub-pixel box: enlarging from less than one pixel
        ([(6, 6)], [(2.3, 1.7, 0.6, 0.9)], (3, 4)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_edge_geometries(
    sizes: list[tuple[int, int]],
    boxes: list[tuple[float, float, float, float]],
    out_hw: tuple[int, int],
    dtype: OutputDtype,
) -> None:
    rng = np.random.default_rng(7)
    case = random_case(rng, dtype, n=len(sizes), sizes=sizes, label=str(sizes))
    case = Case(
        case.buffers, case.widths, np.array(boxes, dtype=np.float64),
        np.array([True, False][: len(sizes)]), out_hw[0], out_hw[1], dtype, label=str(sizes),
    )  # fmt: skip
    check_fused_kernel(RUN, case)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_a_small_box_far_from_the_origin_keeps_float32_precision(interpolation: str) -> None:
    # QA59: at x = 20,000 float32 steps by 0.002, so a few-pixel box blown up to 200
    # columns came out up to 0.6 levels off; the planner now moves each record's origin
    # next to its box (in float64), and the result is as close as near the origin.
    rng = np.random.default_rng(20)
    image = (rng.integers(0, 2, (4, 20_000, 3), dtype=np.uint8) * 255).reshape(4, 60_000)
    # The third box shrinks 8x: the bicubic filter then reaches 16 pixels past the box,
    # which the moved origin must keep.
    boxes = np.array(
        [[0.0, 19_990.3, 4.0, 2.7], [1.5, 12_345.67, 2.25, 5.1], [0.0, 15_000.3, 4.0, 1_600.0]]
    )
    case = Case(
        [np.ascontiguousarray(image)] * 3, [20_000] * 3, boxes, np.array([False, True, False]),
        4, 200, "float32", label="far from the origin", interpolation=interpolation,
    )  # fmt: skip
    check_fused_kernel(RUN, case)


def test_single_pixel_source_fills_the_output() -> None:
    rng = np.random.default_rng(3)
    case = random_case(rng, "uint8", n=1, sizes=[(1, 1)])
    case = Case(
        case.buffers, case.widths, np.array([[0, 0, 1, 1.0]]), np.array([False]), 4, 6, "uint8"
    )
    out = RUN(case, 0)
    pixel = case.images[0][0, 0]
    for c in range(3):
        assert np.all(out[0, c] == pixel[c])


def test_flip_mirrors_the_columns() -> None:
    rng = np.random.default_rng(11)
    base = random_case(rng, "float32", n=1, sizes=[(13, 17)])
    plain = Case(base.buffers, base.widths, base.boxes, np.array([False]), 9, 11, "float32")
    flipped = Case(base.buffers, base.widths, base.boxes, np.array([True]), 9, 11, "float32")
    np.testing.assert_array_equal(RUN(flipped, 0), RUN(plain, 0)[..., ::-1])


def test_reduced_precision_outputs_are_the_float32_output_rounded_to_nearest_even() -> None:
    # Same kernel arithmetic, different store: float16 and bfloat16 must be exactly the
    # float32 result rounded once (what cuda_fp16.h / cuda_bf16.h do on the device).
    rng = np.random.default_rng(5)
    base = random_case(rng, "float32", n=3, max_side=30)

    def run_as(dtype: OutputDtype) -> np.ndarray:
        return RUN(
            Case(base.buffers, base.widths, base.boxes, base.flips, base.out_h, base.out_w, dtype),
            0,
        )

    f32 = run_as("float32")
    np.testing.assert_array_equal(run_as("float16"), f32.astype(np.float16))
    np.testing.assert_array_equal(run_as("bfloat16"), bfloat16_bits(f32))


def test_conversions_match_numpy_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    specials = np.array(
        [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.99, 65520.0, 1e9, -1e9, np.inf, -np.inf,
         2.0**-14, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-26, 3e-8, 0.5, 1.5, 2.5, -0.5],
        dtype=np.float32,
    )  # fmt: skip
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate(
        [specials, bits[np.isfinite(bits)], rng.normal(0, 3, 50_000).astype(np.float32)]
    )
    half, bf16, _ = convert(values)
    with np.errstate(over="ignore"):  # overflow to infinity is part of what is compared
        want_half = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(half, want_half)
    np.testing.assert_array_equal(bf16, bfloat16_bits(values))
    _, _, rint = convert(np.array([0.5, 1.5, 2.5, -0.5, 254.5, 255.49, 3.7], dtype=np.float32))
    assert list(rint) == [0, 2, 2, 0, 254, 255, 4]


def test_nan_converts_to_a_nan() -> None:
    half, bf16, _ = convert(np.array([np.nan], dtype=np.float32))
    assert np.isnan(half.view(np.float16)[0])
    assert np.isnan(as_float64(bf16, "bfloat16")[0])


def test_sample_record_layout_matches_the_compiled_struct() -> None:
    layout = sample_layout()
    assert layout["itemsize"] == SAMPLE_DTYPE.itemsize
    fields = SAMPLE_DTYPE.fields or {}
    for name, offset in layout.items():
        if name != "itemsize":
            assert fields[name][1] == offset, name


@pytest.mark.parametrize("seed", range(3))
def test_uint8_matches_pillow_within_one_level(seed: int) -> None:
    # Pillow rounds to 8 bits between its two passes; the kernel does not: one level apart.
    rng = np.random.default_rng(100 + seed)
    h, w = (int(v) for v in rng.integers(20, 80, size=2))
    image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    image = (image // 3 + np.linspace(0, 160, w, dtype=np.uint8)[None, :, None]).astype(np.uint8)
    for box, size in [
        ((0.0, 0.0, h, w), (17, 23)),  # shrink the whole image
        ((2.5, 3.25, h / 2, w / 3), (31, 29)),  # enlarge a fractional box
        ((1.0, 1.0, h - 2.0, w - 1.5), (h - 3, w // 2)),  # mild shrink, mixed
    ]:
        out_h, out_w = size
        case = Case(
            [np.ascontiguousarray(image.reshape(h, 3 * w))], [w], np.array([box]),
            np.array([seed == 1]), out_h, out_w, "uint8",
        )  # fmt: skip
        got = RUN(case, 0)[0].transpose(1, 2, 0).astype(int)
        top, left, bh, bw = box
        pil = Image.fromarray(image).resize(
            (out_w, out_h), Image.Resampling.BILINEAR, box=(left, top, left + bw, top + bh)
        )
        want = np.asarray(pil).astype(int)
        if seed == 1:
            want = want[:, ::-1]
        assert np.abs(got - want).max() <= 1, (box, size)


@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_matches_the_cpu_path(dtype: OutputDtype, seed: int) -> None:
    # gpu_loader.ops is Pillow in 8-bit fixed point, rounding between its passes: one
    # pixel level apart, plus each side's rounding to the output dtype.
    from gpu_loader.ops import CropParams, transform_into

    rng = np.random.default_rng([seed, 99])
    case = random_case(rng, dtype, n=4, max_side=48, max_out=20, label=f"cpu path {seed}")
    got = as_float64(RUN(case, 0), dtype)
    level = 1.0 if dtype == "uint8" else 1.0 / (255.0 * min(case.std))
    rel = {"float32": 1e-6, "float16": 2.0**-10, "bfloat16": 2.0**-7, "uint8": 0.0}[dtype]
    numpy_dtype = {
        "float32": np.float32,
        "float16": np.float16,
        "bfloat16": np.uint16,
        "uint8": np.uint8,
    }
    for i, image in enumerate(case.images):
        top, left, bh, bw = case.boxes[i]
        params = CropParams(top, left, bh, bw, flip=bool(case.flips[i]))
        out = np.zeros((3, case.out_h, case.out_w), dtype=numpy_dtype[dtype])
        transform_into(
            np.ascontiguousarray(image), params, out, mean=case.mean, std=case.std, dtype=dtype
        )
        want = as_float64(out, dtype)
        err = np.abs(got[i] - want)
        assert np.all(err <= level + rel * np.abs(want) + 1e-6), (i, float(err.max()))


@pytest.mark.parametrize("dtype", OUTPUT_DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_bicubic_matches_the_native_cpu_path(dtype: OutputDtype, seed: int) -> None:
    # Both sum the same separable float weights and clamp once: equal but for float
    # rounding, then each side's rounding to the output dtype (one level for uint8).
    from gpu_loader.ops import CropParams, transform_into
    from gpu_loader.ops._backend import forced, native_module

    if native_module() is None:
        pytest.skip("the native CPU backend is not built")
    rng = np.random.default_rng([seed, 98])
    case = random_case(
        rng, dtype, n=4, max_side=48, max_out=20, label=f"bicubic {seed}",
        interpolation="bicubic",
    )  # fmt: skip
    got = as_float64(RUN(case, 0), dtype)
    rel, abs_ = {
        "float32": (1e-6, 1e-4),
        "float16": (2.0**-10, 1e-4),
        "bfloat16": (2.0**-7, 1e-4),
        "uint8": (0.0, 1.0),
    }[dtype]
    numpy_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
    for i, image in enumerate(case.images):
        top, left, bh, bw = case.boxes[i]
        params = CropParams(top, left, bh, bw, flip=bool(case.flips[i]))
        out = np.zeros((3, case.out_h, case.out_w), dtype=numpy_dtype.get(dtype, np.uint8))
        with forced("native"):
            transform_into(
                np.ascontiguousarray(image), params, out, mean=case.mean, std=case.std,
                dtype=dtype, interpolation="bicubic",
            )  # fmt: skip
        want = as_float64(out, dtype)
        err = np.abs(got[i] - want)
        assert np.all(err <= abs_ + rel * np.abs(want)), (i, float(err.max()))


def test_imagenet_sized_crop_matches_pillow() -> None:
    # One realistic case end to end: a 375x500 photo-like image, RandomResizedCrop-style
    # fractional box, 224x224 output, flipped.
    rng = np.random.default_rng(2024)
    yy, xx = np.mgrid[0:375, 0:500]
    smooth = np.stack([(xx * 0.5) % 256, (yy * 0.7) % 256, (xx + yy) % 256], axis=-1)
    image = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
    box = (31.25, 60.5, 300.0, 280.75)
    case = Case(
        [np.ascontiguousarray(image.reshape(375, 1500))], [500], np.array([box]),
        np.array([True]), 224, 224, "uint8",
    )  # fmt: skip
    got = check_fused_kernel(RUN, case)[0].transpose(1, 2, 0).astype(int)
    top, left, bh, bw = box
    pil = Image.fromarray(image).resize(
        (224, 224), Image.Resampling.BILINEAR, box=(left, top, left + bw, top + bh)
    )
    diff = np.abs(got - np.asarray(pil)[:, ::-1].astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.5


def test_concurrent_emulated_launches_do_not_interfere() -> None:
    # ctypes releases the GIL, and the emulated blockIdx/threadIdx are thread_local, so
    # worker threads may each run the CPU stand-in at once.
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(8)
    cases = [random_case(rng, "float32", n=3, max_side=60, max_out=40) for _ in range(6)]
    serial = [RUN(c, 0) for c in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda c: RUN(c, 0xFF), cases * 3))
    for i, out in enumerate(parallel):
        np.testing.assert_array_equal(out, serial[i % len(cases)])
