"""transform_into / load_into vs an independent Pillow reference; dtypes; out handling."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import gpu_loader.ops._load as load_module
from gpu_loader.ops import (
    CropParams,
    DecodedImage,
    DecodeError,
    EvalTransform,
    TrainTransform,
    decode,
    load_into,
    probe_size,
    transform_into,
)
from gpu_loader.ops._resample import resize_reference, weight_matrix
from tests.ops.conftest import Photo

TRANSFORMS = [
    EvalTransform(224),
    EvalTransform(64),
    EvalTransform((96, 160), resize=180),
    EvalTransform((96, 160), resize=(150, 170)),  # squash, then crop
    TrainTransform(224),
    TrainTransform(48),
    TrainTransform((128, 96), scale=(0.5, 1.0)),
]


def pillow_reference(
    data: bytes, transform: TrainTransform | EvalTransform, rng: np.random.Generator
) -> np.ndarray:
    """Full decode, crop box + BILINEAR (or BICUBIC) resize, flip, normalise: float64 [3, H, W]."""
    with Image.open(io.BytesIO(data)) as opened:
        upright = ImageOps.exif_transpose(opened) if transform.exif_orientation else opened
        im = upright.convert("RGB")
    p = transform.make_params(im.height, im.width, rng)
    box = (p.left, p.top, min(p.right, im.width), min(p.bottom, im.height))
    out_h, out_w = transform.output_size
    resample = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
    res = im.resize((out_w, out_h), resample[transform.interpolation], box=box)
    if p.flip:
        res = res.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = np.asarray(res, np.float64) / 255.0
    return ((x - np.array(transform.mean)) / np.array(transform.std)).transpose(2, 0, 1)


def psnr01(a: np.ndarray, b: np.ndarray, transform: TrainTransform | EvalTransform) -> float:
    """PSNR on the [0, 1] pixel scale of two normalised CHW images."""
    std = np.array(transform.std)[:, None, None]
    mse = float(np.mean(((a.astype(np.float64) - b) * std) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


# Every test here runs on both CPU backends (native C and Pillow): same function, same bounds.
pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture
def scales_used(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Records the DCT scale load_into chooses for every JPEG (both backends ask the same rule)."""
    seen: list[float] = []
    real = load_module.dct_factor_for

    def spy(*args: object, **kwargs: object) -> int:
        factor = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(1.0 / factor)
        return factor

    monkeypatch.setattr(load_module, "dct_factor_for", spy)
    return seen


@pytest.mark.parametrize("transform", TRANSFORMS, ids=repr)
def test_psnr_against_pillow_reference_for_every_image(
    photos: list[Photo], transform: TrainTransform | EvalTransform, scales_used: list[float]
) -> None:
    out = np.full((3, *transform.output_size), np.nan, np.float32)
    for photo in photos:
        for seed in range(3):
            size = load_into(
                photo.data,
                transform,
                np.random.default_rng(seed),
                out,
                dtype="float32",
                key=photo.name,
            )
            assert size == (photo.height, photo.width)
            ref = pillow_reference(photo.data, transform, np.random.default_rng(seed))
            value = psnr01(out, ref, transform)
            assert value >= 35.0, (photo.name, seed, value)
    if transform.output_size[0] <= 128:
        # Small outputs from big photos must have taken the reduced-size decode path.
        assert min(scales_used) <= 0.25


def test_reduced_decode_path_is_taken_and_stays_close(
    photos: list[Photo], scales_used: list[float]
) -> None:
    big = next(p for p in photos if p.height == 2000)
    t = EvalTransform(64)
    out = np.empty((3, 64, 64), np.float32)
    load_into(big.data, t, np.random.default_rng(0), out, dtype="float32")
    assert scales_used == [0.125]
    assert psnr01(out, pillow_reference(big.data, t, np.random.default_rng(0)), t) >= 35.0


def test_squash_resize_matches_resize_hw_then_centre_crop(photos: list[Photo]) -> None:
    # torchvision's Resize((h, w)) + CenterCrop: the whole image squashed, then cropped.
    t = EvalTransform((96, 128), resize=(120, 150))
    for photo in photos[:4]:
        out = np.empty((3, 96, 128), np.float32)
        load_into(photo.data, t, np.random.default_rng(0), out, dtype="float32")
        with Image.open(io.BytesIO(photo.data)) as opened:
            im = ImageOps.exif_transpose(opened).convert("RGB")
        squashed = im.resize((150, 120), Image.Resampling.BILINEAR)
        top, left = round((120 - 96) / 2), round((150 - 128) / 2)
        ref = np.asarray(squashed.crop((left, top, left + 128, top + 96)), np.float64) / 255.0
        ref = ((ref - np.array(t.mean)) / np.array(t.std)).transpose(2, 0, 1)
        assert psnr01(out, ref, t) >= 40.0, photo.name


