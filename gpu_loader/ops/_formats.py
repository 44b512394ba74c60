"""Format sniffing and header parsing without decoding (sizes, EXIF orientation).

These run before any pixel buffer exists, so the decompression-bomb check can refuse an image
from its header alone. They only read a few hundred bytes and never raise on odd input: an
unparseable header reads as "unknown" and the decoder itself reports the error.
"""

from __future__ import annotations

import struct
from typing import Literal

Format = Literal["jpeg", "png", "gif", "bmp", "webp", "tiff"]


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
    return None


def header_size(data: bytes | memoryview, fmt: Format) -> tuple[int, int] | None:
    """(height, width) stored in a PNG/GIF/BMP/WebP header, or None if it cannot be read."""
    try:
        if fmt == "png" and bytes(data[12:16]) == b"IHDR":
            w, h = struct.unpack(">II", bytes(data[16:24]))
            return h, w
        if fmt == "gif":
            w, h = struct.unpack("<HH", bytes(data[6:10]))
            return h, w
        if fmt == "bmp":
            w, h = struct.unpack("<ii", bytes(data[18:26]))
            return abs(h), abs(w)  # negative height means top-down rows
        if fmt == "webp":
            return _webp_size(bytes(data[12:30]))
    except struct.error:
        return None
    return None


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


def jpeg_orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation (1-8) of a JPEG, 1 when absent or unreadable.

    Walks the marker segments up to the first scan, looking for an APP1 "Exif" segment.
    """
    view = memoryview(data)
    pos, end = 2, len(view)
    while pos + 4 <= end:
        if view[pos] != 0xFF:
            return 1
        marker = view[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # SOI, TEM, RSTn: no length
            pos += 2
            continue
        if marker == 0xDA:  # start of scan: no more metadata
            return 1
        length = (view[pos + 2] << 8) | view[pos + 3]
        if length < 2:
            return 1
        if marker == 0xE1 and bytes(view[pos + 4 : pos + 10]) == b"Exif\x00\x00":
            return _tiff_orientation(bytes(view[pos + 10 : pos + 2 + length]))
        pos += 2 + length
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    if tiff[:2] == b"II":
        order = "<"
    elif tiff[:2] == b"MM":
        order = ">"
    else:
        return 1
    try:
        (ifd,) = struct.unpack(order + "I", tiff[4:8])
        (count,) = struct.unpack(order + "H", tiff[ifd : ifd + 2])
        for i in range(count):
            entry = ifd + 2 + 12 * i
            tag, typ = struct.unpack(order + "HH", tiff[entry : entry + 4])
            if tag == 0x0112 and typ == 3:  # Orientation, SHORT
                (value,) = struct.unpack(order + "H", tiff[entry + 8 : entry + 10])
                return value if 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1


def orientation_swaps_axes(orientation: int) -> bool:
    """True for the EXIF orientations (5-8) that transpose the image."""
    return orientation >= 5
