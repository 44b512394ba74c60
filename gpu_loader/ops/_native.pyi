"""Type stub of the C extension gpu_loader.ops._native (source: _native.c beside this file)."""

from collections.abc import Sequence
from typing import Any

from typing_extensions import Buffer

LIBJPEG_TURBO_VERSION: int
MAX_JPEG_SCANS: int

class JpegError(ValueError): ...

def resize_into(
    src: Buffer,
    height: int,
    width: int,
    channels: int,
    box: tuple[float, float, float, float],
    out: Buffer,
    out_h: int,
    out_w: int,
    flip: bool,
    dtype: int,
    scale: tuple[float, float, float],
    shift: tuple[float, float, float],
    filter: int = 0,
    /,
) -> None: ...
def decode_resize_jpeg(
    data: Buffer,
    denom: int,
    height: int,
    width: int,
    box: tuple[float, float, float, float],
    out: Buffer,
    out_h: int,
    out_w: int,
    flip: bool,
    dtype: int,
    scale: tuple[float, float, float],
    shift: tuple[float, float, float],
    filter: int = 0,
    max_scans: int = 256,
    /,
) -> None: ...
def decode_resize_jpegs(
    calls: list[tuple[Any, ...]] | tuple[tuple[Any, ...], ...], /
) -> list[str | int | None]: ...
def train_params(
    key_low: int,
    key_high: int,
    height: int,
    width: int,
    s0: float,
    s1: float,
    log_r0: float,
    log_r1: float,
    flip_prob: float,
    /,
) -> tuple[int, int, int, int, bool]: ...
def philox_words(key_low: int, key_high: int, n: int, /) -> list[int]: ...
def read_regular(path: str | bytes, limit: int, /) -> bytes | tuple[int, int, int]: ...
def read_ranges(
    paths: Sequence[str | bytes], offsets: Sequence[int], sizes: Sequence[int], /
) -> tuple[list[tuple[bytes | int | None, int, int, int, int, int]], list[float]]: ...
def read_regulars(
    paths: Sequence[str | bytes], limit: int, /
) -> tuple[list[bytes | tuple[int, int, int] | int | Exception], list[float]]: ...
def convert(src: Buffer, dst: Buffer, dtype: int, /) -> None: ...
def jpeg_header(data: Buffer, /) -> tuple[int, int, str, int, int] | None: ...
def jpeg_data_damage(data: Buffer, /) -> tuple[int, int, int, int] | None: ...
def jpeg_scans(data: Buffer, /) -> int: ...
