"""The one shared checker for the fused kernels (style.md point 5).

``check_fused_kernel(run, case)`` asserts, for any way of running a kernel (the CPU
emulation here, CuPy on a GPU in the needs_cuda tests):
  * every output element is written (two runs over different poison bytes agree);
  * the inputs, including the padding past each row, are not modified;
  * the output has dtype and shape ``[N, 3, out_h, out_w]``;
  * the output is close to the float64 reference (bounds in TOLERANCES);
  * the batch equals the samples run one by one, bit for bit.
The empty batch is a case like any other (N = 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_loader.cuda._launch import ITEM_SIZES, OutputDtype
from tests.kernels.reference import fused_reference

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# |out - ref| <= rel * |ref| + abs, in output units (normalised, or levels for uint8).
# float32: float accumulation only (measured max ~1e-6 rel). float16/bfloat16: one
# rounding to an 11-/8-bit significand (2^-11, 2^-8 relative) on top of float32.
# uint8: round-half-even of a float that may sit either side of a .5: one level.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-3, 1e-4),
    "float16": (2.0**-11 + 1e-4, 1e-4),
    "bfloat16": (2.0**-8 + 1e-4, 1e-4),
    "uint8": (0.0, 1.0),
}


@dataclass(frozen=True)
class Case:
    """One batch for the fused kernel; images live in padded buffers (pitch > 3 * width)."""

    buffers: list[npt.NDArray[np.uint8]]
    widths: list[int]
    boxes: npt.NDArray[np.float64]
    flips: npt.NDArray[np.bool_]
    out_h: int
    out_w: int
    dtype: OutputDtype
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    label: str = field(default="")
    interpolation: str = "bilinear"

    @property
    def images(self) -> list[npt.NDArray[np.uint8]]:
        """HWC views of the pixels (the padding excluded)."""
        return [
            b[:, : 3 * w].reshape(b.shape[0], w, 3)
            for b, w in zip(self.buffers, self.widths, strict=True)
        ]

    def subset(self, index: int) -> Case:
        """The case with only sample ``index``."""
        return Case(
            [self.buffers[index]],
            [self.widths[index]],
            self.boxes[index : index + 1],
            self.flips[index : index + 1],
            self.out_h,
            self.out_w,
            self.dtype,
            self.mean,
            self.std,
            f"{self.label}[{index}]",
            self.interpolation,
        )


# run(case, poison byte) -> the output on the host, [N, 3, out_h, out_w] of the numpy dtype
# (bfloat16 as uint16 bit patterns).
Runner = Callable[[Case, int], npt.NDArray[Any]]

NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "uint8": np.uint8,
}


def as_float64(out: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float64]:
    """Output values as float64 (bfloat16 bit patterns widened to float32 first)."""
    if dtype == "bfloat16":
        return (out.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return out.astype(np.float64)


def bfloat16_bits(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns, written independently in NumPy."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def run_host(launch: Callable[..., None]) -> Runner:
    """A runner for a launcher that takes host pointers (the CPU emulation)."""

    def run(case: Case, poison: int) -> npt.NDArray[Any]:
        n = len(case.buffers)
        shape = (n, 3, case.out_h, case.out_w)
        raw = np.full(int(np.prod(shape)) * ITEM_SIZES[case.dtype], poison, dtype=np.uint8)
        out = raw.view(NUMPY_DTYPES[case.dtype]).reshape(shape)
        refs = [
            (b.ctypes.data, b.shape[0], w, b.strides[0])
            for b, w in zip(case.buffers, case.widths, strict=True)
        ]
        launch(
            refs, case.boxes, case.flips, out.ctypes.data, case.out_h, case.out_w,
            case.mean, case.std, case.dtype, None, case.interpolation,
        )  # fmt: skip
        return out

    return run


def run_cupy(launch: Callable[..., None]) -> Runner:
    """A runner for the CUDA launcher: copies the case to the device and the output back."""

    def run(case: Case, poison: int) -> npt.NDArray[Any]:
        import cupy

        n = len(case.buffers)
        shape = (n, 3, case.out_h, case.out_w)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            device = [cupy.asarray(b) for b in case.buffers]
            raw = cupy.full(int(np.prod(shape)) * ITEM_SIZES[case.dtype], poison, cupy.uint8)
        refs = [
            (d.data.ptr, d.shape[0], w, d.strides[0])
            for d, w in zip(device, case.widths, strict=True)
        ]
        launch(
            refs, case.boxes, case.flips, raw.data.ptr, case.out_h, case.out_w,
            case.mean, case.std, case.dtype, stream, case.interpolation,
        )  # fmt: skip
        stream.synchronize()
        return cupy.asnumpy(raw).view(NUMPY_DTYPES[case.dtype]).reshape(shape)

    return run


def check_fused_kernel(run: Runner, case: Case) -> npt.NDArray[Any]:
    """Assert the checker's properties for ``case``; return the output for further checks."""
    before = [b.copy() for b in case.buffers]
    first = run(case, 0x00)
    second = run(case, 0xFF)
    where = f"case {case.label or '?'} ({case.dtype}, {case.interpolation})"

    assert first.dtype == NUMPY_DTYPES[case.dtype], where
    assert first.shape == (len(case.buffers), 3, case.out_h, case.out_w), where
    assert first.flags.c_contiguous, where
    unwritten = first.view(np.uint8) != second.view(np.uint8)
    assert not unwritten.any(), f"{where}: {int(unwritten.sum())} output bytes never written"
    for b, original in zip(case.buffers, before, strict=True):
        np.testing.assert_array_equal(b, original, err_msg=f"{where}: input modified")

    got = as_float64(first, case.dtype)
    want = fused_reference(
        case.images, case.boxes, case.flips, case.out_h, case.out_w, case.mean, case.std,
        case.dtype, case.interpolation,
    )  # fmt: skip
    rel, abs_ = TOLERANCES[case.dtype]
    if case.dtype == "uint8":
        want = np.clip(want, 0, 255)
    err = np.abs(got - want)
    bound = rel * np.abs(want) + abs_
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert np.all(err <= bound), (
        f"{where}: max error {err.max():.3g} over bound at {worst}: got {got[worst]}, "
        f"reference {want[worst]}"
    )

    if len(case.buffers) > 1:
        for i in range(len(case.buffers)):
            alone = run(case.subset(i), 0x00)
            np.testing.assert_array_equal(
                alone[0].view(np.uint8), first[i].view(np.uint8),
                err_msg=f"{where}: sample {i} alone differs from the batch",
            )  # fmt: skip
    return first