def test_reduced_decode_false_decodes_fine_texture_at_full_size(scales_used: list[float]) -> None:
    # Stripes 12 px apart, 4:2:2 chroma (QA): at 1/4 scale they survive the DCT decode
    # and alias in the short resize that follows, 28 dB from the full-decode reference.
    y, x = np.mgrid[0:900, 0:1000].astype(np.float32)
    pixels = np.stack(
        [
            128 + 100 * np.sin(2 * np.pi * x / 12),
            128 + 60 * np.cos(2 * np.pi * y / 37),
            128 + 0 * x,
        ],
        -1,
    )
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, "JPEG", quality=90, subsampling=1)
    data = buf.getvalue()
    got = {}
    for reduced in (True, False):
        t = EvalTransform(112, resize=128, reduced_decode=reduced)
        out = np.empty((3, 112, 112), np.float32)
        load_into(data, t, np.random.default_rng(0), out, dtype="float32")
        got[reduced] = psnr01(out, pillow_reference(data, t, np.random.default_rng(0)), t)
    assert scales_used == [0.25]  # asked once: the full-size decode does not ask
    assert got[False] >= 50.0 and got[False] > got[True] + 10, got
    with pytest.raises(TypeError, match="reduced_decode"):
        TrainTransform(224, reduced_decode=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_rotated_jpeg_through_load_into(orientation: int, scales_used: list[float]) -> None:
    # Sides that are not multiples of 8: a 1/8 decode's last pixel stands for a padded
    # edge block, which an orientation that flips an axis puts first (QA: 22-30 dB).
    from gpu_loader.datasets import photo_like

    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(photo_like(601, 903, np.random.default_rng(5))).save(
        buf, "JPEG", quality=92, subsampling=0, exif=exif.tobytes()
    )
    data = buf.getvalue()
    swapped = orientation >= 5
    for t in (EvalTransform(24), EvalTransform(64), TrainTransform(100)):
        out = np.empty((3, *t.output_size), np.float32)
        size = load_into(data, t, np.random.default_rng(1), out, dtype="float32")
        assert size == ((903, 601) if swapped else (601, 903))
        assert psnr01(out, pillow_reference(data, t, np.random.default_rng(1)), t) >= 35.0
    assert 0.125 in scales_used  # the 1/8 decode was exercised


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_exif_orientation_false_uses_the_pixels_as_stored(orientation: int) -> None:
    # torchvision's default loader ignores EXIF: a model evaluated that way sees the
    # stored pixels, and exif_orientation=False matches it (QA: 8.8 dB apart otherwise).
    from gpu_loader.datasets import photo_like

    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(photo_like(601, 903, np.random.default_rng(5))).save(
        buf, "JPEG", quality=92, exif=exif.tobytes()
    )
    data = buf.getvalue()
    for t in (
        EvalTransform(64, exif_orientation=False),
        TrainTransform(100, exif_orientation=False),
    ):
        out = np.empty((3, *t.output_size), np.float32)
        assert load_into(data, t, np.random.default_rng(1), out, dtype="float32") == (601, 903)
        assert psnr01(out, pillow_reference(data, t, np.random.default_rng(1)), t) >= 35.0
    assert probe_size(data, exif=False) == (601, 903)
    assert decode(data, exif=False).array.shape == (601, 903, 3)
    with pytest.raises(TypeError, match="exif_orientation"):
        EvalTransform(64, exif_orientation="no")  # type: ignore[arg-type]


def test_4_1_1_chroma_is_not_decoded_below_half_scale(scales_used: list[float]) -> None:
    # libjpeg-turbo's scaled chroma IDCT falls to 27 dB at 1/8 for 4:1:1 (QA run).
    import cv2

    from gpu_loader.datasets import photo_like

    bgr = photo_like(1037, 1211, np.random.default_rng(9))[:, :, ::-1]
    flags = [cv2.IMWRITE_JPEG_QUALITY, 95]
    flags += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411]
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(bgr), flags)
    assert ok
    data = encoded.tobytes()
    for t in (EvalTransform(24), EvalTransform(64)):
        out = np.empty((3, *t.output_size), np.float32)
        load_into(data, t, np.random.default_rng(0), out, dtype="float32")
        assert psnr01(out, pillow_reference(data, t, np.random.default_rng(0)), t) >= 35.0
    assert decode(data, min_size=(24, 24)).scale == 0.5


