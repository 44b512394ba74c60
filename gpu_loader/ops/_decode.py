"""CPU decode: bytes -> HWC uint8 RGB, GIL released, with DCT-domain downscaling for JPEG.

JPEG (YCbCr / grayscale) goes through simplejpeg (libjpeg-turbo, GIL released) straight into an
RGBX buffer: Pillow can map that layout without a copy, which the resize step relies on.
PNG/WebP/BMP go through OpenCV (GIL released); GIF/TIFF, CMYK/YCCK JPEGs and anything OpenCV
refuses through Pillow. The pixel count is checked from the header before any pixel buffer is
allocated, so a decompression bomb costs a few bytes of parsing, not gigabytes.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpu_loader.ops._backend import native_module
from gpu_loader.ops._formats import (
    Format,
    bmp_damage,
    bmp_for_opencv,
    header_size,
    jpeg_chroma_ratio,
    jpeg_header,
    jpeg_orientation,
    orientation_swaps_axes,
    png_damage,
    pnm_damage,
    sniff,
    walk_jpeg_data,
    webp_damage,
)
from gpu_loader.ops._transforms import CropParams

if TYPE_CHECKING:
    from PIL.Image import Image as PilImage

# Pillow's own default (Image.MAX_IMAGE_PIXELS): ~89.5 Mpx, a 0.25 GiB RGBA image.
DEFAULT_MAX_PIXELS = 89_478_485
DCT_FACTORS = (8, 4, 2)  # libjpeg-turbo reduced-size IDCT with SIMD paths: 1/8, 1/4, 1/2
_MIN_SIDE_FOR_DCT = 64  # below this, scaled decodes save nothing and edge blocks dominate


def cap_dct_factor(factor: int, buf: bytes | memoryview, chroma: int | None = None) -> int:
    """``factor``, lowered to 2 for a JPEG whose chroma is 4x coarser than its luma along
    an axis (4:1:1): libjpeg-turbo's scaled chroma IDCT there fell to 27 dB at 1/8 and 35
    at 1/4 against a full decode (4:2:0, 4:2:2, 4:4:0 and 4:4:4 stay >= 37 dB at 1/8).
    ``chroma`` is that ratio when the header read gave it (`_jpeg_header`); otherwise
    the header is read again, only when a factor above 2 was chosen."""
    if factor > 2 and (jpeg_chroma_ratio(buf) if chroma is None else chroma) >= 4:
        return 2
    return factor


class DecodeError(ValueError):
    """An image could not be decoded; the message names the sample key and the reason."""


@dataclass(frozen=True, eq=False)
class DecodedImage:
    """A decoded image.

    ``array`` is HWC uint8 RGB (possibly a strided view). ``scale`` is the DCT downscale that
    was applied (1, 1/2, 1/4 or 1/8) and ``origin`` where this pixel grid starts, in original
    (oriented) pixels, (y, x): a box in original pixels maps to `box` (``box.scaled(scale)``
    when ``origin`` is (0, 0), as it is unless an EXIF orientation flipped a reduced decode).
    """

    array: np.ndarray
    scale: float = 1.0
    origin: tuple[float, float] = (0.0, 0.0)
    # The RGBX buffer `array` is a view of, when there is one (zero-copy into Pillow).
    rgbx: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        a = self.array
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"`array` must be HWC uint8 with 3 channels, got {a.dtype} {a.shape}")

    def box(self, params: CropParams) -> CropParams:
        """``params`` (in original, oriented pixels) in this image's pixels."""
        top, left = self.origin
        if self.scale == 1.0 and top == left == 0.0:
            return params
        moved = CropParams(
            top=params.top - top,
            left=params.left - left,
            height=params.height,
            width=params.width,
            flip=params.flip,
        )
        return moved.scaled(self.scale)

    @property
    def height(self) -> int:
        return int(self.array.shape[0])

    @property
    def width(self) -> int:
        return int(self.array.shape[1])


def _fail(key: str, reason: str) -> DecodeError:
    return DecodeError(f"cannot decode image {key!r}: {reason}")


MAX_JPEG_SCANS = 256
"""The most scans a JPEG may have. Each scan of a progressive JPEG is a pass over the whole
image, so a crafted file of thousands of tiny scans (valid ones, a few bytes each) held a
decode thread for seconds to minutes: 26 s for a 714 KB file of 20,000 scans through
simplejpeg (cure53's libjpeg-turbo report, LJT-01-004). Encoders write 6 to 18 (libjpeg's
progressive scripts: 6 for grey, 10 for YCbCr, 18 for CMYK); nvImageCodec refuses more
than 256 by default too. Large images may have fewer: `scan_limit`."""

