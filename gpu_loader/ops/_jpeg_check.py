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

from gpu_loader.ops._backend import native_module
from gpu_loader.ops._decode import _fail
from gpu_loader.ops._formats import Damage, walk_jpeg_data

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
    """The walk in Python (`walk_jpeg_data`, numpy finds the 0xFF bytes): the reference
    for the C one."""
    return walk_jpeg_data(data)[0]
