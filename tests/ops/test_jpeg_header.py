"""jpeg_header: the Python header read agrees with libjpeg's (simplejpeg) or steps aside, and
the native walk (_native.jpeg_header) agrees with the Python one on every input."""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.ops._backend import native_module
from gpu_loader.ops._decode import _jpeg_header
from gpu_loader.ops._formats import jpeg_chroma_ratio, jpeg_header, jpeg_orientation
from tests.ops.conftest import pillow_jpeg


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
    no_width = plain[: start + 7] + b"\x00\x00" + plain[start + 9 :]  # libjpeg refuses it
    scan, _ = segment(plain, 0xDA)
    odd = (lossless, twelve_bit, no_width, plain[:scan], plain[:20], b"\xff\xd8\xff", b"not a jpeg")
    for data in odd:
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


# ------------------------------------------------------------- the native walk (_native.c)


def python_walk(data: bytes) -> tuple[int, int, str, int, int] | None:
    """What the native `jpeg_header` must return: the Python header and chroma ratio."""
    got = jpeg_header(data)
    return None if got is None else (*got, jpeg_chroma_ratio(data))


@pytest.fixture(scope="module")
def native_header() -> Callable[[bytes], object]:
    native = native_module()
    if native is None:
        pytest.skip("the native extension is not built")
    return native.jpeg_header  # type: ignore[no-any-return]


def exif_segment(tiff: bytes, *, length: int | None = None) -> bytes:
    body = b"Exif\x00\x00" + tiff
    size = len(body) + 2 if length is None else length
    return b"\xff\xe1" + size.to_bytes(2, "big") + body


def tiff(order: bytes, entries: list[tuple[int, int, int]], *, ifd: int = 8) -> bytes:
    """A TIFF block: header, then at ``ifd`` a directory of (tag, type, value) entries."""
    end = "<" if order == b"II" else ">"
    head = order + struct.pack(end + "HI", 42, ifd)
    body = struct.pack(end + "H", len(entries))
    for tag, typ, value in entries:
        body += struct.pack(end + "HHIH2x", tag, typ, 1, value)
    return head + b"\x00" * (ifd - 8) + body


def test_native_walk_matches_python_on_every_variant(
    image: np.ndarray, native_header: Callable[[bytes], object]
) -> None:
    chroma = set()
    for name, data in variants(image).items():
        want = python_walk(data)
        assert want is not None, name
        assert native_header(data) == want, name
        chroma.add(want[4])
    assert chroma == {1, 2}  # 4:4:4 / grey and 4:2:0 both seen
    import cv2

    bgr = np.ascontiguousarray(image[:, :, ::-1])
    flags = [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411]
    ok, encoded = cv2.imencode(".jpg", bgr, flags)
    assert ok
    assert native_header(encoded.tobytes()) == python_walk(encoded.tobytes())
    assert python_walk(encoded.tobytes())[4] == 4  # type: ignore[index]  # 4:1:1


@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_native_walk_matches_python_on_odd_exif_blocks(
    image: np.ndarray, order: bytes, native_header: Callable[[bytes], object]
) -> None:
    plain = pillow_jpeg(image)
    blocks = {
        "orientation 6": exif_segment(tiff(order, [(0x0112, 3, 6)])),
        "after another tag": exif_segment(tiff(order, [(0x010F, 2, 0), (0x0112, 3, 3)])),
        "value 0": exif_segment(tiff(order, [(0x0112, 3, 0)])),
        "value 9": exif_segment(tiff(order, [(0x0112, 3, 9)])),
        "type LONG": exif_segment(tiff(order, [(0x0112, 4, 6)])),
        "directory past the end": exif_segment(tiff(order, [(0x0112, 3, 6)], ifd=70000)[:20]),
        "entry cut": exif_segment(tiff(order, [(0x0112, 3, 6)])[:-4]),
        "count too large": exif_segment(tiff(order, [(0x0112, 3, 6)])[:-12] + b"\x00" * 3),
        "no tiff header": exif_segment(order),
        "bad byte order": exif_segment(b"IM" + tiff(order, [(0x0112, 3, 6)])[2:]),
        # A segment shorter than "Exif\0\0": the Python slice reads past it, so must C.
        "exif shorter than its tag": b"\xff\xe1\x00\x04Exif\x00\x00" + b"\xff\xfe\x00\x02",
    }
    for name, segment_bytes in blocks.items():
        data = plain[:2] + segment_bytes + plain[2:]
        second = plain[:2] + segment_bytes + exif_segment(tiff(order, [(0x0112, 3, 8)])) + plain[2:]
        for variant in (data, second):  # two Exif segments: joined, as Pillow joins them
            assert native_header(variant) == python_walk(variant), name
    assert native_header(plain[:2] + blocks["orientation 6"] + plain[2:])[3] == 6  # type: ignore[index]