def float64_path(
    image: DecodedImage, p: CropParams, size: tuple[int, int], t: TrainTransform | EvalTransform
) -> np.ndarray:
    """The spec in float64 (resize_reference, no uint8 rounding between passes)."""
    resized = resize_reference(image.array, p, size) / 255.0
    return ((resized - np.array(t.mean)) / np.array(t.std)).transpose(2, 0, 1)


POISON = {"float32": np.nan, "float16": np.nan, "bfloat16": 0x7FC1, "uint8": 0xAB}
OUT_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.int16, "uint8": np.uint8}


def bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("flip", [False, True])
def test_dtypes_agree_with_the_float64_path(photos: list[Photo], dtype: str, flip: bool) -> None:
    t = TrainTransform((72, 88))
    image = decode(photos[1].data)
    p = CropParams(top=20.5, left=31.25, height=300.0, width=401.5, flip=flip)
    ref = float64_path(image, p, (72, 88), t)
    out = np.full((3, 72, 88), POISON[dtype], OUT_DTYPE[dtype])
    transform_into(image, p, out, mean=t.mean, std=t.std, dtype=dtype)  # type: ignore[arg-type]
    # Every element is compared, so any unwritten (poisoned) element fails.
    std = np.array(t.std)[:, None, None]
    if dtype == "uint8":
        pixels = (ref * std + np.array(t.mean)[:, None, None]) * 255
        assert np.abs(out.astype(float) - pixels).max() <= 1.0 + 1e-6
        return
    got = bf16_to_f64(out) if dtype == "bfloat16" else out.astype(np.float64)
    # Pillow rounds to uint8 between passes and at the end: about one level off the spec,
    # i.e. 1/255/std in normalised units; plus the storage precision of the dtype.
    level = 1.0 / 255 / std
    precision = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    assert np.all(np.abs(got - ref) <= 1.01 * level + precision * np.abs(ref) + 1e-6)


def test_bfloat16_bits_are_round_to_nearest_even_of_float32(photos: list[Photo]) -> None:
    import torch

    t = EvalTransform(56)
    image = decode(photos[0].data)
    p = t.make_params(image.height, image.width, np.random.default_rng(0))
    f32 = np.empty((3, 56, 56), np.float32)
    bf16 = np.empty((3, 56, 56), np.uint16)
    transform_into(image, p, f32, mean=t.mean, std=t.std, dtype="float32")
    transform_into(image, p, bf16, mean=t.mean, std=t.std, dtype="bfloat16")
    expected = torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(bf16.view(np.int16), expected)


def test_float16_is_the_rounded_float32(photos: list[Photo]) -> None:
    t = EvalTransform(56)
    image = decode(photos[0].data)
    p = t.make_params(image.height, image.width, np.random.default_rng(0))
    f32 = np.empty((3, 56, 56), np.float32)
    f16 = np.empty((3, 56, 56), np.float16)
    transform_into(image, p, f32, mean=t.mean, std=t.std, dtype="float32")
    transform_into(image, p, f16, mean=t.mean, std=t.std, dtype="float16")
    assert np.array_equal(f16, f32.astype(np.float16))


def test_plain_array_input_and_slot_of_a_batch(photos: list[Photo]) -> None:
    t = TrainTransform(40)
    image = decode(photos[2].data)
    p = t.make_params(image.height, image.width, np.random.default_rng(3))
    batch = np.zeros((4, 3, 40, 40), np.float32)
    transform_into(image, p, batch[2], mean=t.mean, std=t.std, dtype="float32")
    alone = np.empty((3, 40, 40), np.float32)
    transform_into(
        np.ascontiguousarray(image.array), p, alone, mean=t.mean, std=t.std, dtype="float32"
    )
    assert np.array_equal(batch[2], alone)
    assert not batch[[0, 1, 3]].any()  # neighbouring slots untouched


def test_input_image_is_not_modified(photos: list[Photo]) -> None:
    image = decode(photos[0].data)
    before = image.array.copy()
    out = np.empty((3, 32, 32), np.float32)
    transform_into(
        image,
        CropParams(0, 0, 50, 60, flip=True),
        out,
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
        dtype="float32",
    )
    assert np.array_equal(image.array, before)


