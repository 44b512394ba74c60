"""The native CPU fast path (gpu_loader.ops._native): exactness against full decodes and the
float64 spec, the casts bit for bit, damage anywhere in a file, arguments, fallbacks."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.ops import (
    CropParams,
    DecodeError,
    EvalTransform,
    TrainTransform,
    cpu_backend,
    load_into,
)
from gpu_loader.ops._backend import ENV_VAR, native_module
from gpu_loader.ops._resample import resize_reference
from gpu_loader.ops._transform import NATIVE_DTYPE_CODES, native_affine
from tests.ops.conftest import jpeg, pillow_jpeg

_native = pytest.importorskip("gpu_loader.ops._native", reason="checked by the next test")

NO_NORM = ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0))  # scale, shift: raw 0..255 values
OUT_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8}


def test_native_extension_is_built() -> None:
    # The README's install builds it (gcc + libjpeg headers); CI proves the fast path runs.
    assert native_module() is not None, "gpu_loader.ops._native missing: see setup.py"
    assert cpu_backend() == "native"


def test_backend_choice_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv(ENV_VAR, "pillow")
        native_module.cache_clear()
        assert cpu_backend() == "pillow"
        monkeypatch.setenv(ENV_VAR, "fastest")
        native_module.cache_clear()
        with pytest.raises(ValueError, match="GPU_LOADER_CPU_BACKEND must be one of"):
            cpu_backend()
    finally:
        monkeypatch.delenv(ENV_VAR)
        native_module.cache_clear()
    assert cpu_backend() == "native"


def photo(h: int, w: int, seed: int, gray: bool = False) -> np.ndarray:
    from gpu_loader.datasets import photo_like

    image = photo_like(h, w, np.random.default_rng(seed))
    if gray:
        return np.ascontiguousarray(image.mean(axis=2, keepdims=True).astype(np.uint8))
    return image


def native_roi(
    data: bytes,
    denom: int,
    size: tuple[int, int],
    box: tuple[float, ...],
    out_hw: tuple[int, int],
    flip: bool,
    dtype: str,
    filter_code: int = 0,
) -> np.ndarray:
    out = np.empty((3, *out_hw), OUT_DTYPE[dtype])
    _native.decode_resize_jpeg(
        data,
        denom,
        size[0],
        size[1],
        box,
        out,
        *out_hw,
        flip,
        NATIVE_DTYPE_CODES[dtype],
        *native_affine((0.4,) * 3, (0.2,) * 3),
        filter_code,
    )
    return out


def native_full(
    image: np.ndarray,
    box: tuple[float, ...],
    out_hw: tuple[int, int],
    flip: bool,
    dtype: str,
    filter_code: int = 0,
) -> np.ndarray:
    out = np.empty((3, *out_hw), OUT_DTYPE[dtype])
    h, w, c = image.shape
    _native.resize_into(
        image,
        h,
        w,
        c,
        box,
        out,
        *out_hw,
        flip,
        NATIVE_DTYPE_CODES[dtype],
        *native_affine((0.4,) * 3, (0.2,) * 3),
        filter_code,
    )
    return out


@pytest.mark.parametrize(
    ("sub", "gray"), [("420", False), ("444", False), ("422", False), ("gray", True)]
)
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_region_decode_equals_full_decode_bit_for_bit(sub: str, gray: bool, denom: int) -> None:
    """Cropping columns, skipping rows and the DCT scale change which pixels are decoded,
    never their values: the result equals a full decode (simplejpeg) resized the same way."""
    image = photo(613, 877, seed=denom, gray=gray)
    if gray:
        data = bytes(simplejpeg.encode_jpeg(image, quality=90, colorspace="GRAY"))
    else:
        data = jpeg(image, 90, sub)
    sh, sw = math.ceil(613 / denom), math.ceil(877 / denom)
    full = simplejpeg.decode_jpeg(
        data, colorspace="GRAY" if gray else "RGB", min_height=sh, min_width=sw
    )
    assert full.shape[:2] == (sh, sw)
    rng = np.random.default_rng(denom)
    boxes = [
        (0.0, 0.0, sh, sw),
        (0.0, 0.0, sh / 3, sw / 4),
        (sh / 2, sw / 2, sh / 2, sw / 2),
        (sh - 7.5, sw - 9.25, 7.5, 9.25),
    ]  # whole, top-left, bottom-right, tiny corner
    for _ in range(6):
        top, left = rng.uniform(0, sh - 8), rng.uniform(0, sw - 8)
        boxes.append((top, left, rng.uniform(4, sh - top), rng.uniform(4, sw - left)))
    for i, box in enumerate(boxes):
        out_hw = [(64, 48), (224, 224), (17, 301)][i % 3]  # shrink, both, stretch
        for dtype, flip in (("float32", i % 2 == 1), ("uint8", i % 2 == 0)):
            code = i % 2 if dtype == "float32" else 1 - i % 2  # bilinear and bicubic
            got = native_roi(data, denom, (sh, sw), box, out_hw, flip, dtype, code)
            want = native_full(full, box, out_hw, flip, dtype, code)
            assert np.array_equal(got, want), (sub, denom, box, out_hw, dtype, code)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_resize_matches_the_float64_spec(channels: int) -> None:
    rgb = photo(157, 211, seed=3)
    src = {1: rgb[:, :, :1], 3: rgb, 4: np.concatenate([rgb, rgb[:, :, :1] ^ 0x5A], axis=2)}
    image = np.ascontiguousarray(src[channels])
    rng = np.random.default_rng(channels)
    for i in range(12):
        top, left = rng.uniform(0, 120), rng.uniform(0, 170)
        p = CropParams(
            top, left, rng.uniform(1, 157 - top), rng.uniform(1, 211 - left), flip=bool(i % 2)
        )
        out_hw = (int(rng.integers(1, 90)), int(rng.integers(1, 90)))
        out = np.full((3, *out_hw), np.nan, np.float32)
        _native.resize_into(
            image,
            157,
            211,
            channels,
            (p.top, p.left, p.height, p.width),
            out,
            *out_hw,
            p.flip,
            0,
            *NO_NORM,
        )
        ref_src = np.repeat(image, 3, axis=2) if channels == 1 else image[:, :, :3]
        ref = resize_reference(ref_src, p, out_hw).transpose(2, 0, 1)
        assert np.abs(out - ref).max() < 2e-3  # levels: float32 vs float64, no rounding


def test_float16_and_bfloat16_rounding_bit_for_bit() -> None:
    import torch

    rng = np.random.default_rng(0)
    specials = np.array(
        [
            0.0,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            65519.99,
            65520.0,
            1e6,
            6.1e-5,
            6.0e-8,
            2.98e-8,
            3.0e-8,
            1e-10,
            2049.0,
            2051.0,
            0.1,
            -0.3,
        ],
        np.float32,
    )
    values = np.concatenate(
        [
            specials,
            rng.normal(0, 3, 20000).astype(np.float32),
            (rng.uniform(-1, 1, 20000) * 1e-4).astype(np.float32),
        ]
    )
    half = np.empty(values.size, np.uint16)
    _native.convert(values, half, 1)
    with np.errstate(over="ignore"):  # the overflow to inf is among the cases
        expected_half = values.astype(np.float16)
    assert np.array_equal(half, expected_half.view(np.uint16))
    finite = values[np.abs(values) < 3e38]
    bf16 = np.empty(finite.size, np.uint16)
    _native.convert(finite, bf16, 2)
    expected = torch.from_numpy(finite).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(bf16.view(np.int16), expected)


def damaged_below_the_crop() -> tuple[bytes, bytes, TrainTransform]:
    """A JPEG truncated, and one corrupted, in rows far below a crop box at the top."""
    data = jpeg(photo(800, 600, seed=9), 90, "420")
    truncated = data[: int(len(data) * 0.8)]
    body = bytearray(data)
    start = int(len(data) * 0.85)
    body[start : start + 64] = bytes(range(64))  # garbage entropy data, markers included
    return truncated, bytes(body), TrainTransform(64, scale=(0.05, 0.06))


def test_damage_after_the_crop_box_is_still_reported() -> None:
    """The rows after the box are entropy-decoded (not reconstructed), so a file fails
    whatever its crop: the same set of bad files in every epoch."""
    truncated, corrupt, t = damaged_below_the_crop()
    out = np.empty((3, 64, 64), np.float32)
    for name, data in (("cut.jpg", truncated), ("bad.jpg", corrupt)):
        for seed in range(8):
            with pytest.raises(DecodeError, match=f"{name}.*corrupt or truncated"):
                load_into(data, t, np.random.default_rng(seed), out, dtype="float32", key=name)


def test_arguments_are_checked() -> None:
    image = photo(40, 50, seed=1)
    out = np.empty((3, 8, 8), np.float32)
    args = (image, 40, 50, 3)
    with pytest.raises(ValueError, match="exceeds the 40x50 image"):
        _native.resize_into(*args, (0.0, 0.0, 41.0, 50.0), out, 8, 8, False, 0, *NO_NORM)
    with pytest.raises(ValueError, match=r"\[3, 8, 9\] of this dtype needs"):
        _native.resize_into(*args, (0.0, 0.0, 40.0, 50.0), out, 8, 9, False, 0, *NO_NORM)
    with pytest.raises(ValueError, match="channels must be 1, 3 or 4"):
        _native.resize_into(image, 40, 75, 2, (0.0, 0.0, 4.0, 4.0), out, 8, 8, False, 0, *NO_NORM)
    with pytest.raises(ValueError, match="positive size"):
        _native.resize_into(*args, (0.0, 0.0, 0.0, 5.0), out, 8, 8, False, 0, *NO_NORM)
    with pytest.raises(TypeError):
        _native.resize_into(*args, (0.0, 0.0, 4.0, 4.0), out[:, :, ::2], 8, 4, False, 0, *NO_NORM)
    with pytest.raises(ValueError, match=r"filter must be 0 \(bilinear\) or 1 \(bicubic\), got 2"):
        _native.resize_into(*args, (0.0, 0.0, 4.0, 4.0), out, 8, 8, False, 0, *NO_NORM, 2)
    with pytest.raises(ValueError, match="filter must be 0"):
        _native.decode_resize_jpeg(
            jpeg(image), 1, 40, 50, (0.0, 0.0, 9.0, 9.0), out, 8, 8, False, 0, *NO_NORM, -1
        )
    with pytest.raises(_native.JpegError, match="expected 9x9"):
        _native.decode_resize_jpeg(
            jpeg(image), 1, 9, 9, (0.0, 0.0, 9.0, 9.0), out, 8, 8, False, 0, *NO_NORM
        )


def test_cmyk_and_rotated_jpegs_take_the_general_path() -> None:
    rgb = photo(120, 90, seed=4)
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=95)
    cmyk = buf.getvalue()
    assert simplejpeg.decode_jpeg_header(cmyk)[2] == "CMYK"
    t = TrainTransform(32)
    out = np.empty((3, 32, 32), np.float32)
    assert load_into(cmyk, t, np.random.default_rng(0), out, dtype="float32") == (120, 90)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("out_w", [8, 13, 224])
def test_float16_store_is_the_rounded_float32_with_flip_and_tails(flip: bool, out_w: int) -> None:
    # The store may use F16C (8 lanes, shuffled when flipped) with a scalar tail.
    image = photo(90, 120, seed=6)
    box = (3.5, 7.25, 80.0, 100.0)
    f32 = native_full(image, box, (11, out_w), flip, "float32")
    f16 = native_full(image, box, (11, out_w), flip, "float16")
    assert np.array_equal(f16.view(np.uint16), f32.astype(np.float16).view(np.uint16))


def pil_jpeg(image: np.ndarray, **options: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "JPEG", **options)
    return buf.getvalue()


@pytest.mark.parametrize(
    "options",
    [
        {"progressive": True, "quality": 85},
        {"quality": 90, "subsampling": 2},  # 4:2:0
        {"quality": 60, "subsampling": 1, "restart_marker_blocks": 3},  # 4:2:2, restarts
    ],
    ids=["progressive", "baseline420", "restart422"],
)
def test_other_jpeg_flavours_equal_a_full_decode(options: dict[str, object]) -> None:
    image = photo(301, 457, seed=11)
    data = pil_jpeg(image, **options)
    full = simplejpeg.decode_jpeg(data, colorspace="RGB")
    for box in ((0.0, 0.0, 301.0, 457.0), (120.5, 200.25, 90.0, 130.0)):
        got = native_roi(data, 1, (301, 457), box, (64, 80), True, "float32")
        assert np.array_equal(got, native_full(full, box, (64, 80), True, "float32"))


@pytest.mark.parametrize(("h", "w"), [(1, 1), (5, 7), (9, 17), (16, 16), (33, 2)])
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_tiny_images_at_every_scale(h: int, w: int, denom: int) -> None:
    image = photo(max(h, 8), max(w, 8), seed=h * 100 + w)[:h, :w].copy()
    data = jpeg(image, 92, "420")
    sh, sw = math.ceil(h / denom), math.ceil(w / denom)
    full = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=sh, min_width=sw)
    assert full.shape[:2] == (sh, sw)
    box = (0.0, 0.0, float(sh), float(sw))
    got = native_roi(data, denom, (sh, sw), box, (3, 5), False, "uint8")
    assert np.array_equal(got, native_full(full, box, (3, 5), False, "uint8"))


def test_damaged_files_raise_and_never_crash() -> None:
    """Hostile input: flipped bytes anywhere (headers included) and truncations. Every
    outcome is a clean result or a DecodeError naming the key; nothing else escapes."""
    t = TrainTransform(48)
    out = np.empty((3, 48, 48), np.float32)
    sources = [jpeg(photo(120, 160, seed=s), 85, sub) for s, sub in ((1, "420"), (2, "444"))]
    sources.append(pil_jpeg(photo(96, 130, seed=3), progressive=True, quality=80))
    rng = np.random.default_rng(2026)
    outcomes = {"ok": 0, "error": 0}
    for case in range(300):
        data = bytearray(sources[case % len(sources)])
        if case % 3 == 0:
            data = data[: int(rng.integers(2, len(data)))]
        else:
            for _ in range(int(rng.integers(1, 6))):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        try:
            load_into(
                bytes(data), t, np.random.default_rng(case), out, dtype="float32", key=f"fuzz{case}"
            )
        except DecodeError as exc:
            assert f"fuzz{case}" in str(exc)
            outcomes["error"] += 1
        else:
            assert np.isfinite(out).all()
            outcomes["ok"] += 1
    assert outcomes["error"] > 50  # the damage is found, not decoded as grey blocks


def test_native_header_read_and_its_libjpeg_fallback_give_the_same_pixels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # load_into's native path reads the header in C and falls back to libjpeg's read (then
    # walks the header again for the chroma ratio) where the C walk steps aside.
    import cv2

    from gpu_loader.datasets import photo_like

    native = native_module()
    assert native is not None
    bgr = np.ascontiguousarray(photo_like(1037, 1211, np.random.default_rng(9))[:, :, ::-1])
    files = []
    for sampling in (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420):
        ok, encoded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling])
        assert ok
        files.append(encoded.tobytes())
    factors: list[int] = []
    real_decode = native.decode_resize_jpeg

    def spy(data: bytes, denom: int, *rest: object) -> None:
        factors.append(denom)
        real_decode(data, denom, *rest)

    monkeypatch.setattr(native, "decode_resize_jpeg", spy)
    t = EvalTransform(24)
    outs = []
    for header in (native.jpeg_header, lambda data: None):
        monkeypatch.setattr(native, "jpeg_header", header)
        for data in files:
            out = np.empty((3, 24, 24), np.float32)
            load_into(data, t, np.random.default_rng(0), out, dtype="float32")
            outs.append(out)
    assert factors == [2, 8, 2, 8]  # 4:1:1 capped at 1/2 by either header read
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[1], outs[3])


# -- many JPEGs in one call (prepare_load / load_prepared / decode_resize_jpegs) ------------
def fuzzed_jpegs(count: int) -> list[bytes]:
    """Good JPEGs of several flavours and sizes, and damaged copies of them."""
    sources = [
        jpeg(photo(120, 160, seed=1), 85, "420"),
        jpeg(photo(40, 56, seed=2), 90, "444"),
        pillow_jpeg(photo(300, 200, seed=3), "L"),
        pil_jpeg(photo(96, 130, seed=4), progressive=True, quality=80),
    ]
    rng = np.random.default_rng(7)
    out = []
    for case in range(count):
        data = bytearray(sources[case % len(sources)])
        if case % 4 == 1:
            data = data[: int(rng.integers(len(data) // 2, len(data)))]
        elif case % 4 == 2:
            for _ in range(3):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("transform", [TrainTransform(48), EvalTransform(40, resize=44)])
def test_jpegs_decoded_at_once_equal_load_into_one_by_one(
    transform: TrainTransform | EvalTransform,
) -> None:
    # The same pixels bit for bit, and the same error (type and text) for each damaged file.
    from gpu_loader.ops._load import load_prepared, prepare_load
    from gpu_loader.sources import sample_stream

    datas = fuzzed_jpegs(48)
    h, w = transform.output_size
    one = np.full((len(datas), 3, h, w), np.nan, np.float32)
    many = np.full_like(one, np.nan)
    expected: list[str | None] = []
    for i, data in enumerate(datas):
        try:
            load_into(data, transform, sample_stream(5, 1, i), one[i], dtype="float32", key=f"f{i}")
        except DecodeError as exc:
            expected.append(f"{type(exc).__name__}: {exc}")
        else:
            expected.append(None)
    jobs, got, later = [], [None] * len(datas), []
    for i, data in enumerate(datas):
        try:
            job = prepare_load(
                data, transform, sample_stream(5, 1, i), many[i], dtype="float32", key=f"f{i}"
            )
        except DecodeError as exc:
            got[i] = f"{type(exc).__name__}: {exc}"
        else:
            assert job is not None  # every one of these is a JPEG the native path takes
            jobs.append(job)
            later.append(i)
    assert len(jobs) > len(datas) // 2  # most get as far as the decode
    for i, error in zip(later, load_prepared(jobs), strict=True):
        got[i] = None if error is None else f"{type(error).__name__}: {error}"
    assert got == expected
    assert sum(e is not None for e in expected) > 10  # damage found, in both
    ok = [i for i, e in enumerate(expected) if e is None]
    assert np.array_equal(one[ok], many[ok])


def test_prepare_load_leaves_other_files_to_load_into() -> None:
    from gpu_loader.ops._load import prepare_load

    t = TrainTransform(32)
    out = np.empty((3, 32, 32), np.float32)
    png = io.BytesIO()
    Image.fromarray(photo(40, 40, seed=1)).save(png, "PNG")
    rotated = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(photo(40, 60, seed=2)).save(rotated, "JPEG", exif=exif)
    for data in (png.getvalue(), rotated.getvalue()):
        assert prepare_load(data, t, np.random.default_rng(0), out, dtype="float32") is None
    with pytest.raises(DecodeError, match=r"empty\.jpg"):  # as load_into raises it
        prepare_load(
            b"\xff\xd8\xff", t, np.random.default_rng(0), out, dtype="float32", key="empty.jpg"
        )


def test_decode_resize_jpegs_checks_every_call_before_decoding_any() -> None:
    image = photo(40, 50, seed=1)
    data = jpeg(image)
    good_out = np.full((3, 8, 8), np.nan, np.float32)
    bad_out = np.empty((3, 8, 8), np.float32)
    good = (data, 1, 40, 50, (0.0, 0.0, 40.0, 50.0), good_out, 8, 8, False, 0, *NO_NORM)
    bad = (data, 3, 40, 50, (0.0, 0.0, 40.0, 50.0), bad_out, 8, 8, False, 0, *NO_NORM)
    with pytest.raises(ValueError, match="denom must be 1, 2, 4 or 8, got 3"):
        _native.decode_resize_jpegs([good, bad])
    assert np.isnan(good_out).all()  # nothing decoded
    with pytest.raises(TypeError, match="call 1 is not a tuple"):
        _native.decode_resize_jpegs([good, [1, 2]])
    with pytest.raises(TypeError, match="sequence"):
        _native.decode_resize_jpegs(5)
    assert _native.decode_resize_jpegs([]) == []
    wrong = (data, 1, 9, 9, (0.0, 0.0, 9.0, 9.0), bad_out, 8, 8, False, 0, *NO_NORM)
    assert _native.decode_resize_jpegs([good, wrong, good]) == [
        None,
        "decoder gives 40x50 at 1/1 scale, expected 9x9",
        None,
    ]
    alone = np.empty_like(good_out)
    _native.decode_resize_jpeg(*good[:5], alone, *good[6:])
    assert np.array_equal(good_out, alone)


def test_decode_resize_jpegs_refuses_bad_boxes_and_survives_a_list_changed_midway() -> None:
    # QA73: a NaN box decoded nothing and said None (or -1: "out of memory"); a box that
    # was no tuple was a SystemError; a list an argument's conversion cleared was read
    # after it was freed (a segfault).
    data = jpeg(photo(40, 50, seed=1))
    out = np.empty((3, 8, 8), np.float32)

    def call(box: object) -> tuple[object, ...]:
        return (data, 1, 40, 50, box, out, 8, 8, False, 0, *NO_NORM)

    for box in ((math.nan, 0.0, 9.0, 9.0), (0.0, math.inf, 9.0, 9.0)):
        with pytest.raises(ValueError, match="crop box must be finite"):
            _native.decode_resize_jpegs([call(box)])
        with pytest.raises(ValueError, match="crop box must be finite"):
            _native.decode_resize_jpeg(*call(box))
    with pytest.raises(TypeError, match="must be tuples"):
        _native.decode_resize_jpeg(*call([0.0, 0.0, 9.0, 9.0]))
    calls: list[tuple[object, ...]] = []

    class Clears:
        def __index__(self) -> int:
            calls.clear()
            return 8

    calls += [
        call((0.0, 0.0, 9.0, 9.0)),
        (data, 1, 40, 50, (0.0, 0.0, 9.0, 9.0), out, Clears(), 8, False, 0, *NO_NORM),
    ]
    assert _native.decode_resize_jpegs(calls) == [None, None] and calls == []