def test_native_walk_matches_python_on_damaged_headers(
    image: np.ndarray, native_header: Callable[[bytes], object]
) -> None:
    rng = np.random.default_rng(2)
    base = list(variants(image).values())
    read = stepped_aside = 0
    for trial in range(4000):
        data = bytearray(base[trial % len(base)])
        scan, _ = segment(bytes(data), 0xDA)
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.integers(2, scan + 4))] = int(rng.integers(0, 256))
        if rng.random() < 0.3:
            data = data[: int(rng.integers(0, len(data)))]
        want = python_walk(bytes(data))
        assert native_header(bytes(data)) == want, bytes(data[:80]).hex()
        read += want is not None
        stepped_aside += want is None
    assert read > 1000 and stepped_aside > 300  # both outcomes were exercised
    for short in (b"", b"\xff", b"\xff\xd8", b"\xff\xd8\xff\xda\x00"):
        assert native_header(short) is None
    assert native_header(memoryview(base[0])) == python_walk(base[0])


@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_orientation_is_read_as_pillow_reads_it(
    image: np.ndarray, order: bytes, native_header: Callable[[bytes], object]
) -> None:
    # Pillow's exif_transpose takes an Orientation stored as any one integer; only SHORT
    # was read here, so a LONG 6 turned nothing that Pillow (the documented reference)
    # turns (QA). A BYTE or ASCII value is no integer to Pillow, and turns nothing.
    from PIL import ImageOps

    end = "<" if order == b"II" else ">"
    plain = pillow_jpeg(image)

    def with_orientation(typ: int, count: int, value_field: bytes) -> bytes:
        entry = struct.pack(end + "HHI", 0x0112, typ, count) + value_field
        ifd = struct.pack(end + "H", 1) + entry + b"\x00" * 4  # no next directory
        return plain[:2] + exif_segment(order + struct.pack(end + "HI", 42, 8) + ifd) + plain[2:]

    fields = {1: "B3x", 2: "B3x", 3: "H2x", 4: "I", 6: "b3x", 8: "h2x", 9: "i"}
    cases = [(typ, value) for typ in fields for value in (6, 8, 0, 9)]
    cases += [(9, -6), (8, -3), (6, -2)]
    for typ, value in cases:
        data = with_orientation(typ, 1, struct.pack(end + fields[typ], value))
        with Image.open(io.BytesIO(data)) as im:
            said = im.getexif().get(0x0112)
            turned = ImageOps.exif_transpose(im).size[::-1]
        want = said if isinstance(said, int) and 1 <= said <= 8 else 1
        got = python_walk(data)
        assert got is not None and got[3] == want, (typ, value, said)
        assert native_header(data) == got, (typ, value)
        assert turned == ((53, 37) if want >= 5 else (37, 53)), (typ, value)

    # Several values: Pillow warns and takes the first, read from wherever the entry
    # points when they do not fit in it, and none when they run past the block (QA: a
    # count of 2 turned nothing here that Pillow, and so torchvision, turns).
    def with_values(typ: int, count: int, values: bytes) -> bytes:
        if len(values) <= 4:
            return with_orientation(typ, count, values.ljust(4, b"\x00"))
        entry = struct.pack(end + "HHI", 0x0112, typ, count) + struct.pack(end + "I", 26)
        ifd = struct.pack(end + "H", 1) + entry + b"\x00" * 4
        tiff_block = order + struct.pack(end + "HI", 42, 8) + ifd + values
        return plain[:2] + exif_segment(tiff_block) + plain[2:]

    several = [
        (3, 2, struct.pack(end + "HH", 6, 1)),  # inline
        (3, 2, struct.pack(end + "HH", 0, 6)),  # the first is out of range: none
        (6, 4, struct.pack(end + "bbbb", 5, 1, 1, 1)),  # inline SBYTEs
        (3, 3, struct.pack(end + "HHH", 8, 1, 1)),  # at an offset
        (4, 2, struct.pack(end + "II", 7, 1)),  # a LONG pair at an offset
        (3, 3, struct.pack(end + "H", 6)),  # at an offset, but cut short: none
        (3, 0, b""),  # no value at all
    ]
    for typ, count, values in several:
        data = with_values(typ, count, values)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "tag 274 had too many entries", "corrupt EXIF"
            with Image.open(io.BytesIO(data)) as im:
                turned = ImageOps.exif_transpose(im).size[::-1]
        got = python_walk(data)
        assert got is not None, (typ, count)
        assert turned == ((53, 37) if got[3] >= 5 else (37, 53)), (typ, count, got[3])
        assert got[3] != 1 or turned == (37, 53)
        assert native_header(data) == got, (typ, count)
    assert [python_walk(with_values(*c))[3] for c in several] == [6, 1, 5, 8, 7, 1, 1]  # type: ignore[index]