@pytest.mark.parametrize(
    ("out", "dtype", "match"),
    [
        (np.empty((3, 8, 8), np.float64), "float32", "float32"),
        (np.empty((8, 8, 3), np.float32), "float32", r"\[3, H, W\]"),
        (np.empty((3, 8, 8), np.float32), "float64", "dtype"),
        (np.empty((3, 8, 8), np.float32), "bfloat16", "int16 or uint16"),
    ],
)
def test_bad_out_is_rejected(photos: list[Photo], out: np.ndarray, dtype: str, match: str) -> None:
    image = decode(photos[0].data)
    with pytest.raises(ValueError, match=match):
        transform_into(
            image, CropParams(0, 0, 10, 10), out, mean=(0,) * 3, std=(1,) * 3, dtype=dtype
        )  # type: ignore[arg-type]


def test_box_outside_the_image_is_an_error(photos: list[Photo]) -> None:
    image = decode(photos[0].data)
    out = np.empty((3, 8, 8), np.float32)
    with pytest.raises(ValueError, match="exceeds"):
        transform_into(
            image,
            CropParams(0, 0, image.height + 5, 10),
            out,
            mean=(0,) * 3,
            std=(1,) * 3,
            dtype="float32",
        )


def test_load_into_raises_decode_error_with_key() -> None:
    out = np.empty((3, 8, 8), np.float32)
    for data in (b"", b"not an image", b"\xff\xd8\xff\xe0\x00\x10JFIF"):
        with pytest.raises(DecodeError, match="shard-3/k42"):
            load_into(
                data,
                EvalTransform(8),
                np.random.default_rng(0),
                out,
                dtype="float32",
                key="shard-3/k42",
            )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_and_numpy_casts_agree(dtype: str) -> None:
    from gpu_loader.ops._transform import cast_into

    values = np.random.default_rng(0).normal(0, 2, (3, 50, 70)).astype(np.float32)
    values[0, 0, :4] = [1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, 1e-30]  # ties and tiny values
    outs = []
    for use_torch in (True, False):
        out = np.full((3, 50, 70), 0x7FC1, np.int16 if dtype == "bfloat16" else np.float16)
        cast_into(values.copy(), out, dtype, use_torch=use_torch)
        outs.append(out.view(np.int16))
    assert np.array_equal(outs[0], outs[1])


def test_load_into_names_a_wrong_out_before_decoding(photos: list[Photo]) -> None:
    import torch

    t = TrainTransform(16)
    with pytest.raises(TypeError, match="`out` must be a numpy array"):
        load_into(
            photos[0].data,
            t,
            np.random.default_rng(0),
            torch.empty(3, 16, 16),  # type: ignore[arg-type]
            dtype="float32",
        )
    with pytest.raises(ValueError, match=r"`out` must have shape \[3, H, W\]"):
        load_into(
            photos[0].data,
            t,
            np.random.default_rng(0),
            np.empty((16, 16), np.float32),
            dtype="float32",
        )


BICUBIC = [
    EvalTransform(224, interpolation="bicubic"),
    EvalTransform(64, interpolation="bicubic"),
    TrainTransform(96, interpolation="bicubic"),
    TrainTransform(48, interpolation="bicubic", reduced_decode=False),
]


@pytest.mark.parametrize("transform", BICUBIC, ids=repr)
def test_bicubic_against_pillows_bicubic_for_every_image(
    photos: list[Photo], transform: TrainTransform | EvalTransform
) -> None:
    # timm's and many ViT recipes' interpolation="bicubic": Pillow's BICUBIC, antialiased.
    out = np.full((3, *transform.output_size), np.nan, np.float32)
    bilinear = np.empty_like(out)
    as_bilinear = dataclasses.replace(transform, interpolation="bilinear")
    differs = 0
    for photo in photos:
        for seed in range(2):
            load_into(photo.data, transform, np.random.default_rng(seed), out, dtype="float32")
            ref = pillow_reference(photo.data, transform, np.random.default_rng(seed))
            value = psnr01(out, ref, transform)
            assert value >= 35.0, (photo.name, seed, value)
            rng = np.random.default_rng(seed)
            load_into(photo.data, as_bilinear, rng, bilinear, dtype="float32")
            differs += not np.array_equal(out, bilinear)
    assert differs == 2 * len(photos)  # the filter is really in use


