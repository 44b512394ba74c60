"""jpeg_header: the Python header read agrees with libjpeg's (simplejpeg) or steps aside."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.ops._decode import _jpeg_header
from gpu_loader.ops._formats import jpeg_header, jpeg_orientation


def pillow_jpeg(image: np.ndarray, mode: str = "RGB", **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def segment(data: bytes, marker: int) -> tuple[int, int]:
    """(start, end) of the first segment with ``marker``, its FF and length included."""
    pos = 2
    while data[pos + 1] != marker:
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return pos, pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")


def without(data: bytes, marker: int) -> bytes:
    start, end = segment(data, marker)
    return data[:start] + data[end:]


def with_ids(data: bytes, ids: bytes) -> bytes:
    """The frame's component ids replaced (the scan header's too, so libjpeg accepts it)."""
    out = bytearray(data)
    for marker, first in ((0xC0, 10), (0xDA, 5)):
        start, _ = segment(data, marker)
        step = 3 if marker == 0xC0 else 2
        for i, cid in enumerate(ids):
            out[start + first + step * i] = cid
    return bytes(out)


def with_adobe(data: bytes, transform: int) -> bytes:
    """An Adobe APP14 segment (12 data bytes, the last one `transform`) after SOI."""
    body = b"Adobe" + b"\x00\x64" + b"\x00\x00" + b"\x00\x00" + bytes([transform])
    return data[:2] + b"\xff\xee" + (len(body) + 2).to_bytes(2, "big") + body + data[2:]


def with_short_adobe(data: bytes) -> bytes:
    """An APP14 "Adobe" segment too short for libjpeg to read a transform from (ignored)."""
    body = b"Adobe\x00\x64\x00"
    return data[:2] + b"\xff\xee" + (len(body) + 2).to_bytes(2, "big") + body + data[2:]


def with_orientation(image: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return pillow_jpeg(image, exif=exif.tobytes())


def libjpeg(data: bytes) -> tuple[int, int, str, int]:
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    return int(height), int(width), str(colorspace), jpeg_orientation(data)


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)


def variants(image: np.ndarray) -> dict[str, bytes]:
    plain = pillow_jpeg(image)
    cmyk = pillow_jpeg(image, "CMYK")
    out = {
        "rgb-420": plain,
        "rgb-444": pillow_jpeg(image, subsampling=0),
        "progressive": pillow_jpeg(image, progressive=True),
        "gray": pillow_jpeg(image, "L"),
        "cmyk-adobe-0": cmyk,
        "ycck-adobe-2": with_adobe(without(cmyk, 0xEE), 2),
        "cmyk-no-adobe": without(cmyk, 0xEE),
        "simplejpeg-444": simplejpeg.encode_jpeg(np.ascontiguousarray(image)),
        "no-jfif-ids-123": without(plain, 0xE0),
        "no-jfif-ids-RGB": with_ids(without(plain, 0xE0), b"RGB"),
        "jfif-ids-RGB": with_ids(plain, b"RGB"),  # JFIF wins: YCbCr
        "adobe-0-3ch": with_adobe(without(plain, 0xE0), 0),
        "adobe-1-3ch": with_adobe(without(plain, 0xE0), 1),
        "cmyk-short-adobe": with_short_adobe(without(cmyk, 0xEE)),
        "ids-RGB-short-adobe": with_short_adobe(with_ids(without(plain, 0xE0), b"RGB")),
    }
    out |= {f"exif-{o}": with_orientation(image, o) for o in range(1, 9)}
    return out


def test_agrees_with_libjpeg_on_common_and_odd_jpegs(image: np.ndarray) -> None:
    seen = set()
    for name, data in variants(image).items():
        got = jpeg_header(data)
        assert got is not None, f"{name}: the fast path stepped aside"
        assert got == libjpeg(data), name
        seen.add(got[2])
    assert seen == {"YCbCr", "RGB", "Gray", "CMYK", "YCCK"}  # every guess was exercised


def test_steps_aside_for_what_it_does_not_read(image: np.ndarray) -> None:
    plain = pillow_jpeg(image)
    start, _ = segment(plain, 0xC0)
    lossless = plain[: start + 1] + b"\xc3" + plain[start + 2 :]
    twelve_bit = plain[: start + 4] + b"\x0c" + plain[start + 5 :]
    scan, _ = segment(plain, 0xDA)
    for data in (lossless, twelve_bit, plain[:scan], plain[:20], b"\xff\xd8\xff", b"not a jpeg"):
        assert jpeg_header(data) is None
    # Those go to libjpeg, which names the problem as before.
    with pytest.raises(Exception, match="'k'"):
        _jpeg_header(plain[:scan], "k")


def test_never_raises_and_agrees_whenever_libjpeg_reads_the_header(image: np.ndarray) -> None:
    rng = np.random.default_rng(1)
    base = variants(image)
    agreed = 0
    for trial in range(1500):
        data = bytearray(base[list(base)[trial % len(base)]])
        scan, _ = segment(bytes(data), 0xDA)
        for _ in range(int(rng.integers(1, 4))):  # damage the header, not the pixels
            data[int(rng.integers(2, scan + 4))] = int(rng.integers(0, 256))
        if rng.random() < 0.3:
            data = data[: int(rng.integers(2, len(data)))]
        got = jpeg_header(bytes(data))  # must not raise, whatever the bytes
        try:
            want = libjpeg(bytes(data))
        except ValueError:
            continue
        if got is not None:
            assert got == want, bytes(data[:64]).hex()
            agreed += 1
    assert agreed > 300
