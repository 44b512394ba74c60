"""decode / probe_size: formats, colour spaces, EXIF orientation, reduced decodes, failures."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from gpu_loader.datasets import photo_like
from gpu_loader.ops import (
    DecodedImage,
    DecodeError,
    EvalTransform,
    TrainTransform,
    decode,
    load_into,
    probe_size,
)
from tests.ops.conftest import Photo, jpeg, png


def pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return photo_like(96, 128, np.random.default_rng(1))


def test_jpeg_matches_pillow_decode(photos: list[Photo]) -> None:
    for photo in photos:
        decoded = decode(photo.data, key=photo.name)
        assert isinstance(decoded, DecodedImage) and decoded.scale == 1.0
        assert decoded.array.shape == (photo.height, photo.width, 3)
        assert decoded.array.dtype == np.uint8
        diff = np.abs(decoded.array.astype(int) - pillow_rgb(photo.data))
        # Same libjpeg-turbo family; upsampling details may differ by a level or two.
        assert diff.mean() < 0.5, photo.name


def test_grayscale_jpeg_and_png_become_rgb(image: np.ndarray) -> None:
    gray = image.mean(axis=2).astype(np.uint8)
    for data in (
        bytes(__import__("simplejpeg").encode_jpeg(gray[:, :, None], colorspace="GRAY")),
        png(gray),
    ):
        out = decode(data).array
        assert out.shape == (96, 128, 3)
        assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])
        assert np.abs(out[..., 0].astype(int) - pillow_rgb(data)[..., 0]).max() <= 1


def test_cmyk_jpeg_matches_pillow(image: np.ndarray) -> None:
    buf = io.BytesIO()
    Image.fromarray(image).convert("CMYK").save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    out = decode(data, key="cmyk").array
    assert out.shape == (96, 128, 3)
    assert np.array_equal(out, pillow_rgb(data))
    # And it is the picture, not inverted garbage.
    assert np.abs(out.astype(int) - image).mean() < 6


def test_png_rgba_drops_alpha(image: np.ndarray) -> None:
    rgba = np.dstack([image, np.full(image.shape[:2], 77, np.uint8)])
    out = decode(png(rgba), key="rgba").array
    assert np.array_equal(out, image)


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF", "GIF"])
def test_other_formats(image: np.ndarray, fmt: str) -> None:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    out = decode(buf.getvalue(), key=fmt).array
    assert out.shape == (96, 128, 3)
    assert np.array_equal(out, pillow_rgb(buf.getvalue()))


@pytest.mark.parametrize(
    ("mode", "plain"), [("RGB", False), ("L", False), ("1", False), ("RGB", True)]
)
def test_netpbm_files_decode_like_pillow(
    image: np.ndarray, mode: str, plain: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    # torchvision's IMG_EXTENSIONS (and so ImageFolder's) list .ppm and .pgm: GTSRB ships PPMs.
    buf = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buf, "PPM", **({"plain": True} if plain else {}))
    data = buf.getvalue()
    out = decode(data, key="x.ppm").array
    assert out.shape == (96, 128, 3)
    assert np.array_equal(out, pillow_rgb(data))
    with pytest.raises(DecodeError, match="truncated") as info:
        decode(data[: len(data) // 2], key="cut.ppm")
    assert "'cut.ppm'" in str(info.value)
    # A hostile header is refused by its size before any pixel is allocated.
    bomb = b"P6\n200000 200000\n255\n" + data[-64:]
    with pytest.raises(DecodeError, match="pixels") as info:
        decode(bomb, key="bomb.ppm")
    assert "'bomb.ppm'" in str(info.value)
    assert capfd.readouterr().err == ""


def test_netpbm_maxval_and_odd_headers_decode_like_pillow(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Review: through OpenCV a maxval-15 PGM came out 0-15 instead of 0-255; a comment
    # over 1 KB or ended by CR alone was refused. Pillow decodes them all.
    ramp = bytes([0, 5, 10, 15] * 4)
    cases = {
        "maxval15.pgm": b"P5\n4 4\n15\n" + ramp,
        "long-comment.pgm": b"P5\n#" + b"x" * 5000 + b"\n4 4\n15\n" + ramp,
        "cr-comment.pgm": b"P5 # made on a classic Mac\r4 4\r15\r" + ramp,
        "wide.ppm": b"P6\n2 2\n65535\n" + bytes(range(24)),
    }
    for name, data in cases.items():
        got = decode(data, key=name).array
        np.testing.assert_array_equal(got, pillow_rgb(data), err_msg=name)
    assert decode(cases["maxval15.pgm"]).array[0, :, 0].tolist() == [0, 85, 170, 255]
    # A comment touching a number splits it, for Pillow: left to Pillow (width 20 here).
    split = b"P5 2#c\n0 1 255\n" + bytes(20)
    np.testing.assert_array_equal(decode(split).array, pillow_rgb(split))
    assert capfd.readouterr().err == ""


def test_a_cut_netpbm_file_is_refused_even_when_pillow_would_pad_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Training scripts often set LOAD_TRUNCATED_IMAGES; Pillow then pads a cut file with
    # black and says nothing. The header tells the size, so the cut is named first.
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    whole = b"P5\n4 4\n255\n" + bytes(range(16))
    assert decode(whole).array.shape == (4, 4, 3)
    with pytest.raises(DecodeError, match="truncated netpbm image: it holds 10 bytes"):
        decode(whole[:-6], key="cut.pgm")
    # A bitmap's rows are whole bytes: 9 pixels take 2 (the cut is in the last one).
    bitmap = b"P4\n9 8\n" + bytes(16)
    assert decode(bitmap).array.shape == (8, 9, 3)
    with pytest.raises(DecodeError, match="truncated netpbm image: it holds 15 bytes"):
        decode(bitmap[:-1], key="cut.pbm")


def exif_block(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def exif_jpeg(image: np.ndarray, orientation: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "JPEG", quality=95, exif=exif_block(orientation))
    return buf.getvalue()


def test_a_cmyk_jpeg_is_turned_by_the_orientation_its_size_was_probed_with(
    image: np.ndarray,
) -> None:
    # CMYK decodes through Pillow, whose exif_transpose also reads an XMP
    # tiff:Orientation; probe_size (EXIF only) did not, so the decode came out turned
    # against the size the crop was drawn on, and load_into refused every such file (QA).
    xmp = (
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/'
        b'02/22-rdf-syntax-ns#"><rdf:Description rdf:about="" xmlns:tiff="http://ns.adobe'
        b'.com/tiff/1.0/" tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
    )
    exif = Image.Exif()
    exif[0x0112] = 6
    for extra in ({"xmp": xmp}, {"exif": exif.tobytes()}):
        buf = io.BytesIO()
        Image.fromarray(image).convert("CMYK").save(buf, "JPEG", quality=95, **extra)
        data = buf.getvalue()
        out = decode(data, key="cmyk").array
        assert out.shape[:2] == probe_size(data)
        turned = "exif" in extra  # XMP alone turns nothing here (EXIF is the rule)
        assert out.shape[:2] == ((128, 96) if turned else (96, 128))
        expected = np.rot90(image, -1) if turned else image  # orientation 6: 90 deg clockwise
        assert np.abs(out.astype(int) - expected).mean() < 6
        into = np.empty((3, 32, 32), np.float32)
        for index in range(8):  # crops drawn on the probed size, each one fits
            load_into(data, TrainTransform(32), np.random.default_rng(index), into, dtype="float32")


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_matches_pillow(image: np.ndarray, orientation: int) -> None:
    data = exif_jpeg(image, orientation)
    expected = pillow_rgb(data)
    assert probe_size(data) == expected.shape[:2]
    out = decode(data, key="exif").array
    assert out.shape == expected.shape
    assert np.abs(out.astype(int) - expected).mean() < 0.5


def with_exif(image: np.ndarray, fmt: str, block: bytes) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(
        buf, fmt, exif=block, **({"lossless": True} if fmt == "WEBP" else {})
    )
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
@pytest.mark.parametrize(
    "block",
    [b"not a tiff block at all", b"II\x2b\x00\x08\x00\x00\x00" + bytes(8), b"MM"],
    ids=["no-magic", "cut-bigtiff", "two-bytes"],
)
def test_a_damaged_exif_block_keeps_the_pixels_on_the_pillow_path(
    image: np.ndarray, fmt: str, block: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pillow's exif_transpose raises on these blocks; the pixels are fine, and the JPEG walk
    # and OpenCV read such a block as no orientation. The Pillow path (a BMP layout OpenCV
    # cannot read, an OpenCV build without the codec) failed the file as corrupt.
    import cv2

    data = with_exif(image, fmt, block)
    with Image.open(io.BytesIO(data)) as im, pytest.raises((SyntaxError, struct.error)):
        ImageOps.exif_transpose(im)  # the premise: Pillow itself refuses the block
    expected = decode(data, key="opencv").array  # OpenCV: stored pixels, nothing turned
    assert expected.shape == image.shape
    monkeypatch.setattr(cv2, "imdecode", lambda *args: None)  # a build lacking the codec
    out = decode(data, key="pillow").array
    assert np.array_equal(out, expected)
    turned = with_exif(image, fmt, exif_block(6))
    assert decode(turned, key="pillow").array.shape == (128, 96, 3)  # a good block still turns


def test_probe_size_is_none_for_non_jpeg(image: np.ndarray) -> None:
    assert probe_size(png(image)) is None
    assert probe_size(b"hello") is None
    assert probe_size(jpeg(image)) == (96, 128)


def test_reduced_decode_picks_the_largest_covering_factor() -> None:
    data = jpeg(photo_like(800, 1000, np.random.default_rng(2)))
    full = decode(data).array
    cases = [((700, 900), 1.0), ((400, 500), 0.5), ((200, 250), 0.25), ((99, 100), 0.125)]
    for min_size, scale in cases:
        d = decode(data, min_size=min_size)
        assert d.scale == scale, min_size
        assert d.array.shape[:2] == (int(800 * scale), int(1000 * scale))
    # A 1/8 decode is the 8x8 block average: compare with the full decode box-filtered.
    eighth = decode(data, min_size=(50, 50)).array.astype(float)
    boxed = full.reshape(100, 8, 125, 8, 3).mean(axis=(1, 3))
    assert np.abs(eighth - boxed).mean() < 2.0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"just some text, not an image", "unsupported format"),
        (b"\xff\xd8\xff\xe0 not really a jpeg", "corrupt or truncated JPEG header"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10garbage", "corrupt"),
    ],
)
def test_bad_bytes_raise_decode_error_naming_the_key(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason) as info:
        decode(data, key="dir/sample_17.jpg")
    assert "dir/sample_17.jpg" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_truncated_jpeg_and_png_raise(image: np.ndarray) -> None:
    for data in (jpeg(image), png(image)):
        with pytest.raises(DecodeError, match="truncated") as info:
            decode(data[: len(data) // 2], key="half")
        assert "'half'" in str(info.value)


def test_a_cut_png_is_named_without_decoder_noise(
    image: np.ndarray, capfd: pytest.CaptureFixture[str]
) -> None:
    big = np.tile(image, (6, 6, 1))  # image data in several IDAT chunks
    data = png(big)
    idat = data.index(b"IDAT") - 4
    cuts = {
        "inside the image data": (len(data) * 2 // 3, "inside chunk 'IDAT'"),
        "before any image data": (idat, "no IDAT chunk"),
        "inside a chunk header": (idat + 5, "inside a chunk header"),
    }
    for name, (cut, reason) in cuts.items():
        with pytest.raises(DecodeError, match="truncated") as info:
            decode(data[:cut], key="cut.png")
        assert reason in str(info.value) and "'cut.png'" in str(info.value), name
    # libpng and OpenCV would each print a line here for the cut files.
    assert capfd.readouterr().err == ""


def test_a_damaged_png_is_named_without_decoder_noise(
    image: np.ndarray, capfd: pytest.CaptureFixture[str]
) -> None:
    data = bytearray(png(np.tile(image, (4, 4, 1))))
    data[len(data) // 2] ^= 0x5A  # one byte of the image data changed
    with pytest.raises(DecodeError, match=r"chunk 'IDAT' at byte [\d,]+ fails its CRC") as info:
        decode(bytes(data), key="flip.png")
    assert "'flip.png'" in str(info.value)
    assert capfd.readouterr().err == ""  # libpng would print "IDAT: CRC error"


@pytest.mark.parametrize(
    ("depth", "colour", "reason"),
    [(8, 5, "colour type 5, which PNG does not define"), (4, 2, "colour type 2 with bit depth 4")],
)
def test_a_png_header_outside_the_standard_is_named_without_decoder_noise(
    image: np.ndarray, depth: int, colour: int, reason: str, capfd: pytest.CaptureFixture[str]
) -> None:
    data = bytearray(png(image))
    data[24:26] = bytes((depth, colour))  # IHDR's bit depth and colour type
    data[29:33] = zlib.crc32(data[12:29]).to_bytes(4, "big")  # a valid CRC: only the pair is bad
    with pytest.raises(DecodeError, match=reason) as info:
        decode(bytes(data), key="odd.png")
    assert "'odd.png'" in str(info.value)
    assert capfd.readouterr().err == ""  # libpng: "Invalid color type in IHDR" and more


def test_a_png_without_its_end_trailer_still_decodes(
    image: np.ndarray, capfd: pytest.CaptureFixture[str]
) -> None:
    data = png(image)
    assert data.endswith(b"IEND\xaeB`\x82")
    whole = decode(data).array
    np.testing.assert_array_equal(decode(data[:-12], key="no-iend.png").array, whole)
    assert capfd.readouterr().err == ""


def _with_chunks(data: bytes, kind: bytes, body: bytes, count: int) -> bytes:
    """``data`` (a PNG) with ``count`` chunks of ``kind`` after its header chunk."""
    chunk = struct.pack(">I", len(body)) + kind + body
    chunk += struct.pack(">I", zlib.crc32(kind + body))
    ihdr_end = 8 + 12 + 13
    return data[:ihdr_end] + chunk * count + data[ihdr_end:]


@pytest.mark.parametrize(
    ("kind", "body", "count", "reason"),
    [
        (b"tEXt", b"", 1_001, "over 1,000 text chunks"),  # each one a libpng warning line
        (b"zzZz", b"", 100_001, "over 100,000 chunks"),  # walked, then left to the decoder
    ],
)
def test_a_png_flooded_with_chunks_is_refused_quietly(
    image: np.ndarray,
    kind: bytes,
    body: bytes,
    count: int,
    reason: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # QA: a million empty tEXt chunks took 3 s per decode and 32 MB of "tEXt: too short".
    data = _with_chunks(png(image), kind, body, count)
    with pytest.raises(DecodeError, match=reason) as info:
        decode(data, key="flood.png")
    assert "flood.png" in str(info.value)
    assert capfd.readouterr().err == ""


def test_a_png_with_a_few_text_chunks_decodes(image: np.ndarray) -> None:
    data = png(image)
    tagged = _with_chunks(data, b"tEXt", b"Comment\x00made by a test", 20)
    np.testing.assert_array_equal(decode(tagged).array, decode(data).array)


def bmp_top_down(data: bytes) -> bytes:
    """The same BMP with its rows stored top first (a negative height), rows reversed."""
    (offset,) = struct.unpack("<I", data[10:14])
    width, height = struct.unpack("<ii", data[18:26])
    (bits,) = struct.unpack("<H", data[28:30])
    stride = -(-width * bits // 32) * 4
    rows = [data[offset + r * stride : offset + (r + 1) * stride] for r in range(height)]
    return data[:22] + struct.pack("<i", -height) + data[26:offset] + b"".join(rows[::-1])


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "1"])
def test_a_cut_bmp_is_named_without_decoder_noise(
    image: np.ndarray, mode: str, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buf, "BMP")
    data = buf.getvalue()
    for whole in (data, bmp_top_down(data), data + b"trailing"):
        np.testing.assert_array_equal(decode(whole).array, pillow_rgb(data))
    for cut in (20, 30, len(data) // 2, len(data) - 1):  # 30: inside the info header
        with pytest.raises(DecodeError, match="truncated or corrupt BMP: it ends") as info:
            decode(data[:cut], key="cut.bmp")
        assert "'cut.bmp'" in str(info.value)
    assert capfd.readouterr().err == ""  # OpenCV would print "imdecode_(''): can't read data"


def test_a_bmp_with_an_undefined_compression_is_named_without_decoder_noise(
    image: np.ndarray, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "BMP")
    data = bytearray(buf.getvalue())
    struct.pack_into("<I", data, 30, 99)  # biCompression
    with pytest.raises(DecodeError, match="names compression 99, which BMP does not define"):
        decode(bytes(data), key="odd.bmp")
    assert capfd.readouterr().err == ""  # OpenCV printed a failed assertion (QA)


def test_a_bmp_whose_rows_start_inside_its_headers_is_refused(image: np.ndarray) -> None:
    # OpenCV read the rows from inside the headers: every one shifted, no error (QA).
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "BMP")
    data = bytearray(buf.getvalue())
    for offset in (14, 53):  # the headers end at 54
        struct.pack_into("<I", data, 10, offset)
        with pytest.raises(DecodeError, match=f"pixel data offset {offset} points inside"):
            decode(bytes(data), key="shifted.bmp")
    # Unset (0): Pillow reads the rows right after the headers, as the file means.
    struct.pack_into("<I", data, 10, 0)
    np.testing.assert_array_equal(decode(bytes(data)).array, image)
    # BITFIELDS: the three colour masks after a version 3 header are no pixels either.
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "BMP")
    masked = bmp_with_bitfields(buf.getvalue())
    np.testing.assert_array_equal(decode(masked).array, image)
    for offset in (54, 65):  # the masks take bytes 54-65
        cut = bytearray(masked)
        struct.pack_into("<I", cut, 10, offset)
        with pytest.raises(DecodeError, match=f"pixel data offset {offset} points inside"):
            decode(bytes(cut), key="shifted.bmp")
    alpha = bytearray(masked)  # BI_ALPHABITFIELDS: four masks, bytes 54-69
    struct.pack_into("<I", alpha, 30, 6)
    struct.pack_into("<I", alpha, 10, 66)
    with pytest.raises(DecodeError, match=r"pixel data offset 66 points inside .*\(70 bytes"):
        decode(bytes(alpha), key="shifted.bmp")
    # A version 4 header holds its masks: the rows right after it (byte 122) are pixels.
    np.testing.assert_array_equal(decode(bmp_v4(masked), key="v4.bmp").array, image)


def bmp_with_bitfields(data: bytes) -> bytes:
    """A 24-bit BMP rewritten as 32-bit BI_BITFIELDS (masks after the 40-byte header)."""
    width, height = struct.unpack("<ii", data[18:26])
    stride = -(-width * 24 // 32) * 4
    rows = b"".join(
        b"".join(
            data[54 + r * stride + 3 * x : 54 + r * stride + 3 * x + 3] + b"\x00"
            for x in range(width)
        )
        for r in range(height)
    )
    masks = struct.pack("<III", 0x00FF0000, 0x0000FF00, 0x000000FF)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 32, 3, len(rows), 0, 0, 0, 0)
    offset = 14 + 40 + len(masks)
    head = b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset)
    return head + info + masks + rows


def bmp_v4(bitfields: bytes) -> bytes:
    """`bmp_with_bitfields`' BMP with a version 4 header (108 bytes, the masks inside it)."""
    info, masks, rows = bitfields[14:54], bitfields[54:66], bitfields[66:]
    v4 = struct.pack("<I", 108) + info[4:] + masks + struct.pack("<I", 0) + b"sRGB"
    v4 += bytes(108 - len(v4))  # endpoints and gamma
    head = b"BM" + struct.pack("<IHHI", 14 + 108 + len(rows), 0, 0, 14 + 108)
    return head + v4 + rows


