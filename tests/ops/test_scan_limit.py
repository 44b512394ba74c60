"""A JPEG of more scans than `MAX_JPEG_SCANS` is refused before a decoder walks them: each
scan of a progressive JPEG is a pass over the whole image, and a crafted file of thousands
of tiny scans held a decode thread for seconds to minutes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpu_loader as gl
from gpu_loader.ops import DecodeError, EvalTransform, TrainTransform, decode, load_into
from gpu_loader.ops._backend import native_module
from gpu_loader.ops._decode import (
    DEFAULT_MAX_PIXELS,
    MAX_JPEG_SCANS,
    SCAN_PASSES,
    count_scans,
    scan_limit,
)
from gpu_loader.ops._formats import walk_jpeg_data
from gpu_loader.sources import FileList
from tests.ops._jpeg_scans import many_scans
from tests.ops.conftest import jpeg

LIMIT = "more than the {} a JPEG of its size may have here"


def test_the_native_decoder_stops_at_the_same_limit() -> None:
    native = native_module()
    assert native is not None
    assert native.MAX_JPEG_SCANS == MAX_JPEG_SCANS == 256


def test_large_images_may_have_fewer_scans() -> None:
    assert scan_limit(480, 640, DEFAULT_MAX_PIXELS) == 256
    assert scan_limit(9456, 9456, DEFAULT_MAX_PIXELS) == SCAN_PASSES == 32
    assert scan_limit(4000, 6000, DEFAULT_MAX_PIXELS) == 119  # a 24 Mpx photo
    assert scan_limit(9456, 9456, 4 * DEFAULT_MAX_PIXELS) == 128  # max_pixels raised


def test_the_crafted_files_are_valid_jpegs_of_that_many_scans() -> None:
    for scans in (1, 7, MAX_JPEG_SCANS + 1):
        data = many_scans(scans)
        assert data.count(b"\xff\xda") == scans == count_scans(data)
    image = decode(many_scans(MAX_JPEG_SCANS))  # simplejpeg strict: no warning either
    assert image.array.shape == (16, 16, 3) and np.all(image.array == 128)


def test_the_native_and_python_counts_agree_and_stop_at_the_end_of_image() -> None:
    native = native_module()
    assert native is not None
    rng = np.random.default_rng(3)
    photo = jpeg(rng.integers(0, 256, (40, 50, 3), np.uint8))
    cases = [many_scans(n) for n in (1, 2, 40, 300)] + [photo, photo[:-2], photo[:10], b""]
    # A motion photo's layout: a JPEG, then its video (bytes that hold 0xFF 0xDA pairs).
    cases.append(many_scans(3) + b"\xff\xda\x00\x08" * 400)
    for data in cases:
        assert native.jpeg_scans(data) == walk_jpeg_data(data)[1], data[:20]
    assert native.jpeg_scans(cases[-1]) == 3


def test_decode_refuses_one_scan_more_naming_the_count(cpu_backend: str) -> None:
    with pytest.raises(DecodeError, match=f"'k': 257 scans, {LIMIT.format(256)}"):
        decode(many_scans(MAX_JPEG_SCANS + 1), key="k")
    with pytest.raises(DecodeError, match=f"'k': 881 scans, {LIMIT.format(256)}"):
        decode(memoryview(bytearray(many_scans(881))), key="k")


def test_markers_after_the_end_of_image_are_not_scans(cpu_backend: str) -> None:
    # QA53: 20 MB of video after a photo's end of image held 292 0xFF 0xDA pairs, and
    # decode() refused the photo as a crafted file while the native path took it.
    data = many_scans(3) + b"\xff\xda" * 1000
    assert np.all(decode(data, key="k").array == 128)
    out = np.empty((3, 8, 8), np.float32)
    load_into(data, TrainTransform(8), np.random.default_rng(0), out, dtype="float32")


@pytest.mark.parametrize("transform", [TrainTransform(12), EvalTransform(12, resize=14)])
def test_the_per_sample_path_takes_the_limit_and_refuses_one_more(
    cpu_backend: str, transform: TrainTransform | EvalTransform
) -> None:
    out = np.empty((3, 12, 12), np.float32)
    rng = np.random.default_rng(0)
    grey = (128 / 255 - np.array(transform.mean)) / np.array(transform.std)
    # At the default max_pixels a 64 x 64 image may have 256 scans; with max_pixels
    # 5,120 (1.25 x its pixels), 40.
    for max_pixels, limit in ((DEFAULT_MAX_PIXELS, 256), (5120, 40)):
        assert scan_limit(64, 64, max_pixels) == limit
        ok = many_scans(limit, 64)
        assert load_into(ok, transform, rng, out, dtype="float32", max_pixels=max_pixels) == (
            64,
            64,
        )
        np.testing.assert_allclose(out, np.broadcast_to(grey[:, None, None], out.shape), atol=1e-5)
        for scans in (limit + 1, 600):
            # The native decoder's progress monitor stops it; the Python paths count first.
            with pytest.raises(DecodeError, match=f"'k': (\\d+ scans, )?{LIMIT.format(limit)}"):
                load_into(
                    many_scans(scans, 64),
                    transform,
                    rng,
                    out,
                    dtype="float32",
                    key="k",
                    max_pixels=max_pixels,
                )


def test_thousands_of_repeated_scans_are_refused_before_decoding(cpu_backend: str) -> None:
    # The other shape of the attack: one tiny scan repeated (a bogus progression, which
    # libjpeg only warns of, and simplejpeg reported after walking every scan: 26 s for
    # 20,000 scans of a 4000 x 4000 image, 714 KB).
    data = many_scans(2)
    scan = data[data.rindex(b"\xff\xda") : -2]
    crafted = data[:-2] + scan * 3000 + data[-2:]
    with pytest.raises(DecodeError, match=f"3,002 scans, {LIMIT.format(256)}"):
        decode(crafted, key="k")


def test_a_loader_reports_the_file_with_its_key_and_delivers_the_rest(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    files = []
    for i in range(3):
        path = tmp_path / f"good{i}.jpg"
        path.write_bytes(jpeg(rng.integers(0, 256, (40, 50, 3), np.uint8)))
        files.append((str(path), i))
    crafted = tmp_path / "crafted.jpg"
    crafted.write_bytes(many_scans(MAX_JPEG_SCANS + 1, 64))
    files.insert(1, (str(crafted), 9))
    loader = gl.ImageLoader(
        FileList(files),
        batch_size=4,
        transform=TrainTransform(16),
        on_error="skip",
        max_failures=2,
    )
    labels = [int(v) for _, y in loader for v in y]
    assert sorted(labels) == [0, 1, 2]
    (failed,) = loader.failed_samples()
    assert failed.key == str(crafted) and failed.stage == "decode"
    assert LIMIT.format(256) in failed.error
