"""Valid progressive JPEGs with as many scans as asked: the scan-limit cases.

Standard library only: the AddressSanitizer driver imports it too.
"""

from __future__ import annotations

import struct

MOST = 1 + 63 * 14  # a DC scan, then each AC coefficient alone, refined bit by bit


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def many_scans(scans: int, size: int = 16) -> bytes:
    """A ``size`` x ``size`` mid-grey progressive JPEG of ``scans`` scans, all valid (libjpeg
    raises no warning): one DC scan, then scans of one AC coefficient each, first at bit 13
    and then refined down to bit 0 (Ah = Al + 1), which allows up to `MOST`. Every block's
    coefficients are zero, so each scan's data is one 1-bit code per block (an end of band)
    from a one-code Huffman table."""
    if not 1 <= scans <= MOST:
        raise ValueError(f"1 to {MOST} scans, got {scans}")
    blocks = ((size + 7) // 8) ** 2
    one_code = bytes([1] + [0] * 15) + bytes([0])  # one code of length 1, for symbol 0
    head = (
        b"\xff\xd8"
        + _segment(0xDB, bytes([0]) + bytes([1] * 64))
        + _segment(0xC2, bytes([8]) + struct.pack(">HH", size, size) + bytes([1, 1, 0x11, 0]))
        + _segment(0xC4, bytes([0x00]) + one_code + bytes([0x10]) + one_code)
    )
    bits = "0" * blocks
    bits += "1" * (-len(bits) % 8)  # padded with ones, as encoders do
    body = bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8))
    bands = [(0, 0, 0, 0)] + [
        (k, k, 0 if al == 13 else al + 1, al) for k in range(1, 64) for al in range(13, -1, -1)
    ]
    out = [head]
    for ss, se, ah, al in bands[:scans]:
        out.append(_segment(0xDA, bytes([1, 1, 0x00, ss, se, (ah << 4) | al])) + body)
    out.append(b"\xff\xd9")
    return b"".join(out)
