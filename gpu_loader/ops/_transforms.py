"""Transform specs: every geometric transform is a crop box in source pixels + an output size.

The exact formulas are in docs/transform-semantics.md (torchvision's RandomResizedCrop
sampling and fallback, Resize(int) truncation, CenterCrop rounding). `make_params` draws from
the caller's generator, so the CPU path and the CUDA kernels compute the same function of the
same parameters whatever the thread count. The caller may pass a keyed stream
(`gpu_loader.sources.sample_stream`) instead of a numpy Generator: the native extension then
draws the same numbers in C, without building the Generator (4 us per sample for key and
parameters under the GIL, against 22 us: gpu_loader/sources/README.md).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeGuard, cast

import numpy as np

from gpu_loader.ops._backend import native_module

OutputDtype = Literal["float32", "float16", "bfloat16", "uint8"]
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "uint8")
Interpolation = Literal["bilinear", "bicubic"]
INTERPOLATIONS: tuple[str, ...] = ("bilinear", "bicubic")

# ImageNet statistics on the [0, 1] scale, RGB order (torchvision's defaults).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

_MAX_TRIES = 10  # torchvision RandomResizedCrop.get_params; _native.c's MAX_TRIES too
_NATIVE_MAX_SIDE = (1 << 31) - 1  # train_params' limit: larger images draw in Python


class KeyedStream(Protocol):
    """A per-sample random stream not yet built as a numpy Generator: numpy's Philox with
    the 128-bit key ``philox_key`` (low word, high word), counter at zero."""

    @property
    def philox_key(self) -> tuple[int, int]: ...

    def generator(self) -> np.random.Generator:
        """The stream as numpy's Generator (its first draws are the ones C would make)."""
        ...


Random = np.random.Generator | KeyedStream
"""What `make_params` draws from: a Generator, or a keyed stream (drawn in C when it can)."""


@dataclass(frozen=True)
class CropParams:
    """A crop box in source pixels (may be fractional) and a horizontal flip."""

    top: float
    left: float
    height: float
    width: float
    flip: bool = False

    def __post_init__(self) -> None:
        if not (self.height > 0 and self.width > 0):
            raise ValueError(
                f"crop box must have a positive size, got height={self.height}, width={self.width}"
            )
        if not (self.top >= 0 and self.left >= 0):
            raise ValueError(
                f"crop box must start inside the image, got top={self.top}, left={self.left}"
            )

    @property
    def bottom(self) -> float:
        return self.top + self.height

    @property
    def right(self) -> float:
        return self.left + self.width

    def scaled(self, factor: float) -> CropParams:
        """The same box in an image resized by ``factor`` (e.g. 1/2 for a DCT-downscaled decode)."""
        if not factor > 0:
            raise ValueError(f"`factor` must be > 0, got {factor}")
        return CropParams(
            top=self.top * factor,
            left=self.left * factor,
            height=self.height * factor,
            width=self.width * factor,
            flip=self.flip,
        )


def _size_pair(size: int | Sequence[int], name: str = "size") -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    elif (
        isinstance(size, Sequence)
        and len(size) == 2
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in size)
    ):
        pair = (int(size[0]), int(size[1]))
    else:
        raise ValueError(f"`{name}` must be an int or a pair of ints (height, width), got {size!r}")
    if min(pair) < 1:
        raise ValueError(f"`{name}` must be >= 1, got {size!r}")
    return pair


def _channel_triple(values: Sequence[float], name: str) -> tuple[float, float, float]:
    try:
        triple = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be 3 numbers (R, G, B), got {values!r}") from None
    if len(triple) != 3 or not all(math.isfinite(v) for v in triple):
        raise ValueError(f"`{name}` must be 3 finite numbers (R, G, B), got {values!r}")
    return (triple[0], triple[1], triple[2])


def _validate_norm(obj: object, mean: Sequence[float], std: Sequence[float]) -> None:
    mean_t = _channel_triple(mean, "mean")
    object.__setattr__(obj, "mean", mean_t)
    std_t = _channel_triple(std, "std")
    if min(std_t) <= 0:
        raise ValueError(f"`std` must be > 0 per channel, got {std!r}")
    object.__setattr__(obj, "std", std_t)
    if max(abs(m) for m in mean_t) > 1 or min(std_t) > 1:
        warnings.warn(
            f"mean={tuple(mean)!r}, std={tuple(std)!r} look like 0-255 values: pixels are "
            "scaled to [0, 1] before they are normalised (as torchvision's ToTensor + "
            "Normalize), so give mean and std on that scale, e.g. ImageNet's "
            f"{IMAGENET_MEAN} and {IMAGENET_STD}",
            UserWarning,
            stacklevel=4,
        )


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {value!r}")


