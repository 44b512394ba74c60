"""`ImageLoader(augment=...)`: a per-sample augmentation between the resize and the
normalisation, on the CPU path.

A sample is decoded, cropped, resized and flipped into 8-bit pixels (the transform with
``dtype="uint8"``, which rounds to nearest and skips the normalisation), handed to the
user's function as a ``[3, H, W]`` uint8 tensor with a ``torch.Generator`` seeded for
that sample, and what the function returns is normalised and cast into the sample's row
of its batch. torchvision's uint8 tensor transforms (``ColorJitter``, ``RandAugment``,
``RandomErasing``, ...) take that tensor as it is.

The generator's seed is keyed by (seed, epoch, the sample's stream), like the crop's, but
drawn from a separate stream, so adding a hook never changes the crops: draws from it are
the same whatever thread runs the sample and after a resume. Draws from torch's global
generator (which torchvision's transforms use) work too, but then depend on thread timing.

The function's torch ops run on one intra-op thread per decode thread, as in DataLoader's
worker processes (`single_torch_thread`): torch's OpenMP teams, one per decode thread
and each as wide as the machine, would oversubscribe the cores the decode threads share.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_loader._threads import loader_thread
from gpu_loader.ops import load_into
from gpu_loader.ops._transform import cast_into, normalize_uint8_into
from gpu_loader.pipeline._errors import add_note

if TYPE_CHECKING:
    import torch

    from gpu_loader.ops import EvalTransform, OutputDtype, TrainTransform
    from gpu_loader.sources._rng import SampleStream

Augment = Callable[["torch.Tensor", "torch.Generator"], "torch.Tensor"]
"""``augment(image, generator) -> image``: ``image`` is ``[3, H, W]`` uint8 on the CPU."""

# Mixed into each sample's key so the hook's stream is not the crop's (any fixed word).
_AUGMENT_STREAM = 0x61756790


AUGMENT_NOTE = "raised by the loader's `augment` function"


def raised_by_augment(error: BaseException) -> bool:
    """The function raised ``error`` (or `load_augmented` refused what it returned)."""
    return AUGMENT_NOTE in getattr(error, "__notes__", ())


_WRAP_HINT = "wrap a one-argument transform t: augment=lambda image, generator: t(image)"


def check_augment(augment: object) -> Augment | None:
    """``augment`` as given, or a TypeError a user can act on."""
    if augment is None:
        return None
    if not callable(augment):
        raise TypeError(
            "`augment` must be a function (image, generator) -> image taking and returning "
            f"a [3, H, W] uint8 torch tensor, or None; got {type(augment).__name__}"
        )
    try:
        signature = inspect.signature(augment)
    except (TypeError, ValueError):  # some builtins have none: found at the first sample
        return augment  # type: ignore[return-value]
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise TypeError(
            f"`augment` is called as augment(image, generator), which {augment!r} cannot "
            f"take ({exc}); {_WRAP_HINT}"
        ) from None
    return augment  # type: ignore[return-value]


def augment_seed(stream: SampleStream) -> int:
    """The 64-bit seed of a sample's augmentation generator: a function of the sample's
    crop key alone (two rounds of SplitMix64's finaliser over its words and a constant
    of this module's), so it is not the crop's stream."""
    low, high = stream.philox_key
    return _mix64(low ^ _mix64(high ^ _AUGMENT_STREAM))


_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's output function (Steele, Lea, Flood 2014): a bijection of 64-bit words
    whose output bits each depend on every input bit; 1 us in Python (a SeedSequence: 40)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


_this_thread = threading.local()

# The OpenMP runtimes torch's wheels ship (GNU's on Linux, LLVM's or Intel's elsewhere);
# a process holds one of each soname at most, so the loaded one is torch's.
_OPENMP_SONAMES = ("libgomp.so.1", "libomp.so", "libiomp5.so", "libomp.dylib", "libiomp5.dylib")


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """The loaded OpenMP runtime's ``omp_set_num_threads``, or None (no OpenMP loaded)."""
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)
    for name in _OPENMP_SONAMES:
        try:
            library = ctypes.CDLL(name, mode=mode)  # already loaded, or OSError
            setter = library.omp_set_num_threads
        except (OSError, AttributeError):
            continue
        setter.argtypes, setter.restype = [ctypes.c_int], None
        return setter  # type: ignore[no-any-return]
    return None