def test_a_16_bit_bmp_decodes_as_pillow_widens_it() -> None:
    # OpenCV widened each 5-bit channel by a shift (31 -> 248), Pillow to the full range
    # (31 -> 255): up to 7 levels apart (QA).
    rgb = (np.arange(6 * 9 * 3).reshape(6, 9, 3) * 5 % 256).astype(np.uint8)
    stride = -(-9 * 16 // 32) * 4
    rows = []
    for r in range(5, -1, -1):
        packed = [(int(p[0]) >> 3) << 10 | (int(p[1]) >> 3) << 5 | int(p[2]) >> 3 for p in rgb[r]]
        rows.append(struct.pack("<9H", *packed).ljust(stride, b"\x00"))
    pixels = b"".join(rows)
    info = struct.pack("<IiiHHIIiiII", 40, 9, 6, 1, 16, 0, len(pixels), 0, 0, 0, 0)
    data = b"BM" + struct.pack("<IHHI", 54 + len(pixels), 0, 0, 54) + info + pixels
    np.testing.assert_array_equal(decode(data, key="555.bmp").array, pillow_rgb(data))
    assert decode(data).array.max() == 255  # a full 5-bit channel comes out white


def test_an_os2_core_bmp_decodes_by_its_16_bit_sides() -> None:
    # Its header holds the sides as 16-bit fields: read as 32-bit, they made a
    # 1,572,865 x 851,985 image that max_pixels refused (QA).
    rgb = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3) * 3
    stride = -(-7 * 3 // 4) * 4
    rows = b"".join(rgb[r, :, ::-1].tobytes().ljust(stride, b"\x00") for r in range(4, -1, -1))
    core = struct.pack("<IHHHH", 12, 7, 5, 1, 24)
    data = b"BM" + struct.pack("<IHHI", 26 + len(rows), 0, 0, 26) + core + rows
    np.testing.assert_array_equal(decode(data, key="os2.bmp").array, rgb)


@pytest.mark.parametrize(
    ("field", "value", "pillow_says"),
    [
        (30, 4, "Unsupported BMP compression"),  # embedded JPEG rows
        (30, 5, "Unsupported BMP compression"),  # embedded PNG rows
        (30, 6, "Unsupported BMP compression"),  # BI_ALPHABITFIELDS
        (46, 0xFFFFFFFF, "Unsupported BMP Palette size"),  # more colours than 8 bits index
    ],
)
def test_bmp_layouts_opencv_asserts_on_go_to_pillow_quietly(
    image: np.ndarray, field: int, value: int, pillow_says: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # OpenCV printed "[ERROR] imdecode_ ... can't read header" with its assertion (QA).
    buf = io.BytesIO()
    Image.fromarray(image).convert("P").save(buf, "BMP")
    data = bytearray(buf.getvalue())
    struct.pack_into("<I", data, field, value)
    with pytest.raises(DecodeError, match=f"'odd.bmp'.*{pillow_says}"):
        decode(bytes(data), key="odd.bmp")
    assert capfd.readouterr().err == ""


def test_a_pillow_plugin_tripping_over_a_hostile_field_is_a_decode_error(
    image: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A TIFF whose StripOffsets tag claims type ASCII: Pillow raised a bare TypeError,
    # which named no file and escaped callers that catch DecodeError (QA).
    data = bytearray(tiff(image))
    ifd = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack("<H", data[ifd : ifd + 2])[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack("<H", data[entry : entry + 2])[0] == 273:  # StripOffsets
            data[entry + 2 : entry + 4] = struct.pack("<H", 2)
    with pytest.raises(DecodeError, match=r"'odd\.tif'.*TypeError in Pillow"):
        decode(bytes(data), key="odd.tif")
    # Running out of memory says nothing of the file: it is not called corrupt.
    from PIL import ImageFile

    def no_memory(self: object) -> None:
        raise MemoryError

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_memory)
    with pytest.raises(MemoryError):
        decode(tiff(image), key="big.tif")

    # Any other plugin error is the file's, named: a KeyError escaped unnamed (QA mutation).
    def missing_tag(self: object) -> None:
        raise KeyError(279)

    monkeypatch.setattr(ImageFile.ImageFile, "load", missing_tag)
    with pytest.raises(DecodeError, match=r"'odd\.tif'.*KeyError in Pillow: 279"):
        decode(tiff(image), key="odd.tif")


def test_a_bmp_bomb_is_a_bomb_before_it_is_cut_short() -> None:
    # 60000 x 60000 declared in a 58-byte file: the pixel limit names it, not "truncated".
    header = b"BM" + struct.pack("<IHHI", 58, 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, 60000, 60000, 1, 24, 0, 0, 0, 0, 0, 0)
    with pytest.raises(DecodeError, match="exceeds max_pixels") as caught:
        decode(header + info + b"\0\0\0\0", key="bomb.bmp")
    assert "'bomb.bmp'" in str(caught.value)


def test_pillows_file_object_is_not_in_the_message() -> None:
    # "cannot identify image file <_io.BytesIO object at 0x7f...>": an address, not news.
    with pytest.raises(DecodeError, match="corrupt, truncated or unsupported") as info:
        decode(b"GIF89a" + struct.pack("<HH", 4, 4) + b"\xff" * 40, key="odd.gif")
    assert "BytesIO" not in str(info.value) and "0x" not in str(info.value)


def test_a_cut_gif_is_reported_by_pillow_without_decoder_noise(
    image: np.ndarray, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "GIF")
    with pytest.raises(DecodeError, match="truncated") as info:
        decode(buf.getvalue()[:-200], key="cut.gif")
    assert "'cut.gif'" in str(info.value)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("lossless", [False, True])
def test_a_cut_webp_is_named_without_decoder_noise(
    image: np.ndarray, lossless: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "WEBP", lossless=lossless)
    data = buf.getvalue()
    for cut in (16, 30, len(data) // 2, len(data) - 1):  # 30: inside OpenCV's header read
        with pytest.raises(DecodeError, match="truncated WebP: it ends") as info:
            decode(data[:cut], key="cut.webp")
        assert "'cut.webp'" in str(info.value)
    np.testing.assert_array_equal(decode(data + b"trailing").array, decode(data).array)
    assert capfd.readouterr().err == ""


def test_corrupt_jpeg_body_raises(image: np.ndarray) -> None:
    data = bytearray(jpeg(image))
    data[len(data) // 2 : len(data) // 2 + 200] = b"\xff\xd9" * 100  # EOI markers mid-scan
    with pytest.raises(DecodeError, match="corrupt"):
        decode(bytes(data), key="x")


def huge_jpeg(image: np.ndarray, height: int, width: int) -> bytes:
    data = bytearray(jpeg(image))
    sof = data.index(b"\xff\xc0")  # baseline SOF0: length(2) precision(1) height(2) width(2)
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_decompression_bomb_refused_before_allocating(image: np.ndarray) -> None:
    bomb_jpeg = huge_jpeg(image, 60000, 60000)  # 3.6 Gpx claimed: ~14 GB as RGBX
    bomb_png = bytearray(png(image))
    bomb_png[16:24] = struct.pack(">II", 100000, 100000)
    for data in (bomb_jpeg, bytes(bomb_png)):
        tracemalloc.start()
        with pytest.raises(DecodeError, match="max_pixels") as info:
            decode(data, key="bomb")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 1_000_000
        assert "bomb" in str(info.value) and "pass max_pixels >=" in str(info.value)


def test_pixel_limit_is_configurable(image: np.ndarray) -> None:
    data = jpeg(image)
    with pytest.raises(DecodeError, match="max_pixels=1,000"):
        decode(data, max_pixels=1000)
    assert decode(data, max_pixels=96 * 128).array.shape == (96, 128, 3)


def test_accepts_buffers_other_than_bytes(image: np.ndarray) -> None:
    data = jpeg(image)
    ref = decode(data).array
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert np.array_equal(decode(buf).array, ref)


def test_a_sampling_layout_turbojpeg_cannot_name_still_decodes(cpu_backend: str) -> None:
    # cjpeg -quality 95 -sample 2x2,1x1,2x2 of a 32 x 24 four-colour quad (805 bytes):
    # TurboJPEG's API refuses it ("Could not determine subsampling level"); libjpeg decodes it.
    data = (Path(__file__).parent / "data" / "sampling_2x2_1x1_2x2.jpg").read_bytes()
    image = decode(data, key="odd.jpg").array
    assert image.shape == (24, 32, 3)
    expected = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (240, 240, 240)]
    corners = [image[3, 3], image[3, 28], image[20, 3], image[20, 28]]
    for got, want in zip(corners, expected, strict=True):
        assert np.abs(got.astype(int) - want).max() <= 12, (got, want)
    out = np.empty((3, 16, 16), np.float32)
    load_into(data, EvalTransform(16, resize=16), np.random.default_rng(0), out, dtype="float32")
    assert np.isfinite(out).all()
    # Damage inside its coded data: Pillow's libjpeg decodes it with a warning it ignores
    # (damaged pixels); the native backend entropy-decodes it first, warnings as errors.
    damaged = bytearray(data)
    damaged[500:540] = bytes(40)
    if cpu_backend == "native":
        with pytest.raises(DecodeError, match=r"'odd\.jpg'.*bad Huffman code"):
            decode(bytes(damaged), key="odd.jpg")
        with pytest.raises(DecodeError, match=r"'odd\.jpg'.*bad Huffman code"):
            load_into(bytes(damaged), EvalTransform(16), None, out, dtype="float32", key="odd.jpg")


def test_such_a_layout_whose_sides_are_no_multiples_of_8_still_decodes() -> None:
    # The entropy check decodes at 1/8 scale into ceil(side / 8) pixels; the one fixture
    # is 32 x 24, where floor would do as well, and a floor refused every other size as
    # corrupt unnoticed (QA mutation). Its frame header says 30 x 20 here: the same two
    # by two 16-pixel MCUs of coded data, cropped.
    data = bytearray((Path(__file__).parent / "data" / "sampling_2x2_1x1_2x2.jpg").read_bytes())
    sof = next(i for i in range(2, len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xC0)
    struct.pack_into(">HH", data, sof + 5, 20, 30)  # height, width
    image = decode(bytes(data), key="odd.jpg").array
    assert image.shape == (20, 30, 3)
    assert np.abs(image[3, 3].astype(int) - (220, 30, 30)).max() <= 12


def tiff(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, "TIFF")
    return out.getvalue()


def test_a_tiff_bomb_meets_max_pixels_not_pillows_own_limit(image: np.ndarray) -> None:
    data = bytearray(tiff(image))
    ifd = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack("<H", data[ifd : ifd + 2])[0]):
        at = ifd + 2 + 12 * i
        tag, typ = struct.unpack("<HH", data[at : at + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength -> 60000 (3.6 Gpx)
            data[at + 8 : at + 12] = struct.pack(
                "<HH" if typ == 3 else "<I", *((60000, 0) if typ == 3 else (60000,))
            )
    with pytest.raises(DecodeError, match="max_pixels") as info:
        decode(bytes(data), key="bomb.tiff")
    assert "pass max_pixels >=" in str(info.value) and "decompression bomb" not in str(info.value)
    assert decode(tiff(image)).array.shape == image.shape  # an ordinary TIFF is untouched


def test_tiff_header_size_in_both_byte_orders() -> None:
    from gpu_loader.ops._formats import header_size

    big = b"MM\x00*" + struct.pack(">IH", 8, 2)
    big += struct.pack(">HHII", 256, 4, 1, 70000) + struct.pack(">HHIHH", 257, 3, 1, 3, 0)
    assert header_size(big + b"\x00" * 4, "tiff") == (3, 70000)
    assert header_size(b"II+\x00" + b"\x00" * 12, "tiff") is None  # BigTIFF: not read here


def test_rgba_tiff_colours_are_not_premultiplied(image: np.ndarray) -> None:
    rgba = np.dstack([image, np.full(image.shape[:2], 128, np.uint8)])
    out = io.BytesIO()
    Image.fromarray(rgba).save(out, "TIFF")
    np.testing.assert_array_equal(decode(out.getvalue()).array, decode(png(rgba)).array)
    np.testing.assert_array_equal(decode(out.getvalue()).array, image)  # alpha dropped


def test_a_16_bit_png_without_its_trailer_decodes_as_the_whole_file() -> None:
    grey = (np.arange(48 * 64, dtype=np.uint16).reshape(48, 64) * 21) + 1000
    out = io.BytesIO()
    Image.fromarray(grey).save(out, "PNG")
    whole = out.getvalue()
    np.testing.assert_array_equal(decode(whole[:-12]).array, decode(whole).array)


def test_max_pixels_not_pillows_own_limit_decides(
    image: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pillow refuses images over 2 x Image.MAX_IMAGE_PIXELS whatever max_pixels allows;
    # here its limit is tiny, so every Pillow-decoded format would hit it.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    odd = (Path(__file__).parent / "data" / "sampling_2x2_1x1_2x2.jpg").read_bytes()
    cmyk = io.BytesIO()
    Image.fromarray(image).convert("CMYK").save(cmyk, "JPEG", quality=95)
    ppm = io.BytesIO()
    Image.fromarray(image).save(ppm, "PPM")  # QA: 200 Mpx PPMs met Pillow's limit
    for data in (odd, cmyk.getvalue(), tiff(image), ppm.getvalue()):
        assert decode(data, key="big").array.ndim == 3
    assert Image.MAX_IMAGE_PIXELS == 100  # lifted for those decodes only
    for data in (tiff(image), ppm.getvalue()):
        with pytest.raises(DecodeError, match="max_pixels"):
            decode(data, max_pixels=50)


def test_pillows_size_is_checked_when_our_header_reads_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ImageWidth/ImageLength twice: SLONG entries (Pillow keeps them: 40 x 40) before LONG
    # ones (our parser reads these: 20 x 20). Ours is within max_pixels and over Pillow's
    # (tiny) limit, which is lifted: Pillow's own size must still meet max_pixels.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    pixels = b"\x80" * (40 * 40)
    entries = [(256, 9, 40), (257, 9, 40), (256, 4, 20), (257, 4, 20), (258, 3, 8)]
    entries += [(259, 3, 1), (262, 3, 1), (273, 4, 0), (277, 3, 1), (278, 4, 40)]
    entries += [(279, 4, len(pixels))]
    data_at = 8 + 2 + 12 * len(entries) + 4
    ifd = struct.pack("<H", len(entries))
    for tag, typ, value in entries:
        value = data_at if tag == 273 else value
        packed = (
            struct.pack("<HH", value, 0)
            if typ == 3
            else struct.pack("<i" if typ == 9 else "<I", value)
        )
        ifd += struct.pack("<HHI", tag, typ, 1) + packed
    data = b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + pixels
    from gpu_loader.ops._formats import header_size

    assert header_size(data, "tiff") == (20, 20)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with Image.open(io.BytesIO(data)) as im:
        if im.size != (40, 40):  # Pillow 12 keeps the later entries, as our parser does
            pytest.skip(f"this Pillow reads {im.size}, the size our header gave")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DecodeError, match="40x40 = 1,600 pixels exceeds max_pixels=1,000"):
        decode(data, key="two-sizes.tif", max_pixels=1000)
    assert decode(data, max_pixels=2000).array.shape == (40, 40, 3)
    assert Image.MAX_IMAGE_PIXELS == 100


def test_a_child_forked_during_a_lifted_decode_gets_pillows_limit_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpu_loader.ops._decode as dec

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # as a lifted decode leaves it
    monkeypatch.setattr(dec, "_lifts", 1)
    monkeypatch.setattr(dec, "_pillow_limit", 12345)
    dec._reset_lift_in_child()  # what os.register_at_fork runs in the child
    assert Image.MAX_IMAGE_PIXELS == 12345 and dec._lifts == 0
    assert not dec._lift_lock.locked()


def test_a_bmp_cut_inside_its_row_padding_is_refused() -> None:
    # One pixel wide, 24-bit: 3 bytes of pixel and 1 of padding per row; the file's last
    # byte is padding, and without it the rows are short.
    buf = io.BytesIO()
    Image.fromarray(np.full((5, 1, 3), 200, np.uint8)).save(buf, "BMP")
    data = buf.getvalue()
    decode(data)
    with pytest.raises(DecodeError, match="truncated or corrupt BMP: it ends"):
        decode(data[:-1], key="cut.bmp")
