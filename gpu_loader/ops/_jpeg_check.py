"""Is a JPEG's compressed data whole? A check of its marker structure, for the GPU path.

libjpeg (the CPU path) warns of corrupt data, and the loader refuses the file; nvImageCodec
decodes such a file without a per-image error its Python API reports, and the damaged
pixels went into a batch (QA: an overwritten run of bytes, or flipped bits). This walks the
markers after the first scan header: inside compressed data a 0xFF byte is followed by 0x00
(stuffing), 0xFF (fill) or a restart marker in sequence; the data ends at a marker that
may sit between scans (tables, comments, the next scan) or at the end of image. Damage that
breaks that structure is caught; damage that still reads as valid data is not (libjpeg
catches some of that too, from its Huffman codes).

The native extension walks with memchr, the GIL released (1-3 us for 30-200 KB); the Python
walk (numpy finds the 0xFF bytes) is the reference a test holds it to (~20-70 us).
"""

from __future__ import annotations

import numpy as np

from gpu_loader.ops._backend import native_module
from gpu_loader.ops._decode import _fail
from gpu_loader.ops._formats import _jpeg_segments

_TEM, _RST0, _EOI, _SOS, _DRI = 0x01, 0xD0, 0xD9, 0xDA, 0xDD
# Markers with a length field that may come between scans: DHT, DAC, DQT, DNL, DRI, APPn,
# COM, and SOS itself.
_BETWEEN_SCANS = frozenset({0xC4, 0xCC, 0xDB, 0xDC, _DRI, *range(0xE0, 0xF0), 0xFE, _SOS})


Damage = tuple[int, int, int, int]
"""``(kind, at, a, b)``: see `_WORDS`; ``at`` is the byte offset."""

_WORDS = {
    1: "restart marker {a} at byte {at} with no restart interval",
    2: "restart marker {a} at byte {at} where {b} was due",
    3: "marker 0x{a:02X} inside the compressed data at byte {at}",
    4: "a segment cut short at byte {at}",
    5: "a segment at byte {at} runs past the end of the file",
    6: "no end-of-image marker: the file is cut short at byte {at}",
}


def jpeg_data_damage(data: bytes | memoryview) -> str | None:
    """What breaks the marker structure of a JPEG's compressed data, None if nothing does
    (or if its header has no scan: the decoder words that). The native extension's walk
    when built (1-3 us a file), else `damage_walk`."""
    native = native_module()
    found = native.jpeg_data_damage(data) if native is not None else damage_walk(data)
    if found is None:
        return None
    kind, at, a, b = found
    return _WORDS[kind].format(at=at, a=a, b=b)


def check_jpeg_data(data: bytes | memoryview, *, key: str) -> None:
    """Raise `DecodeError` (worded as the decoders' errors) when `jpeg_data_damage` finds
    the JPEG ``data`` of sample ``key`` damaged."""
    if (damage := jpeg_data_damage(data)) is not None:
        raise _fail(key, f"corrupt JPEG data: {damage}")


def damage_walk(data: bytes | memoryview) -> Damage | None:
    """The walk in Python (numpy finds the 0xFF bytes): the reference for the C one."""
    view = memoryview(data)
    restart, scan = 0, -1
    for marker, at, size in _jpeg_segments(view):
        if marker == _DRI and size >= 2:
            restart = (view[at] << 8) | view[at + 1]
        elif marker == _SOS:
            scan = at + size
    if scan < 0:
        return None
    raw = np.frombuffer(view, np.uint8)
    ff = np.flatnonzero(raw[scan:-1] == 0xFF) + scan
    following = raw[ff + 1]
    real = (following != 0x00) & (following != 0xFF)  # stuffing and fill bytes are data
    places, codes = ff[real].tolist(), following[real].tolist()
    due, i, end = 0, 0, len(raw)
    while i < len(places):
        at, code = places[i], codes[i]
        i += 1
        if code == _TEM:
            continue  # a marker with no length, allowed anywhere markers are (QA)
        if _RST0 <= code <= _RST0 + 7:
            if restart == 0:
                return 1, at, code - _RST0, 0
            if code - _RST0 != due:
                return 2, at, code - _RST0, due
            due = (due + 1) % 8
            continue
        if code == _EOI:
            return None  # the end of the image: what follows is not its data
        if code not in _BETWEEN_SCANS:
            return 3, at, code, 0
        if at + 4 > end:
            return 4, at, 0, 0
        after = at + 2 + ((int(raw[at + 2]) << 8) | int(raw[at + 3]))
        if after > end:
            return 5, at, 0, 0
        if code == _DRI:
            restart = (int(raw[at + 4]) << 8) | int(raw[at + 5]) if after >= at + 6 else 0
        elif code == _SOS:
            due = 0  # each scan counts its restarts from 0
        while i < len(places) and places[i] < after:  # 0xFF bytes of the segment itself
            i += 1
    return 6, end, 0, 0
