"""Launch planning for the fused kernel, shared by the CUDA and the CPU-emulation launchers.

Everything here is plain NumPy and pure logic: validate the per-sample values, pack
them into the 48-byte records ``kernels/fused_resize.cu`` reads (``SAMPLE_DTYPE``),
turn mean/std into the kernel's scale/shift, and compute grid and block. Both
launchers call :func:`plan_fused` and differ only in how they hand the plan to a
kernel, so this logic is tested on machines without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from gpu_loader.ops._transforms import INTERPOLATIONS

OutputDtype = Literal["float32", "float16", "bfloat16", "uint8"]
OUTPUT_DTYPES: tuple[OutputDtype, ...] = get_args(OutputDtype)

# The kernel's extern "C" entry point per (interpolation, output dtype).
KERNEL_NAMES: dict[tuple[str, OutputDtype], str] = {
    ("bilinear", "float32"): "fused_resize_f32",
    ("bilinear", "float16"): "fused_resize_f16",
    ("bilinear", "bfloat16"): "fused_resize_bf16",
    ("bilinear", "uint8"): "fused_resize_u8",
    ("bicubic", "float32"): "fused_resize_bicubic_f32",
    ("bicubic", "float16"): "fused_resize_bicubic_f16",
    ("bicubic", "bfloat16"): "fused_resize_bicubic_bf16",
    ("bicubic", "uint8"): "fused_resize_bicubic_u8",
}

# Bytes per output element, to size output buffers.
ITEM_SIZES: dict[OutputDtype, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}

# 32 threads along a row keep the output stores of a warp contiguous (coalesced);
# 8 rows give 256 threads per block (at 46-48 registers a thread, 5 blocks fit an SM).
BLOCK: tuple[int, int, int] = (32, 8, 1)

# CUDA's limit on gridDim.y and gridDim.z; the batch is laid along z.
MAX_GRID_YZ = 65535

# Mirrors `struct FusedSample` in kernels/fused_resize.cu (a test checks the offsets
# against the compiled struct).
SAMPLE_DTYPE = np.dtype(
    {
        "names": [
            "src",
            "pitch",
            "height",
            "width",
            "box_top",
            "box_left",
            "box_height",
            "box_width",
            "flip",
            "reserved",
        ],
        "formats": ["<u8", "<i8", "<i4", "<i4", "<f4", "<f4", "<f4", "<f4", "<i4", "<i4"],
        "offsets": [0, 8, 16, 20, 24, 28, 32, 36, 40, 44],
        "itemsize": 48,
    }
)

# Float round-off past the image edge that is accepted and clamped away, in pixels: the
# same tolerance as the CPU path (gpu_loader.ops), so both accept the same boxes.
BOX_TOLERANCE = 1e-3

# A source image as the decoder hands it over: (pointer, height, width, row pitch in bytes).
ImageRef = tuple[int, int, int, int]


@dataclass(frozen=True)
class FusedPlan:
    """Everything one launch of the fused kernel needs, ready to pass on."""

    kernel_name: str
    """The extern "C" kernel to launch, from KERNEL_NAMES."""
    grid: tuple[int, int, int]
    """Blocks along (output columns, output rows, samples)."""
    block: tuple[int, int, int]
    """Threads per block (BLOCK)."""
    samples: npt.NDArray[np.void]
    """One SAMPLE_DTYPE record per image, C-contiguous."""
    out_h: int
    """Output rows."""
    out_w: int
    """Output columns."""
    scale: tuple[float, float, float]
    """Per channel 1 / (255 std): multiplies the 0..255 resized value."""
    shift: tuple[float, float, float]
    """Per channel -mean / std: added after the scale."""

    @property
    def batch_size(self) -> int:
        """Number of images in the launch."""
        return int(self.samples.shape[0])


def launch_shape(
    n: int, out_h: int, out_w: int
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Grid and block for ``n`` images of ``out_h`` x ``out_w`` output pixels."""
    if n < 0:
        raise ValueError(f"the batch size must be >= 0, got {n}")
    if n > MAX_GRID_YZ:
        raise ValueError(
            f"a fused launch takes at most {MAX_GRID_YZ} images (CUDA's gridDim.z limit), "
            f"got {n}; split the batch"
        )
    for name, value in (("out_h", out_h), ("out_w", out_w)):
        if value < 1:
            raise ValueError(f"`{name}` must be >= 1, got {value}")
    bx, by, _ = BLOCK
    grid = (-(-out_w // bx), -(-out_h // by), n)
    if grid[1] > MAX_GRID_YZ:
        raise ValueError(f"`out_h` must be <= {MAX_GRID_YZ * by}, got {out_h}")
    return grid, BLOCK


def normalization(
    mean: Sequence[float], std: Sequence[float], dtype: OutputDtype
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """The kernel's per-channel (scale, shift) for ``(x / 255 - mean) / std``.

    uint8 output skips normalisation, so mean and std are ignored for it.
    """
    if dtype == "uint8":
        return (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(std, dtype=np.float64)
    if m.shape != (3,) or s.shape != (3,):
        raise ValueError(
            f"`mean` and `std` must have 3 values (RGB), got {list(m.ravel())} and {list(s.ravel())}"
        )
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(s)) and np.all(s > 0)):
        raise ValueError(
            f"`std` must be finite and > 0 and `mean` finite, got mean={list(m)}, std={list(s)}"
        )
    scale = 1.0 / (255.0 * s)
    shift = -m / s
    return (
        (float(scale[0]), float(scale[1]), float(scale[2])),
        (float(shift[0]), float(shift[1]), float(shift[2])),
    )


def pack_samples(
    images: Sequence[ImageRef],
    boxes: npt.ArrayLike,
    flips: npt.ArrayLike,
    out_size: tuple[int, int] | None = None,
) -> npt.NDArray[np.void]:
    """Validate the per-sample values and pack them into SAMPLE_DTYPE records.

    ``boxes`` is ``[N, 4]`` (top, left, height, width) in source pixels, fractional
    allowed, inside the image; ``flips`` is ``[N]`` bools. With ``out_size`` (output
    rows, columns) each record's origin moves to just before the pixels its box's
    filter can reach (`rebased`), so that the kernel's float32 coordinates stay small.
    """
    n = len(images)
    box = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) if n else np.zeros((0, 4))
    flip = np.asarray(flips, dtype=bool).reshape(-1) if n else np.zeros((0,), dtype=bool)
    if box.shape != (n, 4):
        raise ValueError(f"`boxes` must be [N, 4] with N={n} images, got shape {box.shape}")
    if flip.shape != (n,):
        raise ValueError(f"`flips` must have one value per image ({n}), got shape {flip.shape}")
    records = np.zeros(n, dtype=SAMPLE_DTYPE)
    for i, image in enumerate(images):
        _check_image(i, image)
        clamped = _check_box(i, box[i], image[1], image[2])
        ptr, height, width, pitch = image
        if out_size is not None:
            ptr, height, width, clamped = rebased(image, clamped, out_size)
        records[i] = (ptr, pitch, height, width, *clamped, int(flip[i]), 0)
    return records


def rebased(
    image: ImageRef, box: tuple[float, float, float, float], out_size: tuple[int, int]
) -> tuple[int, int, int, tuple[float, float, float, float]]:
    """``(pointer, height, width, box)`` of the same crop with the image's origin moved
    to whole pixels before the box, in float64, past every pixel its filter reads.

    The kernel computes in float32, whose step at 20,000 is 0.002: a small box far from
    the origin was off by up to 0.6 levels (QA59). The taps are the same either way:
    each window starts at ``int(c - support + 0.5)``, and with the origin moved by
    ``o <= start - support`` that argument stays positive, so every index moves by
    exactly ``o`` (the bicubic support, the wider, is assumed for both filters; one
    pixel more is kept against the float32 rounding of ``c``).
    """
    ptr, height, width, pitch = image
    top, left, bh, bw = box
    oy = _origin(top, bh, out_size[0])
    ox = _origin(left, bw, out_size[1])
    return (
        ptr + oy * pitch + 3 * ox,
        height - oy,
        width - ox,
        (top - oy, left - ox, bh, bw),
    )


def _origin(start: float, size: float, out: int) -> int:
    """Whole pixels the origin can move along an axis without cutting a tap (one fewer
    than it could: a margin for the kernel's float32 rounding)."""
    support = 2.0 * max(size / out, 1.0)
    return max(0, math.floor(start - support) - 1)


def plan_fused(
    images: Sequence[ImageRef],
    boxes: npt.ArrayLike,
    flips: npt.ArrayLike,
    out_h: int,
    out_w: int,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: OutputDtype,
    interpolation: str = "bilinear",
) -> FusedPlan:
    """Validate and pack one batch: the single source of truth for both launchers.

    ``interpolation`` ("bilinear" or "bicubic") picks the kernel's entry point.
    """
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"`dtype` must be one of {list(OUTPUT_DTYPES)}, got {dtype!r}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"`interpolation` must be one of {list(INTERPOLATIONS)}, got {interpolation!r}"
        )
    grid, block = launch_shape(len(images), out_h, out_w)
    scale, shift = normalization(mean, std, dtype)
    return FusedPlan(
        kernel_name=KERNEL_NAMES[(interpolation, dtype)],
        grid=grid,
        block=block,
        samples=pack_samples(images, boxes, flips, (out_h, out_w)),
        out_h=out_h,
        out_w=out_w,
        scale=scale,
        shift=shift,
    )


