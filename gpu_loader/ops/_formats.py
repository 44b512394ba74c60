"""Format sniffing and header parsing without decoding (sizes, EXIF orientation).

These run before any pixel buffer exists, so the decompression-bomb check can refuse an image
from its header alone. They only read a few hundred bytes and never raise on odd input: an
unparseable header reads as "unknown" and the decoder itself reports the error.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Literal

import numpy as np

Format = Literal["jpeg", "png", "gif", "bmp", "webp", "tiff", "pnm"]


def sniff(data: bytes | memoryview) -> Format | None:
    """The image format from the magic bytes, or None when not a supported image."""
    head = bytes(data[:12])
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head.startswith(b"BM"):
        return "bmp"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if head[:1] == b"P" and head[1:2] in _PNM_KINDS and head[2:3].isspace():
        return "pnm"  # netpbm: PBM/PGM/PPM, plain (P1-P3) or raw (P4-P6)
    return None


_PNM_KINDS = (b"1", b"2", b"3", b"4", b"5", b"6")


def header_size(data: bytes | memoryview, fmt: Format) -> tuple[int, int] | None:
    """(height, width) stored in a PNG/GIF/BMP/WebP/TIFF header, or None if it cannot be read."""
    try:
        if fmt == "png" and bytes(data[12:16]) == b"IHDR":
            w, h = struct.unpack(">II", bytes(data[16:24]))
            return h, w
        if fmt == "gif":
            w, h = struct.unpack("<HH", bytes(data[6:10]))
            return h, w
        if fmt == "bmp":
            if int.from_bytes(bytes(data[14:18]), "little") == 12:  # OS/2 1.x: 16-bit sides
                w, h = struct.unpack("<HH", bytes(data[18:22]))
                return h, w
            w, h = struct.unpack("<ii", bytes(data[18:26]))
            return abs(h), abs(w)  # negative height means top-down rows
        if fmt == "webp":
            return _webp_size(bytes(data[12:30]))
        if fmt == "tiff":
            return _tiff_size(data)
        if fmt == "pnm":
            return _pnm_size(bytes(data[:4096]))
    except struct.error:
        return None
    return None


def _pnm_size(head: bytes) -> tuple[int, int] | None:
    """(height, width) of a netpbm header; None if not readable from ``head`` (the decoder
    then decides). Read here so `max_pixels` speaks before Pillow's own limit (a 20000 x
    10000 PPM was refused under Pillow's 179 Mpx whatever `max_pixels` said)."""
    parsed = _pnm_tokens(head, 2)
    if parsed is None:
        return None
    (width, height), _ = parsed
    return height, width


def _pnm_tokens(head: bytes, count: int) -> tuple[list[int], int] | None:
    """The first ``count`` decimal tokens after the magic and the offset just past the
    last; ``#`` comments run to the end of a line (LF or CR). None when ``head`` ends
    first, or for anything odd (a comment touching a number: Pillow reads it as splitting
    the number), so that the decoder decides."""
    tokens: list[int] = []
    i = 2
    while len(tokens) < count:
        if i >= len(head):
            return None
        c = head[i : i + 1]
        if c == b"#":
            ends = [e for e in (head.find(b"\n", i), head.find(b"\r", i)) if e >= 0]
            if not ends:
                return None
            i = min(ends) + 1
        elif c.isspace():
            i += 1
        elif c.isdigit():
            j = i
            while j < len(head) and head[j : j + 1].isdigit():
                j += 1
            if head[j : j + 1] == b"#":
                return None
            tokens.append(int(head[i:j]))
            i = j
        else:
            return None
    return tokens, i