# ------------------------------------------- EXIF blocks: both walks against Pillow itself

_PIL_MAJOR = int(Image.__version__.split(".")[0])
needs_pillow_13 = pytest.mark.skipif(
    _PIL_MAJOR < 13, reason="the walks mirror Pillow 13's EXIF reader (older ones differ)"
)
_UNITS = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8}


def pillow_orientation(block: bytes) -> int:
    """The orientation Pillow's exif_transpose takes from an Exif block (no XMP)."""
    exif = Image.Exif()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exif.load(b"Exif\x00\x00" + block)
            value = exif.get(0x0112)
        except Exception:  # Pillow raises on some (exif_transpose with it)
            return 1
    return {2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8}.get(value, 1)


def walks(block: bytes, plain: bytes, native_header: Callable[[bytes], object]) -> set[int]:
    """The orientations the Python and the native walk read from ``block``, as a set."""
    data = plain[:2] + exif_segment(block) + plain[2:]
    native = native_header(data)
    assert native is not None
    return {jpeg_orientation(data), native[3]}  # type: ignore[index]


def entries_block(order: bytes, entries: list[tuple[int, int, int, bytes]]) -> bytes:
    """A TIFF block: (tag, type, count, values) entries, values that do not fit in the
    entry stored after the directory."""
    end = "<" if order == b"II" else ">"
    after = 8 + 2 + 12 * len(entries) + 4
    directory, extra = struct.pack(end + "H", len(entries)), b""
    for tag, typ, count, values in entries:
        if count * _UNITS.get(typ, 1) <= 4 or typ not in _UNITS:
            field = values.ljust(4, b"\x00")[:4]
        else:
            field, extra = struct.pack(end + "I", after + len(extra)), extra + values
        directory += struct.pack(end + "HHI", tag, typ, count) + field
    return order + struct.pack(end + "HI", 42, 8) + directory + b"\x00" * 4 + extra