def _check_interpolation(value: object) -> None:
    if value not in INTERPOLATIONS:
        raise ValueError(
            f"`interpolation` must be one of {INTERPOLATIONS} (Pillow's antialiased "
            f"BILINEAR or BICUBIC, as torchvision's InterpolationMode), got {value!r}"
        )


def _is_real(value: object) -> bool:
    """A real number: not a bool, a string or a complex."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _range_pair(name: str, value: object) -> tuple[float, float]:
    """``(lo, hi)``: two finite numbers with ``0 < lo <= hi`` (a crop's scale or ratio range;
    an infinite bound would fail every sample's draw instead of the construction)."""
    pair = tuple(value) if isinstance(value, Sequence | np.ndarray) else ()
    if isinstance(value, str) or len(pair) != 2 or not all(_is_real(v) for v in pair):
        raise TypeError(f"`{name}` must be a pair of numbers (lo, hi), got {value!r}")
    lo, hi = (float(v) for v in pair)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"`{name}` must be (lo, hi), finite, with 0 < lo <= hi, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class TrainTransform:
    """RandomResizedCrop + RandomHorizontalFlip + Normalize (torchvision semantics)."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_prob: float = 0.5
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    reduced_decode: bool = True
    """Decode a large JPEG at 1/2, 1/4 or 1/8 size in the DCT domain when the crop box
    still covers the output (much faster on large images). Fine periodic texture near the
    output's resolution can then alias (down to ~28 dB against the full-decode reference;
    natural photos stay >= 35 dB). False: always decode at full size, for evaluation that
    must match a Pillow/torchvision pipeline closely. The GPU path always decodes full."""
    exif_orientation: bool = True
    """Turn each image upright by its EXIF orientation before cropping, as Pillow's
    ``exif_transpose`` does. False: use the pixels as stored, as torchvision's default
    image loader does (to match a model trained or evaluated that way). Both decode
    paths."""
    interpolation: Interpolation = "bilinear"
    """The resize filter, antialiased when shrinking as Pillow's is (torchvision's
    ``InterpolationMode.BILINEAR`` / ``BICUBIC``, e.g. timm's ``interpolation="bicubic"``).
    "bicubic" (Pillow's a = -0.5 kernel, support 2) can overshoot; its result is clamped to
    the 0-255 range before the normalisation. Both decode paths (the GPU kernel has
    the same filter)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_pair(self.size))
        _check_flag("reduced_decode", self.reduced_decode)
        _check_flag("exif_orientation", self.exif_orientation)
        _check_interpolation(self.interpolation)
        object.__setattr__(self, "scale", _range_pair("scale", self.scale))
        object.__setattr__(self, "ratio", _range_pair("ratio", self.ratio))
        flip = self.flip_prob
        if not _is_real(flip):
            raise TypeError(f"`flip_prob` must be a number in [0, 1], got {flip!r}")
        if not 0.0 <= flip <= 1.0:
            raise ValueError(f"`flip_prob` must be in [0, 1], got {flip!r}")
        object.__setattr__(self, "flip_prob", float(flip))
        _validate_norm(self, self.mean, self.std)

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the output."""
        return cast(tuple[int, int], self.size)  # __post_init__ stored the checked pair

    def make_params(self, height: int, width: int, rng: Random) -> CropParams:
        """Draw a crop box and a flip for an image of ``height`` x ``width`` pixels.

        From a Generator the draws advance it; a keyed stream starts from its beginning each
        time (the same parameters every call), and the native extension draws them in C.
        """
        _check_image_size(height, width)
        s0, s1 = self.scale
        log_r0, log_r1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        if not isinstance(rng, np.random.Generator):
            native = native_module()
            if native is not None and max(height, width) <= _NATIVE_MAX_SIDE:
                top, left, h, w, flip = native.train_params(
                    *rng.philox_key, height, width, s0, s1, log_r0, log_r1, self.flip_prob
                )
                if top >= 0:
                    return CropParams(top=top, left=left, height=h, width=w, flip=flip)
                if top == -1:  # no try fitted
                    top, left, h, w = _fallback_box(height, width, self.ratio)
                    return CropParams(top=top, left=left, height=h, width=w, flip=flip)
                # -2: a value outside what round() accepts; Python raises it as it always has
            rng = rng.generator()
        area = height * width
        box: tuple[int, int, int, int] | None = None
        for _ in range(_MAX_TRIES):
            target = area * float(rng.uniform(s0, s1))
            aspect = math.exp(float(rng.uniform(log_r0, log_r1)))
            w = round(math.sqrt(target * aspect))  # Python round: half to even, as torchvision
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                box = (top, left, h, w)
                break
        if box is None:
            box = _fallback_box(height, width, self.ratio)
        flip = bool(rng.random() < self.flip_prob)
        return CropParams(top=box[0], left=box[1], height=box[2], width=box[3], flip=flip)


def _fallback_box(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's centre crop after 10 failed tries, clamped to the ratio range."""
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    # round() can give 0 for extreme shapes (e.g. 1 x 1000); a box must keep one pixel.
    h, w = max(1, min(h, height)), max(1, min(w, width))
    return (height - h) // 2, (width - w) // 2, h, w