def pnm_damage(data: bytes | memoryview) -> str | None:
    """Why a binary netpbm file (P4-P6) holds fewer pixel bytes than its header needs, or
    None (also for plain P1-P3 files and headers not read here: the decoder decides).
    Pillow refuses such a file by itself, unless a training script set
    ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES``: then it decodes it padded with black."""
    kind = bytes(data[1:2])
    if kind not in (b"4", b"5", b"6"):
        return None
    parsed = _pnm_tokens(bytes(data[:4096]), 2 if kind == b"4" else 3)
    if parsed is None:
        return None
    tokens, end = parsed
    width, height = tokens[0], tokens[1]
    if kind == b"4":
        needed = -(-width // 8) * height
    else:
        depth = 1 if tokens[2] < 256 else 2
        needed = width * height * depth * (3 if kind == b"6" else 1)
    have = len(data) - (end + 1)  # one whitespace byte ends the header
    if have < needed:
        return f"it holds {max(have, 0):,} bytes of pixels, its header needs {needed:,}"
    return None


def _tiff_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(ImageLength, ImageWidth) of a classic TIFF's first image; None for BigTIFF or
    anything unreadable. Read here so the pixel limit speaks before Pillow's own check
    (whose message names a limit `max_pixels` does not move)."""
    order = "<" if bytes(data[:2]) == b"II" else ">"
    (version, ifd) = struct.unpack(order + "HI", bytes(data[2:8]))
    if version != 42:
        return None
    (count,) = struct.unpack(order + "H", bytes(data[ifd : ifd + 2]))
    found: dict[int, int] = {}
    for i in range(min(count, 4096)):
        entry = bytes(data[ifd + 2 + 12 * i : ifd + 14 + 12 * i])
        tag, typ = struct.unpack(order + "HH", entry[:4])
        if tag in (256, 257) and typ in (3, 4):  # ImageWidth, ImageLength: SHORT or LONG
            found[tag] = struct.unpack(
                order + ("H" if typ == 3 else "I"), entry[8 : 10 if typ == 3 else 12]
            )[0]
    if 256 in found and 257 in found:
        return found[257], found[256]
    return None


# Real PNGs have tens to a few thousand chunks (the image data split in pieces) and a few
# text chunks. More than these is hostile input (QA: a 12 MB file of a million empty
# tEXt chunks took 3 s per decode and printed a libpng warning for each): refused.
_MAX_PNG_CHUNKS = 100_000
_MAX_PNG_TEXT_CHUNKS = 1_000
_PNG_TEXT = (b"tEXt", b"zTXt", b"iTXt")


def png_damage(data: bytes | memoryview) -> tuple[str | None, int | None]:
    """``(why the PNG cannot be decoded or None, where its complete chunks end when it has
    no IEND trailer, else None)``, from its chunk layout and checksums alone. The reason is
    None when the image data is complete and intact (or the layout is too odd to judge:
    the decoder has the last word).

    Refused: the file ends inside an IDAT chunk, or inside any chunk before the first
    IDAT, or has no IDAT at all (cut short); a critical chunk (IHDR, PLTE, IDAT) whose
    CRC does not match (damaged); over `_MAX_PNG_CHUNKS` chunks or
    `_MAX_PNG_TEXT_CHUNKS` text chunks (hostile: each costs the decoder time, and a
    malformed one a libpng warning line). A file that ends after complete IDAT chunks (only the
    IEND trailer, or an ancillary chunk after the image data, missing) still decodes, as
    with libpng's own tools: the caller closes it at the given offset. Checked before
    decoding because libpng prints its own error lines to stderr for such files (OpenCV
    adds its own), which a loader that reports the file by key should not repeat on the
    terminal. The CRCs cost about 0.3 ms per MB (zlib, outside the GIL), a small part of
    a PNG decode.
    """
    view = memoryview(data)
    end = len(view)
    pos, idat_done, texts = 8, False, 0
    for _ in range(_MAX_PNG_CHUNKS):
        if pos + 8 > end:
            if idat_done:
                return None, pos
            if pos == end:
                return "it ends before any image data (no IDAT chunk)", None
            return f"it ends inside a chunk header at byte {pos:,} (file size {end:,})", None
        length = int.from_bytes(view[pos : pos + 4], "big")
        kind = bytes(view[pos + 4 : pos + 8])
        if kind == b"IEND":
            if idat_done:
                return None, None
            return "it has no image data (IEND before any IDAT chunk)", None
        chunk_end = pos + 12 + length  # length, type, data, CRC
        if chunk_end > end:
            if idat_done and kind != b"IDAT":
                return None, pos  # an ancillary chunk after the image data
            return (
                f"it ends inside chunk {_chunk_name(kind)!r} at byte {pos:,}: the chunk needs "
                f"{chunk_end - pos:,} bytes, the file has {end - pos:,} from there"
            ), None
        if kind[:1].isupper():  # critical: libpng refuses it on a CRC error (and prints)
            stored = int.from_bytes(view[chunk_end - 4 : chunk_end], "big")
            if zlib.crc32(view[pos + 4 : chunk_end - 4]) != stored:
                name = _chunk_name(kind)
                return f"chunk {name!r} at byte {pos:,} fails its CRC (damaged data)", None
        if kind == b"IHDR" and length >= 10 and (bad := _ihdr_damage(view[pos + 8 : pos + 18])):
            return bad, None
        if kind == b"IDAT":
            idat_done = True
        elif kind in _PNG_TEXT:
            texts += 1
            if texts > _MAX_PNG_TEXT_CHUNKS:
                return f"it holds over {_MAX_PNG_TEXT_CHUNKS:,} text chunks (hostile?)", None
        pos = chunk_end
    return f"it has over {_MAX_PNG_CHUNKS:,} chunks (hostile?)", None


# PNG colour type -> the bit depths the standard allows for it (libpng prints a warning
# and an error line for any other pair before refusing the file).
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}


def _ihdr_damage(ihdr: memoryview) -> str | None:
    depth, colour = ihdr[8], ihdr[9]
    allowed = _PNG_DEPTHS.get(colour)
    if allowed is None:
        return f"its header names colour type {colour}, which PNG does not define"
    if depth not in allowed:
        return f"its header pairs colour type {colour} with bit depth {depth}, not allowed"
    return None


# BI_RGB, RLE8, RLE4, BITFIELDS, JPEG, PNG, ALPHABITFIELDS; 11-13: Windows' CMYK forms.
_BMP_COMPRESSIONS = (0, 1, 2, 3, 4, 5, 6, 11, 12, 13)


def bmp_damage(data: bytes | memoryview) -> str | None:
    """Why an uncompressed BMP cannot be decoded (it ends before its pixel rows do), or
    None when its rows are all there or the layout is not one judged here (compressed
    rows, odd headers: the decoder has the last word).

    Checked before decoding because OpenCV prints an error line to stderr for a cut BMP
    before giving up, which a loader that reports the file by key should not repeat.
    """
    view = memoryview(data)
    header = int.from_bytes(view[14:18], "little") if len(view) >= 18 else 0
    if len(view) < (34 if header >= 40 else 26):  # the fields read below
        return f"it ends inside its header (file size {len(view):,})"
    (offset,) = struct.unpack("<I", view[10:14])
    if header == 12:  # OS/2 BITMAPCOREHEADER: unsigned 16-bit sides, no compression
        width, height, _planes, bits = struct.unpack("<HHHH", view[18:26])
        compression = 0
    elif header >= 40:
        width, height, _planes, bits, compression = struct.unpack("<iiHHI", view[18:34])
    else:
        return None
    if compression not in _BMP_COMPRESSIONS:  # OpenCV prints a failed assertion for it
        return f"its header names compression {compression}, which BMP does not define"
    # The colour masks that follow a version 3 header for these compressions.
    masks = {3: 12, 6: 16}.get(compression, 0) if header == 40 else 0
    if 0 < offset < 14 + header + masks:
        # OpenCV read the rows from inside the headers: every row shifted, no error (QA).
        # Offset 0 (unset) goes to Pillow, which reads the rows after the palette.
        return (
            f"its pixel data offset {offset} points inside its headers "
            f"({14 + header + masks} bytes)"
        )
    if compression not in (0, 3, 6) or bits not in (1, 4, 8, 16, 24, 32) or width <= 0:
        return None  # RLE or embedded JPEG/PNG rows: their length is not known up front
    rows = -(-width * bits // 32) * 4
    needed = offset + rows * abs(height)
    if len(view) < needed:
        return f"it ends at byte {len(view):,}, inside its pixel rows ({needed:,} bytes needed)"
    return None


# The info-header sizes of the BMP versions: core (OS/2 1.x), 3, OS/2 2.x short and long,
# the two 3 extensions, 4 and 5.
_BMP_HEADERS = (12, 40, 52, 56, 16, 64, 108, 124)


def bmp_for_opencv(data: bytes | memoryview) -> bool:
    """Whether OpenCV decodes this BMP without printing to stderr and as Pillow would:
    plain or RLE rows under a known header, a palette no longer than its bit depth allows,
    and not 16 bits a pixel. Otherwise Pillow decodes or refuses it, quietly (QA: OpenCV
    printed a failed assertion for embedded JPEG/PNG rows, CMYK compressions, 300 palette
    entries and an unknown header size, and its 16-bit pixels were up to 7 levels off)."""
    view = memoryview(data)
    header = int.from_bytes(view[14:18], "little") if len(view) >= 18 else 0
    if len(view) >= 14 and int.from_bytes(view[10:14], "little") == 0:
        return False  # no pixel data offset: Pillow takes the rows after the palette
    if header == 12:
        return True
    if header not in _BMP_HEADERS or header < 40 or len(view) < 50:
        return False
    bits, compression = struct.unpack("<HI", view[28:34])
    (colours,) = struct.unpack("<I", view[46:50])
    if bits == 16:
        return False  # OpenCV widens 5 bits by a shift (31 -> 248), Pillow to 255 (QA)
    # Not 6 (BI_ALPHABITFIELDS): OpenCV prints a failed assertion, then refuses it (QA).
    return compression in (0, 1, 2, 3) and (bits > 8 or colours <= 1 << bits)


def webp_damage(data: bytes | memoryview) -> str | None:
    """Why a WebP cannot be decoded (it ends before the length its RIFF header gives), or
    None. Checked before decoding because OpenCV prints an error line for a WebP cut
    inside its header."""
    view = memoryview(data)  # sniffed as WebP: 12 bytes at least
    total = int.from_bytes(view[4:8], "little") + 8
    if len(view) < total:
        return f"it ends at byte {len(view):,}, before the {total:,} bytes its RIFF header gives"
    return None


def _chunk_name(kind: bytes) -> str:
    """A PNG chunk type for a message: its letters, or hex when they are not letters."""
    return kind.decode("latin-1") if kind.isalpha() else kind.hex()


def _webp_size(chunk: bytes) -> tuple[int, int] | None:
    kind = chunk[:4]
    if kind == b"VP8X":
        w = 1 + int.from_bytes(chunk[12:15], "little")
        h = 1 + int.from_bytes(chunk[15:18], "little")
        return h, w
    if kind == b"VP8L":
        bits = int.from_bytes(chunk[9:13], "little")
        return 1 + ((bits >> 14) & 0x3FFF), 1 + (bits & 0x3FFF)
    if kind == b"VP8 ":
        w, h = struct.unpack("<HH", chunk[14:18])
        return h & 0x3FFF, w & 0x3FFF
    return None


def _jpeg_segments(view: memoryview) -> Iterator[tuple[int, int, int]]:
    """``(marker, data offset, data length)`` of each marker segment of a JPEG, up to and
    including the first start of scan (SOS, 0xDA). Stops early, quietly, at bytes that are
    not a marker or a segment that runs past the end."""
    pos, end = 2, len(view)
    while pos + 4 <= end:
        if view[pos] != 0xFF:
            return
        marker = view[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # SOI, TEM, RSTn: no length
            pos += 2
            continue
        length = (view[pos + 2] << 8) | view[pos + 3]
        if length < 2 or pos + 2 + length > end:
            return
        yield marker, pos + 4, length - 2
        if marker == 0xDA:
            return
        pos += 2 + length


def jpeg_chroma_ratio(data: bytes | memoryview) -> int:
    """How much coarser the chroma of a JPEG is than its luma along the coarser axis: 1
    for 4:4:4 or grey, 2 for 4:2:0, 4:2:2 and 4:4:0, 4 for 4:1:1; 1 when unreadable.

    From the frame header's sampling factors (the largest over the smallest, per axis).
    """
    view = memoryview(data)
    for marker, at, size in _jpeg_segments(view):
        if marker in _SOF_HUFFMAN or marker in _OTHER_SOF:
            count = view[at + 5] if size >= 6 else 0
            if count == 0 or size < 6 + 3 * count:
                return 1
            factors = [view[at + 7 + 3 * i] for i in range(count)]
            h = [f >> 4 for f in factors]
            v = [f & 15 for f in factors]
            if min(h) == 0 or min(v) == 0:
                return 1
            return max(max(h) // min(h), max(v) // min(v))
        if marker == 0xDA:
            break
    return 1


def jpeg_orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation (1-8) of a JPEG, 1 when absent or unreadable.

    Walks the marker segments up to the first scan, looking for an APP1 "Exif" segment.
    """
    view = memoryview(data)
    exif: list[bytes] = []
    for marker, at, size in _jpeg_segments(view):
        _add_exif_segment(exif, view, marker, at, size)
    return _tiff_orientation(b"".join(exif))  # 1 for none: b"" has no TIFF magic


def _add_exif_segment(exif: list[bytes], view: memoryview, marker: int, at: int, size: int) -> None:
    """Add this segment's Exif bytes to ``exif`` (the parts of the block so far), when it
    is an APP1 Exif segment: Pillow joins every one before the scan (a block over 64 KiB
    must be split; QA: a first segment empty or cut turned nothing here, where Pillow read
    on). Parts, joined once: adding each to the block so far was quadratic (QA: 2 s for a
    4.4 MB file of 100-byte segments)."""
    if marker == 0xE1 and bytes(view[at : at + 6]) == b"Exif\x00\x00":
        exif.append(bytes(view[at + 6 : at + size]))


# Start-of-frame markers of Huffman-coded baseline, extended and progressive JPEGs: the
# ones `jpeg_header` reads itself. Other frames (lossless, arithmetic) go to libjpeg.
_SOF_HUFFMAN = (0xC0, 0xC1, 0xC2)
_OTHER_SOF = frozenset(range(0xC3, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG, DAC are not frames


def jpeg_header(data: bytes | memoryview) -> tuple[int, int, str, int] | None:
    """``(height, width, colourspace, EXIF orientation)`` of a common JPEG, None otherwise.

    One pass over the marker segments in Python, holding the GIL: libjpeg's header read
    (simplejpeg) releases and retakes it, and with decode threads busy that retake cost
    more than the parse (loader throughput +7% measured on 2 cores). The colourspace is
    libjpeg-turbo's default guess, in simplejpeg's names: 1 component Gray; 3 YCbCr, or
    RGB with an Adobe marker of transform 0 or, without JFIF or Adobe markers, component
    ids "RGB"; 4 CMYK, or YCCK with an Adobe marker of transform other than 0. None
    (ask libjpeg, which also words the errors) for anything else: no frame before the
    first scan, a frame other than baseline/extended/progressive Huffman, precision
    other than 8 bits, a zero size, an unexpected component count, a malformed segment.
    """
    view = memoryview(data)
    frame: tuple[int, int, bytes] | None = None
    jfif, adobe = False, -1
    exif: list[bytes] = []
    for marker, at, size in _jpeg_segments(view):
        if marker == 0xDA:
            orientation = _tiff_orientation(b"".join(exif))
            return _header_result(frame, jfif, adobe, orientation)
        if marker in _SOF_HUFFMAN:
            if frame is not None or size < 6 or view[at] != 8 or size != 6 + 3 * view[at + 5]:
                return None
            height = (view[at + 1] << 8) | view[at + 2]
            width = (view[at + 3] << 8) | view[at + 4]
            frame = (height, width, bytes(view[at + 6 : at + size : 3]))
        elif marker in _OTHER_SOF:
            return None
        elif marker == 0xE0 and size >= 14 and bytes(view[at : at + 5]) == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and size >= 12 and bytes(view[at : at + 5]) == b"Adobe":
            adobe = view[at + 11]
        else:
            _add_exif_segment(exif, view, marker, at, size)
    return None  # no scan: truncated or not a JPEG stream


def _header_result(
    frame: tuple[int, int, bytes] | None, jfif: bool, adobe: int, orientation: int
) -> tuple[int, int, str, int] | None:
    if frame is None:
        return None
    height, width, ids = frame
    if height == 0 or width == 0:
        return None
    if len(ids) == 1:
        colorspace = "Gray"
    elif len(ids) == 3:
        if jfif:
            colorspace = "YCbCr"
        elif adobe >= 0:
            colorspace = "RGB" if adobe == 0 else "YCbCr"
        else:
            colorspace = "RGB" if ids == b"RGB" else "YCbCr"
    elif len(ids) == 4:
        colorspace = "CMYK" if adobe in (-1, 0) else "YCCK"
    else:
        return None
    return height, width, colorspace, orientation


def _tiff_orientation(tiff: bytes) -> int:
    """The orientation Pillow's ``exif_transpose`` applies for an APP1 Exif block (the bytes
    after its ``Exif\\0\\0``): 1 when it has none, or one it cannot read or use.

    Mirrors ``Image.Exif.load`` and ``ImageFileDirectory_v2.load`` (Pillow 13), so a
    malformed block turns a JPEG as Pillow would (QA: a later Orientation entry after one of
    an unknown type, a doubled prefix, a RATIONAL 6/1 each turned nothing here): a doubled
    ``Exif\\0\\0`` prefix is dropped; the header must carry TIFF's magic (as Pillow
    tests it); entries of unknown types, with no values, repeating a tag already read,
    or past the running out-of-line budget (the block's size) are skipped; an entry cut
    short, or out-of-line values running past the block, end the walk. The first
    Orientation entry read decides: any number equal to an integer 1-8 (`_TIFF_NUMBERS`,
    RATIONAL and SRATIONAL; not BYTE), the first of several. The native ``jpeg_header`` walks the
    same rules in C (tests compare both with Pillow on fuzzed blocks).
    """
    if tiff[:6] == b"Exif\x00\x00":
        tiff = tiff[6:]
    if tiff[:4] in (b"II*\x00", b"II\x00*"):
        order = "<"
    elif tiff[:4] in (b"MM\x00*", b"MM*\x00", b"MM\x00+"):  # Pillow misses big-endian
        order = ">"  # BigTIFF (it tests the third byte), and reads it as a classic TIFF
    else:
        return 1  # no TIFF header, or little-endian BigTIFF (whose IFD offset it cannot read)
    end = len(tiff)
    if end < 8:
        return 1
    (ifd,) = struct.unpack(order + "I", tiff[4:8])
    if ifd + 2 > end:
        return 1
    (count,) = struct.unpack(order + "H", tiff[ifd : ifd + 2])
    read: set[int] = set()  # tags already read: a repeat is skipped
    budget = 0  # out-of-line bytes so far, skipped entries' included
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        if entry + 12 > end:
            return 1
        tag, typ, n = struct.unpack(order + "HHI", tiff[entry : entry + 8])
        unit = _TIFF_UNITS.get(typ)
        if tag in read or unit is None:
            continue
        size, at = n * unit, entry + 8
        if size > 4:
            (at,) = struct.unpack(order + "I", tiff[entry + 8 : entry + 12])
            budget += size
            if budget > end:
                continue
            if at + size > end:
                return 1  # a short read ends Pillow's walk
        if size == 0:
            continue
        if tag == 0x0112:
            return _tiff_orientation_value(tiff, at, typ, order)
        read.add(tag)
    return 1


# TIFF field types Pillow reads as numbers -> struct format; and every type it reads ->
# bytes per value (BYTE, ASCII and UNDEFINED come out as bytes or text, and turn nothing).
_TIFF_NUMBERS = {3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 11: "f", 12: "d", 13: "I", 16: "Q"}
_TIFF_UNITS = {1: 1, 2: 1, 7: 1, 5: 8, 10: 8} | {
    typ: struct.calcsize("<" + fmt) for typ, fmt in _TIFF_NUMBERS.items()
}


def _tiff_orientation_value(tiff: bytes, at: int, typ: int, order: str) -> int:
    """The orientation a field's first value gives: 1 unless it is a number (NaN is not)
    equal to an integer 1-8."""
    if typ in (5, 10):  # RATIONAL, SRATIONAL: NaN for a zero denominator
        num, den = struct.unpack(order + ("II" if typ == 5 else "ii"), tiff[at : at + 8])
        value: float = num // den if den and num % den == 0 else 0
    elif (fmt := _TIFF_NUMBERS.get(typ)) is not None:
        (value,) = struct.unpack(order + fmt, tiff[at : at + struct.calcsize(order + fmt)])
    else:
        return 1
    return int(value) if value in range(1, 9) else 1


def orientation_swaps_axes(orientation: int) -> bool:
    """True for the EXIF orientations (5-8) that transpose the image."""
    return orientation >= 5


# ------------------------------------------------------------------- JPEG compressed data

_TEM, _RST0, _EOI, _SOS, _DRI = 0x01, 0xD0, 0xD9, 0xDA, 0xDD
# Markers with a length field that may come between scans: DHT, DAC, DQT, DNL, DRI, APPn,
# COM, and SOS itself.
_BETWEEN_SCANS = frozenset({0xC4, 0xCC, 0xDB, 0xDC, _DRI, *range(0xE0, 0xF0), 0xFE, _SOS})


Damage = tuple[int, int, int, int]
"""``(kind, at, a, b)``: see `_jpeg_check._WORDS`; ``at`` is the byte offset."""


def walk_jpeg_data(data: bytes | memoryview) -> tuple[Damage | None, int]:
    """The marker structure of a JPEG's compressed data, walked in Python (numpy finds the
    0xFF bytes; the reference for the native extension's walk): what breaks it (None if
    nothing does, or if the header has no scan), and the scans up to the end of image or
    the break. Inside compressed data a 0xFF byte is followed by 0x00 (stuffing), 0xFF
    (fill) or a restart marker in sequence; the data ends at a marker that may sit between
    scans (tables, comments, the next scan) or at the end of image. What follows the end
    of image (a motion photo's video, say) is not walked."""
    view = memoryview(data)
    restart, scan = 0, -1
    for marker, at, size in _jpeg_segments(view):
        if marker == _DRI and size >= 2:
            restart = (view[at] << 8) | view[at + 1]
        elif marker == _SOS:
            scan = at + size
    if scan < 0:
        return None, 0
    raw = np.frombuffer(view, np.uint8)
    ff = np.flatnonzero(raw[scan:-1] == 0xFF) + scan
    following = raw[ff + 1]
    real = (following != 0x00) & (following != 0xFF)  # stuffing and fill bytes are data
    places, codes = ff[real].tolist(), following[real].tolist()
    due, i, end, scans = 0, 0, len(raw), 1
    while i < len(places):
        at, code = places[i], codes[i]
        i += 1
        if code == _TEM:
            continue  # a marker with no length, allowed anywhere markers are (QA)
        if _RST0 <= code <= _RST0 + 7:
            if restart == 0:
                return (1, at, code - _RST0, 0), scans
            if code - _RST0 != due:
                return (2, at, code - _RST0, due), scans
            due = (due + 1) % 8
            continue
        if code == _EOI:
            return None, scans  # the end of the image: what follows is not its data
        if code not in _BETWEEN_SCANS:
            return (3, at, code, 0), scans
        if at + 4 > end:
            return (4, at, 0, 0), scans
        after = at + 2 + ((int(raw[at + 2]) << 8) | int(raw[at + 3]))
        if after > end:
            return (5, at, 0, 0), scans
        if code == _DRI:
            restart = (int(raw[at + 4]) << 8) | int(raw[at + 5]) if after >= at + 6 else 0
        elif code == _SOS:
            due = 0  # each scan counts its restarts from 0
            scans += 1
        while i < len(places) and places[i] < after:  # 0xFF bytes of the segment itself
            i += 1
    return (6, end, 0, 0), scans