def blocky(seed: int, height: int, width: int) -> np.ndarray:
    """Hard-edged colour blocks: where bicubic's negative lobes overshoot 0-255 most."""
    rng = np.random.default_rng(seed)
    cells = rng.choice(np.array([0, 255], np.uint8), (height // 6 + 1, width // 6 + 1, 3))
    return np.ascontiguousarray(np.repeat(np.repeat(cells, 6, 0), 6, 1)[:height, :width])


@pytest.mark.parametrize("seed", range(6))
def test_bicubic_where_it_overshoots_agrees_with_its_references(seed: int) -> None:
    # Hard 0/255 edges, where bicubic's negative lobes overshoot 0-255 most. The native
    # path runs both passes in float and clamps once: torch's antialiased bicubic (the
    # torchvision tensor path) and the float64 spec, within rounding. Pillow clamps to
    # 8 bits between its passes as well; the Pillow backend is Pillow itself.
    from gpu_loader.ops import cpu_backend

    rng = np.random.default_rng(seed)
    height, width = int(rng.integers(20, 150)), int(rng.integers(20, 190))
    image = blocky(seed, height, width)
    size = (int(rng.integers(16, 120)), int(rng.integers(16, 120)))
    whole = CropParams(top=0, left=0, height=height, width=width)
    out = np.empty((3, *size), np.uint8)
    transform_into(
        image, whole, out, mean=(0, 0, 0), std=(1, 1, 1), dtype="uint8", interpolation="bicubic"
    )
    raw = np.einsum(
        "ih,hwc->iwc",
        weight_matrix(height, 0, height, size[0], "bicubic"),
        image.astype(np.float64),
    )
    assert raw.min() < -1 or raw.max() > 256  # it does overshoot here
    pil = Image.fromarray(image).resize((size[1], size[0]), Image.Resampling.BICUBIC)
    if cpu_backend() == "pillow":
        np.testing.assert_array_equal(out, np.asarray(pil).transpose(2, 0, 1))
        return
    ref = resize_reference(image, whole, size, "bicubic").transpose(2, 0, 1)
    assert np.abs(out - ref).max() <= 0.5 + 1e-3  # rounding to nearest
    batch = torch.from_numpy(image).permute(2, 0, 1)[None].double()
    aa = torch.nn.functional.interpolate(batch, size=size, mode="bicubic", antialias=True)
    assert np.abs(out - aa[0].clamp(0, 255).numpy()).max() <= 0.5 + 1e-3
    # Pillow's clamp between the passes shows at these edges (~12-18 levels here; 24 for a checkerboard blown up 8x).
    assert np.abs(out.astype(int) - np.asarray(pil).transpose(2, 0, 1)).max() <= 24


def test_an_unknown_interpolation_is_refused() -> None:
    with pytest.raises(ValueError, match="`interpolation` must be one of"):
        TrainTransform(224, interpolation="nearest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`interpolation` must be one of"):
        EvalTransform(224, interpolation="BICUBIC")  # type: ignore[arg-type]


def test_a_box_over_the_edge_by_round_off_is_clamped_and_further_is_refused() -> None:
    from gpu_loader.ops._transform import clamp_box

    over = CropParams(top=10.0, left=0.0, height=40.0 + 5e-4, width=60.0 + 5e-4, flip=False)
    assert clamp_box(over, 50, 60) == (0.0, 10.0, 60.0, 50.0)
    for height, width in ((40.5, 60.0), (40.0, 60.01)):
        outside = CropParams(top=10.0, left=0.0, height=height, width=width, flip=False)
        with pytest.raises(ValueError, match="exceeds the 50x60 image"):
            clamp_box(outside, 50, 60)


def test_flip_reaches_an_out_that_is_not_contiguous(cpu_backend: str) -> None:
    # A view into a larger batch tensor (every other row, say) takes the strided path.
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    kw: dict[str, Any] = {"mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25), "dtype": "float32"}
    box = {"top": 3.0, "left": 5.0, "height": 30.0, "width": 40.0}
    for flip in (False, True):
        params = CropParams(**box, flip=flip)
        dense = np.empty((3, 16, 20), np.float32)
        transform_into(image, params, dense, **kw)
        holder = np.zeros((3, 16, 40), np.float32)
        strided = holder[:, :, ::2]
        assert not strided.flags.c_contiguous
        transform_into(image, params, strided, **kw)
        # Within one level (native: the strided out takes Pillow's uint8 resize).
        np.testing.assert_allclose(strided, dense, atol=1.01 / 255 / 0.25)
    np.testing.assert_allclose(dense[:, :, ::-1], _unflipped(image, box, kw), atol=1e-5)


def _unflipped(image: np.ndarray, box: dict[str, float], kw: dict[str, Any]) -> np.ndarray:
    out = np.empty((3, 16, 20), np.float32)
    transform_into(image, CropParams(**box, flip=False), out, **kw)
    return out