SCAN_PASSES = 32
"""Scans x pixels may not pass this many passes over an image of ``max_pixels``: 256
scans of a 9456 x 9456 image (89 Mpx, within the default ``max_pixels``) took 5 s to
decode, 17 s through Pillow (CMYK), where a real progressive photo of that size (10
scans) took 0.8 s (QA53). At the default ``max_pixels`` that leaves 32 scans at 89 Mpx,
and the full 256 up to 11 Mpx."""


def scan_limit(height: int, width: int, max_pixels: int) -> int:
    """The most scans a ``height`` x ``width`` JPEG may have: `MAX_JPEG_SCANS`, and no more
    than `SCAN_PASSES` passes over a ``max_pixels`` image (at least 32 within it)."""
    return min(MAX_JPEG_SCANS, SCAN_PASSES * max_pixels // max(1, height * width))


def count_scans(buf: bytes | memoryview) -> int:
    """A JPEG's scans up to its end of image: the native walk (memchr, GIL released,
    1-3 us) when built, else `walk_jpeg_data`. A marker count over the whole buffer
    refused a motion photo (a JPEG with its video appended, random bytes that hold 0xFF
    0xDA about once per 64 KB) on some paths and not others (QA53)."""
    native = native_module()
    return native.jpeg_scans(buf) if native is not None else walk_jpeg_data(buf)[1]


def check_scans(
    key: str, buf: bytes | memoryview, height: int, width: int, max_pixels: int
) -> None:
    """Refuse a JPEG with more scans than `scan_limit` allows before a decoder walks them
    (the paths where libjpeg gets no progress monitor: simplejpeg, Pillow; the native
    decoder is given the limit instead)."""
    limit = scan_limit(height, width, max_pixels)
    if (count := count_scans(buf)) > limit:
        raise too_many_scans(key, limit, count)


def too_many_scans(key: str, limit: int, count: int | None = None) -> DecodeError:
    """The error for a JPEG past `scan_limit`; ``count``: its scans, where counted."""
    found = f"{count:,} scans, more than" if count is not None else "more than"
    return _fail(
        key,
        f"{found} the {limit} a JPEG of its size may have here (at most {MAX_JPEG_SCANS}, "
        f"and at most {SCAN_PASSES} passes over a max_pixels image): a crafted file (each "
        "scan of a progressive JPEG is a pass over the whole image, so many tiny ones hold "
        "a decoder for seconds to minutes)",
    )


def _check_pixels(key: str, height: int, width: int, max_pixels: int) -> None:
    if height < 1 or width < 1:
        raise _fail(key, f"header gives an empty image ({height}x{width}); the file is corrupt")
    if height * width > max_pixels:
        raise _fail(
            key,
            f"{height}x{width} = {height * width:,} pixels exceeds max_pixels={max_pixels:,} "
            "(decompression-bomb guard, checked before decoding); if the image is legitimate, "
            f"pass max_pixels >= {height * width}",
        )


def import_codecs() -> None:
    """Import the CPU decoders before a loader's threads start.

    Imported at first use, OpenCV (PNG, WebP, BMP, GIF, TIFF and netpbm files) loaded in a
    decode thread at an epoch's first non-JPEG file: 55 ms alone on the 2-core dev machine,
    holding the GIL and the import lock, so every decode stalled with it (measured: two runs
    of 8 decodes took 50-100 ms, against 10-25 ms, while the training loop waited for its
    second and third batches). Pillow, the decoder of the pure-Python backend and of files
    OpenCV refuses, is imported too when the native extension is not in use.

    A Ctrl-C meanwhile arrives when the imports have finished (`interrupt_deferred`).
    OpenCV's loader, cut short (30-150 ms at a process's first epoch), left a flag that
    made every later import in the process fail ("recursion is detected during loading
    of cv2"), and swallows a KeyboardInterrupt in one of its bare ``except:`` blocks
    (QA: 7 of 184 second passes after a real Ctrl-C there failed).
    """
    from gpu_loader._threads import interrupt_deferred

    with interrupt_deferred():
        _import_cv2()
        import simplejpeg  # noqa: F401

        if native_module() is None:
            from PIL import Image  # noqa: F401


def _import_cv2() -> None:
    """``import cv2``; if that fails part-way, undo what OpenCV's loader had done, so that
    a later import can still succeed (a signal handler of the program's own may raise
    where `interrupt_deferred` does not hold it back)."""
    if "cv2" in sys.modules:
        return
    path, flagged = list(sys.path), hasattr(sys, "OpenCV_LOADER")
    library_path = os.environ.get("LD_LIBRARY_PATH")
    try:
        import cv2  # noqa: F401
    except BaseException:
        if not flagged and hasattr(sys, "OpenCV_LOADER"):  # its bootstrap did not finish
            del sys.OpenCV_LOADER
            sys.path[:] = path
            if library_path is None:
                os.environ.pop("LD_LIBRARY_PATH", None)
            else:
                os.environ["LD_LIBRARY_PATH"] = library_path
            for name in [m for m in sys.modules if m == "cv2" or m.startswith("cv2.")]:
                del sys.modules[name]
        raise


def _as_bytes(data: bytes | bytearray | memoryview | np.ndarray) -> bytes | memoryview:
    if isinstance(data, bytes):
        return data
    view = memoryview(data)  # type: ignore[arg-type]  # ndarray has the buffer protocol
    return view.cast("B")


def probe_size(
    data: bytes | bytearray | memoryview | np.ndarray, *, key: str = "?", exif: bool = True
) -> tuple[int, int] | None:
    """(height, width) of a JPEG after EXIF orientation (as stored with ``exif=False``),
    from its header; None if not a JPEG.

    Raises DecodeError when the bytes start like a JPEG but the header is unreadable.
    """
    buf = _as_bytes(data)
    if sniff(buf) != "jpeg":
        return None
    height, width, _, orientation, _ = _jpeg_header(buf, key)
    swap = exif and orientation_swaps_axes(orientation)
    return (width, height) if swap else (height, width)


def _jpeg_header(buf: bytes | memoryview, key: str) -> tuple[int, int, str, int, int | None]:
    """(raw height, raw width, colourspace, EXIF orientation, chroma ratio) of a JPEG.

    Common JPEGs are read by the native extension's `jpeg_header` (C, ~0.5 us, with the
    chroma ratio `cap_dct_factor` needs) or, without it, by `jpeg_header` (Python, the
    same rules, ~15 us; chroma None: read again if needed); both hold the GIL. The rest
    by libjpeg (chroma None), which also words the errors.
    """
    native = native_module()
    if native is not None:
        fast = native.jpeg_header(buf)
        if fast is not None:
            return fast  # type: ignore[no-any-return]
    else:
        walked = jpeg_header(buf)
        if walked is not None:
            return (*walked, None)
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(buf)
    except ValueError as exc:
        raise _fail(key, f"corrupt or truncated JPEG header ({exc})") from None
    return int(height), int(width), str(colorspace), jpeg_orientation(buf), None


def choose_dct_factor(height: int, width: int, min_size: tuple[float, float] | None) -> int:
    """Largest k in (8, 4, 2) whose 1/k decode is still >= ``min_size``; 1 when none is."""
    if min_size is None or min(height, width) < _MIN_SIDE_FOR_DCT:
        return 1
    min_h, min_w = min_size
    for k in DCT_FACTORS:
        if height / k >= min_h and width / k >= min_w:
            return k
    return 1


def decode(
    data: bytes | bytearray | memoryview | np.ndarray,
    *,
    key: str = "?",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    min_size: tuple[float, float] | None = None,
    exif: bool = True,
) -> DecodedImage:
    """Decode an image to RGB, EXIF orientation applied (pixels as stored: ``exif=False``).

    For a JPEG, ``min_size=(h, w)`` (in oriented pixels) allows a DCT-domain downscale by the
    largest k in (8, 4, 2) with ``height / k >= h`` and ``width / k >= w``; the factor used
    is ``DecodedImage.scale``. Every failure raises DecodeError naming ``key``.
    """
    return decode_at(
        data, key=key, max_pixels=max_pixels, min_size=min_size, factor=None, exif=exif
    )


def decode_at(
    data: bytes | bytearray | memoryview | np.ndarray,
    *,
    key: str,
    max_pixels: int,
    min_size: tuple[float, float] | None = None,
    factor: int | None = None,
    exif: bool = True,
) -> DecodedImage:
    """`decode` with an explicit DCT ``factor`` (JPEG only; None chooses from ``min_size``)."""
    buf = _as_bytes(data)
    if len(buf) == 0:
        raise _fail(key, "the file is empty (0 bytes)")
    fmt = sniff(buf)
    if fmt is None:
        head = bytes(buf[:8]).hex(" ")
        raise _fail(
            key,
            f"unsupported format or not an image (first bytes: {head}); "
            "supported: JPEG, PNG, WebP, BMP, GIF, TIFF, PPM/PGM/PBM",
        )
    if fmt == "jpeg":
        return _decode_jpeg(buf, key, max_pixels, min_size, factor, exif)
    return _decode_other(buf, fmt, key, max_pixels, exif)


def _decode_jpeg(
    buf: bytes | memoryview,
    key: str,
    max_pixels: int,
    min_size: tuple[float, float] | None,
    factor: int | None,
    exif: bool = True,
) -> DecodedImage:
    import simplejpeg

    height, width, colorspace, orientation, chroma = _jpeg_header(buf, key)
    if not exif:
        orientation = 1  # the pixels as stored
    _check_pixels(key, height, width, max_pixels)
    check_scans(key, buf, height, width, max_pixels)
    if colorspace not in ("YCbCr", "Gray"):
        # CMYK / YCCK: libjpeg-turbo cannot convert these to RGB; Pillow can (Adobe inversion).
        return _decode_pillow(
            buf, key, max_pixels=max_pixels, header_pixels=height * width, orientation=orientation
        )
    if factor is None:
        oriented = (width, height) if orientation_swaps_axes(orientation) else (height, width)
        factor = cap_dct_factor(choose_dct_factor(oriented[0], oriented[1], min_size), buf, chroma)
    want_h, want_w = math.ceil(height / factor), math.ceil(width / factor)
    try:
        rgbx = simplejpeg.decode_jpeg(
            buf, colorspace="RGBX", min_height=want_h, min_width=want_w, strict=True
        )
    except ValueError as exc:
        if "subsampling level" in str(exc):
            # A valid sampling layout TurboJPEG's API has no name for (e.g. chroma finer
            # than luma on one axis): libjpeg itself decodes it, through Pillow, full size.
            _check_entropy_data(buf, key, height, width)
            return _decode_pillow(
                buf,
                key,
                max_pixels=max_pixels,
                header_pixels=height * width,
                orientation=orientation,
            )
        raise _fail(key, f"corrupt or truncated JPEG data ({exc})") from None
    if rgbx.shape[:2] != (want_h, want_w):
        # libjpeg chose another n/8 scale (tiny images): the box mapping would be wrong.
        if factor == 1:
            raise _fail(key, f"decoder returned {rgbx.shape[:2]}, header said {(height, width)}")
        return _decode_jpeg(buf, key, max_pixels, None, 1, exif)
    origin = (0.0, 0.0)
    if orientation != 1:
        rgbx = np.ascontiguousarray(apply_orientation(rgbx, orientation))
        # A reduced decode has ceil(side / factor) pixels: its last one stands for the
        # padded edge block. Where the orientation flips an axis, that block comes first,
        # and the grid starts `pad` pixels before the image (up to 7 at 1/8).
        pads = (want_h * factor - height, want_w * factor - width)
        origin = reduced_origin(orientation, pads)
    return DecodedImage(array=rgbx[:, :, :3], scale=1.0 / factor, origin=origin, rgbx=rgbx)


def _check_entropy_data(buf: bytes | memoryview, key: str, height: int, width: int) -> None:
    """Refuse a JPEG whose coded data libjpeg finds damaged, before Pillow decodes it.

    Pillow's libjpeg ignores its corrupt-data warnings and returns the damaged pixels
    (QA: one byte of a sampling factor changed gave an image 74 levels off, where the
    native path refused the file). With the native extension the file is entropy-decoded
    once more, warnings as errors, at 1/8 scale into one pixel; the pure-Python backend
    has no such decoder (documented in the ops README)."""
    native = native_module()
    if native is None:
        return
    rows, cols = -(-height // 8), -(-width // 8)
    try:
        native.decode_resize_jpeg(
            buf, 8, rows, cols, (0.0, 0.0, rows, cols), np.empty((3, 1, 1), np.uint8),
            1, 1, False, 3, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0),
        )  # fmt: skip
    except native.JpegError as exc:
        raise _fail(key, f"corrupt or truncated JPEG data ({exc})") from None


def reduced_origin(orientation: int, pads: tuple[int, int]) -> tuple[float, float]:
    """(y, x) where an oriented reduced decode's grid starts, in original pixels, given the
    stored image's edge padding ``pads`` = (rows, columns): minus the padding of each stored
    axis that the orientation runs backwards along an oriented axis, else 0."""
    stored = np.arange(4).reshape(2, 2, 1)  # stored (row, col) -> 2 * row + col
    grid = apply_orientation(stored, orientation)[:, :, 0]
    row0, col0 = divmod(int(grid[0, 0]), 2)
    origin = []
    for step in (int(grid[1, 0]), int(grid[0, 1])):  # one pixel down, one pixel right
        row, col = divmod(step, 2)
        backwards = row < row0 if row != row0 else col < col0
        pad = pads[0] if row != row0 else pads[1]
        origin.append(-float(pad) if backwards else 0.0)
    return origin[0], origin[1]


def apply_orientation(image: np.ndarray, orientation: int) -> np.ndarray:
    """Apply an EXIF orientation (1-8) to an HWC array as a view (Pillow's exif_transpose)."""
    if orientation == 2:
        return image[:, ::-1]
    if orientation == 3:
        return image[::-1, ::-1]
    if orientation == 4:
        return image[::-1]
    if orientation == 5:
        return image.transpose(1, 0, 2)
    if orientation == 6:
        return np.rot90(image, k=-1)
    if orientation == 7:
        return np.rot90(image, k=-1)[::-1]
    if orientation == 8:
        return np.rot90(image, k=1)
    return image


def _decode_other(
    buf: bytes | memoryview, fmt: Format, key: str, max_pixels: int, exif: bool = True
) -> DecodedImage:
    import cv2

    size = header_size(buf, fmt)
    if size is not None:  # first: a bomb is a bomb, whether or not it is also cut short
        _check_pixels(key, size[0], size[1], max_pixels)
    if fmt == "bmp" and (reason := bmp_damage(buf)) is not None:
        raise _fail(key, f"truncated or corrupt BMP: {reason}")
    if fmt == "bmp" and not bmp_for_opencv(buf):
        return _decode_pillow(buf, key, max_pixels=max_pixels, exif=exif)
    if fmt == "webp" and (reason := webp_damage(buf)) is not None:
        raise _fail(key, f"truncated WebP: {reason}")
    if fmt == "pnm" and (reason := pnm_damage(buf)) is not None:
        raise _fail(key, f"truncated netpbm image: {reason}")
    if size is None:
        return _decode_pillow(buf, key, max_pixels=max_pixels, exif=exif)
    pixels = size[0] * size[1]
    if fmt in ("tiff", "gif", "pnm"):
        # Pillow: OpenCV premultiplies RGBA TIFFs by their alpha and warns on stderr about
        # tags it does not know; its GIF codec (OpenCV 4.11+, absent from older builds)
        # prints an error line for a cut GIF, which Pillow reports as truncated; it reads
        # netpbm samples without scaling them by their maxval (a maxval-15 PGM came out
        # 0-15, not 0-255) and prints an error line for a cut file.
        return _decode_pillow(buf, key, max_pixels=max_pixels, header_pixels=pixels, exif=exif)
    if fmt == "png":
        damage, complete = png_damage(buf)
        if damage is not None:
            raise _fail(key, f"truncated or corrupt PNG: {damage}")
        if complete is not None:  # complete image data without its IEND trailer: close it
            buf = bytes(buf[:complete]) + _IEND  # (OpenCV refuses it open, with a stderr line)
    # 3 channels: grey replicated, alpha dropped, EXIF applied; in RGB order where OpenCV
    # can (4.10+): a BGR decode then a cvtColor into a fresh RGBA array cost 2-3 ms more
    # per 500x375 PNG than the decode itself (QA: malloc maps and unmaps each 750 KB
    # output, and every page faults again), where the resize takes 3 channels as well.
    rgb_order = getattr(cv2, "IMREAD_COLOR_RGB", None)
    flags = cv2.IMREAD_COLOR if rgb_order is None else rgb_order
    if not exif:
        flags |= cv2.IMREAD_IGNORE_ORIENTATION
    image = cv2.imdecode(np.frombuffer(buf, np.uint8), flags)
    if image is None or image.ndim != 3 or image.shape[2] != 3:
        # OpenCV builds may lack a codec (e.g. GIF)
        return _decode_pillow(buf, key, max_pixels=max_pixels, header_pixels=pixels, exif=exif)
    if rgb_order is not None:
        return DecodedImage(array=image, scale=1.0)
    rgbx = cv2.cvtColor(image, cv2.COLOR_BGR2RGBA)
    return DecodedImage(array=rgbx[:, :, :3], scale=1.0, rgbx=rgbx)


_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # PNG's end chunk: no data, fixed CRC


def _decode_pillow(
    buf: bytes | memoryview,
    key: str,
    *,
    max_pixels: int,
    header_pixels: int | None = None,
    exif: bool = True,
    orientation: int | None = None,
) -> DecodedImage:
    """Decode with Pillow, refusing more than ``max_pixels`` by the size Pillow parsed
    (before any pixel is decoded). ``header_pixels``: the size our own header parser read
    (already within ``max_pixels``); over Pillow's own limit, that limit is lifted for
    this decode (`_pillow_limit_lifted`), and the check on Pillow's size still stands.

    ``orientation``: the one our header parser read (a JPEG, whose crop was drawn on the
    size `probe_size` gave from it), applied in place of Pillow's `exif_transpose`, which
    also reads an XMP ``tiff:Orientation`` (QA: a CMYK JPEG with one came out turned, and
    its crop no longer fit). None: Pillow's ``exif_transpose`` when ``exif``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with _pillow_limit_lifted(header_pixels), Image.open(io.BytesIO(buf)) as im:
            _check_pixels(key, im.height, im.width, max_pixels)
            im.load()
            if orientation is not None or not exif:
                rgb = im.convert("RGBX")
            else:
                rgb = _exif_transposed(im).convert("RGBX")
    except DecodeError:
        raise
    except Image.DecompressionBombError as exc:
        raise _fail(key, f"too many pixels ({exc})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        # Pillow names the file object it was given: "<_io.BytesIO object at 0x7f...>".
        said = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(exc))
        raise _fail(key, f"corrupt, truncated or unsupported image ({said})") from None
    except MemoryError:
        raise  # the machine, not the file
    except Exception as exc:
        # A plugin tripped over a hostile field: a TIFF tag of the wrong type raised a
        # bare TypeError (QA: "'str' object cannot be interpreted as an integer").
        raise _fail(
            key, f"corrupt or unsupported image ({type(exc).__name__} in Pillow: {exc})"
        ) from None
    rgbx = np.asarray(rgb)
    if orientation is not None and orientation != 1:
        rgbx = np.ascontiguousarray(apply_orientation(rgbx, orientation))
    return DecodedImage(array=rgbx[:, :, :3], scale=1.0, rgbx=rgbx)


def _exif_transposed(im: PilImage) -> PilImage:
    """Pillow's ``exif_transpose`` of a loaded image, or the image as stored when its EXIF
    block cannot be read. A damaged metadata block turns nothing, as the JPEG header walk
    (orientation 1 when unreadable) and OpenCV do: it must not lose the pixels (QA: a PNG
    whose eXIf chunk lacked the TIFF magic failed as a corrupt image on this path only)."""
    from PIL import ImageOps

    try:
        return ImageOps.exif_transpose(im)
    except MemoryError:
        raise
    except Exception:  # SyntaxError "not a TIFF file", struct.error on a cut block, ...
        return im


_lift_lock = threading.Lock()
_lifts = 0
_pillow_limit: int | None = None  # Pillow's own limit while lifted


def _reset_lift_in_child() -> None:
    """A child forked during a lifted decode must not keep Pillow's limit lifted: the
    thread that would restore it did not come along (nor, maybe, the lock's owner)."""
    global _lift_lock, _lifts
    image = sys.modules.get("PIL.Image")
    if _lifts and image is not None:
        setattr(image, "MAX_IMAGE_PIXELS", _pillow_limit)  # noqa: B010
    _lifts = 0
    _lift_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lift_in_child)


@contextlib.contextmanager
def _pillow_limit_lifted(pixels: int | None) -> Iterator[None]:
    """Lift Pillow's ``Image.MAX_IMAGE_PIXELS`` while an image of ``pixels`` (already
    within ``max_pixels``) decodes, if it is over it: otherwise Pillow refuses (or warns
    about) what ``max_pixels`` allows, and a raised ``max_pixels`` could not move it.
    A process-wide setting: lifted while any such decode runs, then restored."""
    global _lifts, _pillow_limit
    from PIL import Image

    with _lift_lock:
        limit = _pillow_limit if _lifts else Image.MAX_IMAGE_PIXELS
        lift = pixels is not None and limit is not None and pixels > limit
        if lift:
            if _lifts == 0:
                _pillow_limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            _lifts += 1
    try:
        yield
    finally:
        if lift:
            with _lift_lock:
                _lifts -= 1
                if _lifts == 0:
                    Image.MAX_IMAGE_PIXELS = _pillow_limit