def random_case(
    rng: np.random.Generator,
    dtype: OutputDtype,
    *,
    n: int,
    max_side: int = 40,
    max_out: int = 24,
    label: str = "",
    sizes: Sequence[tuple[int, int]] | None = None,
    interpolation: str = "bilinear",
) -> Case:
    """Random sizes (1-pixel sides included), fractional boxes (enlarging and shrinking), flips."""
    buffers: list[npt.NDArray[np.uint8]] = []
    widths: list[int] = []
    boxes = np.zeros((n, 4), dtype=np.float64)
    for i in range(n):
        if sizes is not None:
            h, w = sizes[i]
        else:
            h, w = (int(v) for v in rng.integers(1, max_side + 1, size=2))
            if rng.random() < 0.25:  # thin images: one pixel wide or high
                h, w = (1, w) if rng.random() < 0.5 else (h, 1)
        pad = int(rng.integers(0, 9))
        buffers.append(rng.integers(0, 256, size=(h, 3 * w + pad), dtype=np.uint8))
        widths.append(w)
        boxes[i] = _random_box(rng, h, w)
    out_h, out_w = (int(v) for v in rng.integers(1, max_out + 1, size=2))
    flips = rng.random(n) < 0.5
    return Case(
        buffers, widths, boxes, flips, out_h, out_w, dtype, label=label,
        interpolation=interpolation,
    )  # fmt: skip


def _random_box(rng: np.random.Generator, h: int, w: int) -> npt.NDArray[np.float64]:
    """A box inside the image: whole image, integer, or fractional (reduced-size decode)."""
    kind = rng.integers(0, 3)
    if kind == 0:
        return np.array([0.0, 0.0, h, w])
    bh = float(rng.uniform(0.2, 1.0) * h)
    bw = float(rng.uniform(0.2, 1.0) * w)
    if kind == 1:
        bh, bw = max(1.0, np.floor(bh)), max(1.0, np.floor(bw))
        return np.array(
            [float(rng.integers(0, h - bh + 1)), float(rng.integers(0, w - bw + 1)), bh, bw]
        )
    return np.array([rng.uniform(0, h - bh), rng.uniform(0, w - bw), bh, bw])