@dataclass(frozen=True)
class EvalTransform:
    """Resize(shorter side to ``resize``) + CenterCrop(``size``) + Normalize, as one crop box.

    ``resize`` as a (height, width) pair resizes to exactly that size first, aspect ratio
    not kept, as torchvision's ``Resize((h, w))`` does ("squash").
    """

    size: int | tuple[int, int]
    resize: int | tuple[int, int] | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    reduced_decode: bool = True
    """As `TrainTransform.reduced_decode`."""
    exif_orientation: bool = True
    """As `TrainTransform.exif_orientation`."""
    interpolation: Interpolation = "bilinear"
    """As `TrainTransform.interpolation`."""

    def __post_init__(self) -> None:
        _check_flag("reduced_decode", self.reduced_decode)
        _check_flag("exif_orientation", self.exif_orientation)
        _check_interpolation(self.interpolation)
        oh, ow = _size_pair(self.size)
        object.__setattr__(self, "size", (oh, ow))
        resize = self.resize
        if resize is None:
            resize = round(max(oh, ow) * 256 / 224)
        object.__setattr__(self, "resize", _checked_resize(resize, self.resize, oh, ow))
        _validate_norm(self, self.mean, self.std)

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the output."""
        return cast(tuple[int, int], self.size)  # __post_init__ stored the checked pair

    def make_params(self, height: int, width: int, rng: Random) -> CropParams:
        """The centre-crop box in source pixels (``rng`` is unused: the transform is fixed)."""
        del rng
        _check_image_size(height, width)
        if isinstance(self.resize, tuple):
            new_h, new_w = self.resize  # squash: both sides given
        else:
            new_h, new_w = resized_shorter_side(height, width, self._resize)
        oh, ow = self.output_size
        top = round((new_h - oh) / 2.0)
        left = round((new_w - ow) / 2.0)
        sy, sx = height / new_h, width / new_w
        return CropParams(top=top * sy, left=left * sx, height=oh * sy, width=ow * sx, flip=False)

    @property
    def _resize(self) -> int:
        # __post_init__ stores an int or a pair; this keeps mypy happy without a cast.
        return self.resize if isinstance(self.resize, int) else 0


def resized_shorter_side(height: int, width: int, size: int) -> tuple[int, int]:
    """torchvision ``Resize(size)`` output (height, width): shorter side ``size``, long truncated."""
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def _checked_resize(resize: object, given: object, oh: int, ow: int) -> int | tuple[int, int]:
    """`EvalTransform.resize` as stored: an int (shorter side) or a (height, width) pair
    (squash), each large enough for the ``oh`` x ``ow`` centre crop; ``given`` is what the
    caller passed, for the message."""
    if isinstance(resize, (tuple, list)) and len(resize) == 1:
        resize = resize[0]  # torchvision: a one-element sequence is the int
    bad = ValueError(
        f"`resize` must be an int, a (height, width) pair of ints or None, got {given!r}"
    )
    if isinstance(resize, (tuple, list)):
        if len(resize) != 2 or not all(map(_is_int, resize)):
            raise bad
        rh, rw = int(resize[0]), int(resize[1])
        if rh < oh or rw < ow:
            raise ValueError(
                f"`resize` {(rh, rw)} must be at least `size` {(oh, ow)} on each side so "
                "the centre crop fits"
            )
        return rh, rw
    if not _is_int(resize):
        raise bad
    if resize < max(oh, ow):
        # The centre crop would need padding; torchvision pads with zeros, which is
        # almost never wanted for training data.
        raise ValueError(
            f"`resize` ({resize}) must be >= the largest side of `size` {(oh, ow)} so the "
            f"centre crop fits; pass resize >= {max(oh, ow)} or leave it None"
        )
    return int(resize)


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _check_image_size(height: int, width: int) -> None:
    if height < 1 or width < 1:
        raise ValueError(f"image size must be >= 1 x 1, got {height} x {width}")


Transform = TrainTransform | EvalTransform