@needs_pillow_13
@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_malformed_exif_blocks_turn_as_pillow_turns_them(
    image: np.ndarray, order: bytes, native_header: Callable[[bytes], object]
) -> None:
    # Pillow skips an entry it cannot read and takes a later Orientation; reads FLOAT,
    # DOUBLE and RATIONAL values equal to an integer; drops a doubled Exif prefix; misses
    # big-endian BigTIFF's magic. The walks stopped at the first Orientation entry and
    # read integers only (QA41), so each of these turned nothing here.
    from PIL import ImageOps

    end = "<" if order == b"II" else ">"
    plain = pillow_jpeg(image)

    def short(value: int) -> bytes:
        return struct.pack(end + "H", value)

    six = (0x0112, 3, 1, short(6))
    cases = {
        "unknown type, then 6": [(0x0112, 14, 1, short(3)), six],
        "no values, then 6": [(0x0112, 3, 0, short(3)), six],
        "values past the budget, then 6": [(0x0112, 3, 1 << 20, b""), six],
        "RATIONAL 12/2": [(0x0112, 5, 1, struct.pack(end + "II", 12, 2))],
        "SRATIONAL -6/-1": [(0x0112, 10, 1, struct.pack(end + "ii", -6, -1))],
        "RATIONAL 13/2": [(0x0112, 5, 1, struct.pack(end + "II", 13, 2))],
        "RATIONAL 6/0": [(0x0112, 5, 1, struct.pack(end + "II", 6, 0))],
        "FLOAT 6.0": [(0x0112, 11, 1, struct.pack(end + "f", 6.0))],
        "DOUBLE 5.0": [(0x0112, 12, 1, struct.pack(end + "d", 5.0))],
        "DOUBLE 5.5": [(0x0112, 12, 1, struct.pack(end + "d", 5.5))],
        "LONG8 7": [(0x0112, 16, 1, struct.pack(end + "Q", 7))],
        "BYTE read first, then 6": [(0x0112, 1, 1, b"\x06"), six],
        "a later 8 ignored": [six, (0x0112, 3, 1, short(8))],
    }
    expected = {
        "RATIONAL 13/2": 1,
        "RATIONAL 6/0": 1,
        "DOUBLE 5.5": 1,
        "BYTE read first, then 6": 1,
    }
    expected |= {"RATIONAL 12/2": 6, "SRATIONAL -6/-1": 6, "DOUBLE 5.0": 5, "LONG8 7": 7}
    blocks = {name: entries_block(order, entries) for name, entries in cases.items()}
    blocks["doubled prefix"] = b"Exif\x00\x00" + entries_block(order, [six])
    little_big = b"II+\x00" + entries_block(order, [six])[4:]
    big_big = b"MM\x00+" + entries_block(b"MM", [six])[4:]
    blocks["BigTIFF magic"] = little_big if order == b"II" else big_big
    expected["BigTIFF magic"] = 1 if order == b"II" else 6  # Pillow tests the third byte
    for name, block in blocks.items():
        want = expected.get(name, 6)
        assert pillow_orientation(block) == want, name  # the premise: this is Pillow's answer
        assert walks(block, plain, native_header) == {want}, name
        data = plain[:2] + exif_segment(block) + plain[2:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as im:
                turned = ImageOps.exif_transpose(im).size
        assert turned == ((37, 53) if want >= 5 else (53, 37)), name  # and what it does


_NUMBER_FORMATS = {3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 11: "f", 12: "d", 13: "I", 16: "Q"}


def encoded(typ: int, value: int, end: str, denominator: int) -> bytes:
    """``value`` as one value of TIFF type ``typ`` (a rational as value * d / d, d in 0-2)."""
    if typ in (5, 10):
        return struct.pack(end + "II", value * max(denominator, 1), denominator)
    fmt = _NUMBER_FORMATS.get(typ)
    return bytes([value]) if fmt is None else struct.pack(end + fmt, value)


@needs_pillow_13
@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_several_exif_segments_are_joined_as_pillow_joins_them(
    image: np.ndarray, order: bytes, native_header: Callable[[bytes], object]
) -> None:
    # Pillow joins every APP1 Exif segment before the scan (a block over 64 KiB must be
    # split); both walks read the first only, so an empty or cut first one turned
    # nothing (QA).
    from PIL import ImageOps

    end = "<" if order == b"II" else ">"
    plain = pillow_jpeg(image)
    make = (0x010F, 2, 8, b"Camera\x00\x00")  # stored after the directory
    six = entries_block(order, [make, (0x0112, 3, 1, struct.pack(end + "H", 6))])
    eight = entries_block(order, [(0x0112, 3, 1, struct.pack(end + "H", 8))])
    cases = {
        "empty, then a block": ([b"", six], 6),
        "a block split in two": ([six[:20], six[20:]], 6),
        "split in three": ([six[:9], six[9:30], six[30:]], 6),
        "the first read decides": ([six, eight], 6),
        "a block, then an empty one": ([eight, b""], 8),
    }
    for name, (parts, want) in cases.items():
        data = plain[:2] + b"".join(exif_segment(part) for part in parts) + plain[2:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as im:
                said = im.getexif().get(0x0112)
                turned = ImageOps.exif_transpose(im).size
        assert said == want, name  # the premise: Pillow's own reading
        assert turned == ((37, 53) if want >= 5 else (53, 37)), name
        native = native_header(data)
        assert native is not None and native[3] == want, name  # type: ignore[index]
        assert jpeg_orientation(data) == want and python_walk(data) == native, name


@needs_pillow_13
def test_fuzzed_exif_blocks_turn_as_pillow_turns_them(
    image: np.ndarray, native_header: Callable[[bytes], object]
) -> None:
    rng = np.random.default_rng(5)
    plain = pillow_jpeg(image)
    types = [*_UNITS, 0, 14, 17]
    seen: dict[int, int] = {}
    for _ in range(3000):
        order = b"II" if rng.random() < 0.5 else b"MM"
        end = "<" if order == b"II" else ">"
        entries = []
        for _ in range(int(rng.integers(0, 5))):
            tag = int(rng.choice([0x0112, 0x0112, 0x010F, 0x8769]))
            typ = int(rng.choice(types))
            count = int(rng.choice([1, 1, 1, 0, 2, 3, 1 << 30]))
            numbers = [int(v) for v in rng.integers(0, 10, size=min(count, 4))]
            values = b"".join(encoded(typ, v, end, int(rng.integers(0, 3))) for v in numbers)
            entries.append((tag, typ, count, values[: min(count, 4) * _UNITS.get(typ, 1)]))
        block = bytearray(entries_block(order, entries))
        for _ in range(int(rng.integers(0, 3))):  # damage: a byte anywhere, or a cut
            if not block:
                break
            if rng.random() < 0.7:
                block[int(rng.integers(0, len(block)))] = int(rng.integers(0, 256))
            else:
                del block[int(rng.integers(0, len(block))) :]
        if rng.random() < 0.05:
            block[:0] = b"Exif\x00\x00"
        want = pillow_orientation(bytes(block))
        assert walks(bytes(block), plain, native_header) == {want}, bytes(block).hex()
        seen[want] = seen.get(want, 0) + 1
    assert seen.get(1, 0) > 500 and sum(n for o, n in seen.items() if o != 1) > 250, seen
