"""The native crop-parameter draw: the same numbers as numpy's Philox, bit for bit.

`TrainTransform.make_params` given a keyed stream (`sample_stream`) draws in C; given the
stream's numpy Generator it draws in Python. Every sample's crop must not depend on which
ran, so the two are compared exactly, over the sizes and settings that take each branch
(a box found on some try, the centre-crop fallback, 1-pixel sides, one-value ranges).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_loader.ops import CropParams, TrainTransform
from gpu_loader.ops._backend import forced, native_module
from gpu_loader.sources import SampleStream, sample_rng, sample_stream

native = native_module()
needs_native = pytest.mark.skipif(native is None, reason="the native extension is not built")


@needs_native
@pytest.mark.parametrize(
    "key", [(0, 0), (1, 2), (2**64 - 1, 2**64 - 1), (12345, (3 << 40) | 77), (2**63, 1)]
)
def test_the_c_stream_is_numpys_philox(key: tuple[int, int]) -> None:
    assert native is not None
    expected = np.random.Philox(key=key[0] | key[1] << 64).random_raw(41).tolist()
    assert native.philox_words(*key, 41) == expected


def both(t: TrainTransform, h: int, w: int, stream: SampleStream) -> tuple[CropParams, CropParams]:
    return t.make_params(h, w, stream), t.make_params(h, w, stream.generator())


SIZES = [(1, 1), (1, 7), (7, 1), (2, 2), (375, 500), (500, 375), (4000, 3), (3, 4000)]
SIZES += [(65535, 65535), (2**31 - 1, 1), (1, 2**31 - 1), (123_457, 98_765)]
TRANSFORMS = [
    TrainTransform(224),
    TrainTransform(224, scale=(0.5, 0.5), ratio=(1.0, 1.0)),  # one-value ranges
    TrainTransform(224, scale=(1.5, 3.0)),  # never fits: always the fallback
    TrainTransform(224, scale=(0.01, 1.0), ratio=(0.1, 10.0), flip_prob=0.3),
    TrainTransform(224, flip_prob=0.0),
    TrainTransform(224, flip_prob=1.0),
]


@needs_native
@pytest.mark.parametrize("transform", TRANSFORMS, ids=range(len(TRANSFORMS)))
def test_c_and_python_draw_the_same_params(transform: TrainTransform) -> None:
    fallbacks = 0
    for h, w in SIZES:
        for index in range(150):
            c, py = both(transform, h, w, sample_stream(3, 5, index))
            assert c == py, (h, w, index)
            fallbacks += c.top == (h - c.height) // 2 and c.left == (w - c.width) // 2
    assert fallbacks > 0  # the fallback branch ran (1 x 1 always takes it)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**24 - 1),
    index=st.integers(0, 2**40 - 1),
    h=st.integers(1, 20_000),
    w=st.integers(1, 20_000),
    s=st.tuples(st.floats(0.001, 2.0), st.floats(0.0, 1.0)),
    r=st.tuples(st.floats(0.05, 4.0), st.floats(0.0, 4.0)),
    flip_prob=st.floats(0.0, 1.0),
)
def test_c_and_python_agree_on_any_key_and_setting(
    seed: int,
    epoch: int,
    index: int,
    h: int,
    w: int,
    s: tuple[float, float],
    r: tuple[float, float],
    flip_prob: float,
) -> None:
    t = TrainTransform(
        224, scale=(s[0], s[0] + s[1]), ratio=(r[0], r[0] + r[1]), flip_prob=flip_prob
    )
    c, py = both(t, h, w, sample_stream(seed, epoch, index))
    assert c == py


def test_a_stream_gives_the_same_params_every_time_and_as_sample_rng() -> None:
    t = TrainTransform(224)
    stream = sample_stream(0, 1, 2)
    first = t.make_params(480, 640, stream)
    assert t.make_params(480, 640, stream) == first  # a Generator would move on
    assert t.make_params(480, 640, sample_rng(0, 1, 2)) == first
    assert repr(stream) == "SampleStream(seed=0, epoch=1, index=2)"


def test_without_the_extension_a_stream_draws_in_python() -> None:
    t = TrainTransform(224, flip_prob=0.5)
    with forced("pillow"):
        params = [t.make_params(375, 500, sample_stream(9, 0, i)) for i in range(50)]
    assert params == [t.make_params(375, 500, sample_rng(9, 0, i)) for i in range(50)]


def test_values_python_refuses_are_refused_from_a_stream_too() -> None:
    # area x scale overflows to inf: Python's round() raises; the C draw hands it back.
    t = TrainTransform(224, scale=(1e300, 1e308))
    with pytest.raises(OverflowError):
        t.make_params(500, 500, sample_rng(0, 0, 0))
    with pytest.raises(OverflowError):
        t.make_params(500, 500, sample_stream(0, 0, 0))
    assert math.isfinite(t.scale[1])


def test_a_stream_key_outside_philoxs_words_is_refused() -> None:
    # C would wrap 2**64 + 5 to 5 silently, where numpy raises.
    for low, high in ((2**64 + 5, 0), (-1, 0), (0, 2**64)):
        with pytest.raises(ValueError, match=r"must be an int in \[0, 2\*\*64\)"):
            SampleStream(low, high)


def test_stream_keys_are_checked_as_sample_rng_checks_them() -> None:
    with pytest.raises(ValueError, match="epoch"):
        sample_stream(0, 2**24, 0)
    with pytest.raises(TypeError, match="index"):
        sample_stream(0, 0, 1.5)  # type: ignore[arg-type]