def _check_image(i: int, image: ImageRef) -> None:
    if len(image) != 4:
        raise ValueError(f"image {i} must be (pointer, height, width, pitch), got {image!r}")
    ptr, height, width, pitch = image
    if ptr <= 0:
        raise ValueError(f"image {i} has a null or negative pointer {ptr}")
    if height < 1 or width < 1:
        raise ValueError(f"image {i} must be at least 1x1 pixels, got {height}x{width}")
    if pitch < 3 * width:
        raise ValueError(
            f"image {i}: the row pitch ({pitch} bytes) is shorter than a row of {width} RGB "
            f"pixels ({3 * width} bytes); pass the pitch in bytes of an HWC uint8 image"
        )
    if height >= 2**31 or width >= 2**31 // 3:
        raise ValueError(f"image {i} is too large for 32-bit indexing: {height}x{width}")


def _check_box(
    i: int, box: npt.NDArray[np.float64], height: int, width: int
) -> tuple[float, float, float, float]:
    """The box, validated, with round-off past the bottom/right edge clamped away."""
    top, left, bh, bw = (float(v) for v in box)
    if not np.all(np.isfinite(box)) or bh <= 0 or bw <= 0:
        raise ValueError(
            f"image {i}: the crop box (top, left, height, width)={tuple(box)} needs a finite, "
            f"positive height and width"
        )
    if (
        top < 0
        or left < 0
        or top + bh > height + BOX_TOLERANCE
        or left + bw > width + BOX_TOLERANCE
    ):
        raise ValueError(
            f"image {i}: the crop box (top, left, height, width)={tuple(box)} leaves the "
            f"{height}x{width} image; clip the box to the decoded image (scale it with a "
            f"reduced-size decode)"
        )
    return top, left, min(bh, height - top), min(bw, width - left)
