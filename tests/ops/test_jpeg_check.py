"""jpeg_data_damage: the GPU path's check of a JPEG's compressed data. Whole files of every
kind pass; damage that breaks the marker structure is named; the native walk agrees with
the Python one on every input."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from gpu_loader.datasets import photo_like
from gpu_loader.ops import _jpeg_check
from gpu_loader.ops._backend import native_module
from gpu_loader.ops._formats import walk_jpeg_data
from gpu_loader.ops._jpeg_check import damage_walk, jpeg_data_damage
from tests.ops.conftest import pillow_jpeg


def photo(h: int, w: int, seed: int) -> np.ndarray:
    return photo_like(h, w, np.random.default_rng(seed))


def whole_files() -> dict[str, bytes]:
    image = photo_like(120, 160, np.random.default_rng(0))
    return {
        "baseline": bytes(simplejpeg.encode_jpeg(image, quality=85)),
        "progressive": pillow_jpeg(photo(90, 130, 1), progressive=True),
        "restarts": pillow_jpeg(photo(100, 140, 2), restart_marker_rows=1),
        "progressive restarts": pillow_jpeg(
            photo(64, 96, 3), progressive=True, restart_marker_blocks=3
        ),
        "grey": pillow_jpeg(photo(50, 70, 4), mode="L"),
        "1x1": bytes(simplejpeg.encode_jpeg(image[:1, :1].copy(), quality=85)),
    }


def scan_start(data: bytes) -> int:
    return data.index(b"\xff\xda") + 2 + int.from_bytes(data[data.index(b"\xff\xda") + 2 :][:2])


@pytest.fixture(params=["native", "python"])
def walker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(_jpeg_check, "native_module", lambda: None)
    elif native_module() is None:
        pytest.skip("the native extension is not built")
    return str(request.param)


@pytest.mark.parametrize("name", sorted(whole_files()))
def test_whole_files_pass(walker: str, name: str) -> None:
    data = whole_files()[name]
    assert jpeg_data_damage(data) is None
    # What follows the end of the image is not its data (a second image, padding).
    assert jpeg_data_damage(data + b"\xff\x12junk" * 3) is None
    # Fill bytes before a marker are allowed.
    assert jpeg_data_damage(data[:-2] + b"\xff\xff\xff\xd9") is None


def test_a_restart_interval_of_256_or_more_is_read_whole(walker: str) -> None:
    # Both bytes of the interval: read as its low byte, 256 was 0 ("no interval"), and
    # every restart marker looked like damage.
    data = pillow_jpeg(photo(512, 512, 5), restart_marker_blocks=256)
    dri = data.index(b"\xff\xdd")
    assert data[dri + 4 : dri + 6] == b"\x01\x00" and b"\xff\xd0" in data[scan_start(data) :]
    assert jpeg_data_damage(data) is None


def test_a_tem_marker_between_scans_is_allowed(walker: str) -> None:
    # TEM (0xFF01) has no length and may sit where markers do; libjpeg reads such a file.
    data = whole_files()["progressive"]
    second = data.index(b"\xff\xda", scan_start(data))
    assert jpeg_data_damage(data[:second] + b"\xff\x01" + data[second:]) is None


def test_a_file_cut_short_is_named(walker: str) -> None:
    data = whole_files()["baseline"]
    assert jpeg_data_damage(data[: len(data) * 2 // 3]) == (
        f"no end-of-image marker: the file is cut short at byte {len(data) * 2 // 3}"
    )
    assert "cut short" in (jpeg_data_damage(data[:-1]) or "")


def test_overwritten_bytes_that_break_the_markers_are_named(walker: str) -> None:
    data = whole_files()["baseline"]
    at = scan_start(data) + 400
    # A restart marker in a file without a restart interval (QA32's damaged file).
    damaged = data[:at] + b"\xff\xd5" + b"\x00" * 50 + data[at + 52 :]
    assert jpeg_data_damage(damaged) == f"restart marker 5 at byte {at} with no restart interval"
    stray = data[:at] + b"\xff\xc0" + data[at + 2 :]
    assert jpeg_data_damage(stray) == f"marker 0xC0 inside the compressed data at byte {at}"
    # A table segment whose length runs past the end.
    past = data[:at] + b"\xff\xc4\xff\xf0" + data[at + 4 :]
    assert jpeg_data_damage(past) == f"a segment at byte {at} runs past the end of the file"
    assert jpeg_data_damage(data[:at] + b"\xff\xfe\x00") == f"a segment cut short at byte {at}"


def test_restart_markers_out_of_sequence_are_named(walker: str) -> None:
    data = whole_files()["restarts"]
    first = data.index(b"\xff\xd0", scan_start(data))
    swapped = data[:first] + b"\xff\xd3" + data[first + 2 :]
    assert jpeg_data_damage(swapped) == f"restart marker 3 at byte {first} where 0 was due"


def test_a_header_without_a_scan_is_left_to_the_decoder(walker: str) -> None:
    data = whole_files()["baseline"]
    assert jpeg_data_damage(data[: data.index(b"\xff\xda")]) is None
    assert jpeg_data_damage(b"") is None and jpeg_data_damage(b"\xff\xd8") is None


def test_the_native_walk_agrees_with_the_python_one() -> None:
    native = native_module()
    if native is None:
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(7)
    found = 0
    for data in whole_files().values():
        for _ in range(300):
            damaged = bytearray(data[: int(rng.integers(0, len(data) + 1))])
            for _ in range(int(rng.integers(0, 5))):
                if len(damaged) > 2:
                    at = int(rng.integers(0, len(damaged)))
                    damaged[at] = int(rng.choice([0xFF, 0xD9, 0xDA, 0xDD, 0xD2, 0x00, 0x01]))
            expected, scans = walk_jpeg_data(bytes(damaged))
            assert damage_walk(bytes(damaged)) == expected
            assert native.jpeg_data_damage(bytes(damaged)) == expected, bytes(damaged)[:40]
            assert native.jpeg_scans(bytes(damaged)) == scans, bytes(damaged)[:40]
            found += expected is not None
    assert found > 500  # most damaged copies are caught, so both walks were exercised