def single_torch_thread() -> None:
    """Run this thread's torch ops on one intra-op thread, if it is one of the loader's;
    the rest of the process keeps its `torch.get_num_threads()`. Once per thread.

    ``torch.set_num_threads`` is process-wide (every thread's first op copies it), and
    OpenMP's team size is a per-thread setting: so torch's own set-up for this thread
    runs first (``get_num_threads`` does it), then the thread's OpenMP setting is made 1.
    On 2 cores, two threads running a jitter on 224 px float images took 1.6-3.8x the
    time with torch's default of one OpenMP thread per core.
    """
    if getattr(_this_thread, "single", False) or not loader_thread():
        return  # not the training loop's thread (a padding batch's repeats decode there)
    _this_thread.single = True
    import torch

    if torch.get_num_threads() > 1 and (setter := _omp_set_num_threads()) is not None:
        setter(1)


def load_augmented(
    augment: Augment,
    data: bytes,
    transform: TrainTransform | EvalTransform,
    stream: SampleStream,
    out: np.ndarray,
    *,
    dtype: OutputDtype,
    key: str,
    max_pixels: int,
) -> None:
    """`load_into` with ``augment`` run on the resized 8-bit pixels before the
    normalisation: ``out`` receives what the function returns, normalised and cast."""
    import torch

    pixels = np.empty(out.shape, np.uint8)  # the function's own: it may keep or change it
    load_into(data, transform, stream, pixels, dtype="uint8", key=key, max_pixels=max_pixels)
    single_torch_thread()
    generator = torch.Generator()
    generator.manual_seed(augment_seed(stream))
    try:  # what the function raises, and what it returns that cannot be used
        image = _checked(augment(torch.from_numpy(pixels), generator), out.shape)
    except Exception as exc:
        add_note(exc, AUGMENT_NOTE)
        raise
    normalize_into(image, out, mean=transform.mean, std=transform.std, dtype=dtype)


def _checked(result: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``augment``'s result as a C-contiguous numpy array, or an error saying what is wrong."""
    import torch

    if not isinstance(result, torch.Tensor):
        hint = ""
        if result is None:
            hint = " (return the tensor it changed in place)"
        elif isinstance(result, tuple):  # a torchvision transform hands back every input
            hint = f" (a torchvision transform given as it is gets both arguments: {_WRAP_HINT})"
        raise TypeError(
            f"`augment` must return a [3, H, W] torch tensor, got {type(result).__name__}{hint}"
        )
    if tuple(result.shape) != tuple(shape):
        raise ValueError(
            f"`augment` must return the image's shape {list(shape)} (the batch's rows are "
            f"that size), got {list(result.shape)}"
        )
    if result.device.type != "cpu":
        raise ValueError(f"`augment` must return a CPU tensor, got one on {result.device}")
    if result.dtype != torch.uint8 and not result.is_floating_point():
        raise TypeError(
            "`augment` must return uint8 (0-255) or floating point (0-1) pixels, got "
            f"{result.dtype}"
        )
    if result.is_floating_point() and result.dtype != torch.float32:
        result = result.float()
    pixels = np.ascontiguousarray(result.detach().numpy())
    if pixels.dtype != np.uint8:
        lo, hi = float(pixels.min()), float(pixels.max())
        if not (lo >= -1.0 and hi <= 2.0):  # NaN fails too
            raise ValueError(
                f"`augment` returned float pixels from {lo:g} to {hi:g}: float images are on "
                "the 0-1 scale (as torchvision's), so values past [-1, 2] (or NaN) mean "
                "another scale; divide 0-255 values by 255, or return uint8"
            )
    return pixels


def normalize_into(
    image: np.ndarray,
    out: np.ndarray,
    *,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    dtype: OutputDtype,
) -> None:
    """``[3, H, W]`` pixels, uint8 (0-255) or float32 (0-1, as torchvision's float
    images), normalised ``(x - mean) / std`` and cast into ``out`` (uint8: the 0-255
    pixels, rounded to nearest and clamped)."""
    if image.dtype == np.uint8:
        normalize_uint8_into(image, out, mean=mean, std=std, dtype=dtype)
        return
    if dtype == "uint8":
        np.copyto(out, np.clip(np.rint(image * np.float32(255)), 0, 255), casting="unsafe")
        return
    target = out if dtype == "float32" else np.empty(out.shape, np.float32)
    np.subtract(image, np.asarray(mean, np.float32).reshape(3, 1, 1), out=target)
    target /= np.asarray(std, np.float32).reshape(3, 1, 1)
    if dtype != "float32":
        cast_into(target, out, dtype)
