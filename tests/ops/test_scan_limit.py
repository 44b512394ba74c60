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
from gpu_loader.ops._decode import MAX_JPEG_SCANS
from gpu_loader.sources import FileList
from tests.ops._jpeg_scans import many_scans
from tests.ops.conftest import jpeg

LIMIT = "more than the 256 scans a JPEG may have here"


def test_the_native_decoder_stops_at_the_same_limit() -> None:
    native = native_module()
    assert native is not None
    assert native.MAX_JPEG_SCANS == MAX_JPEG_SCANS == 256


def test_the_crafted_files_are_valid_jpegs_of_that_many_scans() -> None:
    for scans in (1, 7, MAX_JPEG_SCANS + 1):
        data = many_scans(scans)
        assert data.count(b"\xff\xda") == scans
    image = decode(many_scans(MAX_JPEG_SCANS))  # simplejpeg strict: no warning either
    assert image.array.shape == (16, 16, 3) and np.all(image.array == 128)


def test_decode_refuses_one_scan_more_naming_the_count(cpu_backend: str) -> None:
    with pytest.raises(DecodeError, match=f"'k': 257 scan markers, {LIMIT}"):
        decode(many_scans(MAX_JPEG_SCANS + 1), key="k")
    with pytest.raises(DecodeError, match=f"'k': 881 scan markers, {LIMIT}"):
        decode(memoryview(bytearray(many_scans(881))), key="k")


@pytest.mark.parametrize("transform", [TrainTransform(12), EvalTransform(12, resize=14)])
def test_the_per_sample_path_takes_the_limit_and_refuses_one_more(
    cpu_backend: str, transform: TrainTransform | EvalTransform
) -> None:
    out = np.empty((3, 12, 12), np.float32)
    rng = np.random.default_rng(0)
    assert load_into(many_scans(MAX_JPEG_SCANS, 64), transform, rng, out, dtype="float32") == (
        64,
        64,
    )
    grey = (128 / 255 - np.array(transform.mean)) / np.array(transform.std)
    np.testing.assert_allclose(out, np.broadcast_to(grey[:, None, None], out.shape), atol=1e-5)
    for scans in (MAX_JPEG_SCANS + 1, 600):
        # The native decoder's progress monitor stops it; the Python paths count first.
        with pytest.raises(DecodeError, match=f"'k': (\\d+ scan markers, )?{LIMIT}"):
            load_into(many_scans(scans, 64), transform, rng, out, dtype="float32", key="k")


def test_thousands_of_repeated_scans_are_refused_before_decoding(cpu_backend: str) -> None:
    # The other shape of the attack: one tiny scan repeated (a bogus progression, which
    # libjpeg only warns of, and simplejpeg reported after walking every scan: 26 s for
    # 20,000 scans of a 4000 x 4000 image, 714 KB).
    data = many_scans(2)
    scan = data[data.rindex(b"\xff\xda") : -2]
    crafted = data[:-2] + scan * 3000 + data[-2:]
    with pytest.raises(DecodeError, match=f"3,002 scan markers, {LIMIT}"):
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
    assert failed.key == str(crafted) and failed.stage == "decode" and LIMIT in failed.error
