"""make_params: torchvision RandomResizedCrop / Resize(int) + CenterCrop semantics."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from gpu_loader.ops import IMAGENET_MEAN, CropParams, EvalTransform, TrainTransform
from gpu_loader.ops._transforms import resized_shorter_side


def draws(t: TrainTransform, h: int, w: int, n: int, seed: int = 0) -> list[CropParams]:
    rng = np.random.default_rng(seed)
    return [t.make_params(h, w, rng) for _ in range(n)]


# max_area: the largest area fraction a box with aspect in [3/4, 4/3] can have in the image.
@pytest.mark.parametrize(
    ("h", "w", "max_area"),
    [(375, 500, 1.0), (500, 375, 1.0), (224, 224, 1.0), (1000, 333, 333 * 444 / 333000)],
)
def test_train_boxes_respect_scale_ratio_and_bounds(h: int, w: int, max_area: float) -> None:
    t = TrainTransform(224)
    params = draws(t, h, w, 2000)
    for p in params:
        assert p.top == int(p.top) and p.left == int(p.left)
        assert p.top >= 0 and p.bottom <= h and p.left >= 0 and p.right <= w
        # Rounding w and h to integers moves area and aspect by at most half a pixel each.
        slack = (1 + 0.5 / p.height) * (1 + 0.5 / p.width)
        area = p.height * p.width / (h * w)
        aspect = p.width / p.height
        assert 0.08 / slack <= area <= 1.0 * slack
        assert (3 / 4) / slack <= aspect <= (4 / 3) * slack
    areas = np.array([p.height * p.width / (h * w) for p in params])
    # Uniform in [0.08, 1] before rejection: the spread must show it, not a constant box.
    assert areas.min() < 0.12 and areas.max() > 0.85 * max_area
    flips = np.mean([p.flip for p in params])
    assert 0.45 < flips < 0.55


def test_train_offsets_cover_the_inclusive_range() -> None:
    # scale and ratio pinned so every try gives a 9x9 box in a 10x10 image.
    t = TrainTransform(8, scale=(0.81, 0.81), ratio=(1.0, 1.0))
    params = draws(t, 10, 10, 200)
    assert {(p.height, p.width) for p in params} == {(9, 9)}
    assert {p.top for p in params} == {0, 1} and {p.left for p in params} == {0, 1}


@pytest.mark.parametrize(
    ("h", "w", "expected"),
    [
        (1000, 10, (493, 0, 13, 10)),  # too tall: w = W, h = round(W / 3/4)
        (10, 1000, (0, 493, 10, 13)),  # too wide: h = H, w = round(H * 4/3)
    ],
)
def test_train_fallback_for_extreme_aspect(
    h: int, w: int, expected: tuple[int, int, int, int]
) -> None:
    for p in draws(TrainTransform(32), h, w, 20):
        assert (p.top, p.left, p.height, p.width) == expected


def test_train_fallback_for_impossible_scale_is_whole_image() -> None:
    for p in draws(TrainTransform(32, scale=(2.0, 3.0)), 120, 100, 20):
        assert (p.top, p.left, p.height, p.width) == (0, 0, 120, 100)


def test_train_is_deterministic_per_seed() -> None:
    t = TrainTransform(224)
    assert draws(t, 400, 500, 50, seed=3) == draws(t, 400, 500, 50, seed=3)
    assert draws(t, 400, 500, 50, seed=3) != draws(t, 400, 500, 50, seed=4)


def test_flip_prob_extremes() -> None:
    assert not any(p.flip for p in draws(TrainTransform(32, flip_prob=0.0), 64, 64, 100))
    assert all(p.flip for p in draws(TrainTransform(32, flip_prob=1.0), 64, 64, 100))


@pytest.mark.parametrize(("h", "w"), [(375, 500), (500, 375), (256, 256), (300, 301), (999, 7)])
def test_resize_shorter_side_truncates_the_long_side(h: int, w: int) -> None:
    new_h, new_w = resized_shorter_side(h, w, 256)
    if w <= h:
        assert (new_h, new_w) == (int(256 * h / w), 256)
    else:
        assert (new_h, new_w) == (256, int(256 * w / h))


def test_eval_box_is_resize_then_centre_crop_mapped_back() -> None:
    # 375 x 500 -> Resize(256) -> 256 x 341; crop 224: top = round(16) = 16,
    # left = round(58.5) = 58 (Python rounds half to even).
    p = EvalTransform(224).make_params(375, 500, np.random.default_rng(0))
    sy, sx = 375 / 256, 500 / 341
    assert p.top == pytest.approx(16 * sy) and p.left == pytest.approx(58 * sx)
    assert p.height == pytest.approx(224 * sy) and p.width == pytest.approx(224 * sx)
    assert not p.flip


@pytest.mark.parametrize(("h", "w"), [(375, 500), (1001, 640), (224, 224), (257, 1900)])
def test_eval_box_is_centred_and_inside(h: int, w: int) -> None:
    p = EvalTransform((200, 160), resize=230).make_params(h, w, np.random.default_rng(0))
    new_h, new_w = resized_shorter_side(h, w, 230)
    assert min(new_h, new_w) == 230
    assert p.bottom <= h + 1e-9 and p.right <= w + 1e-9
    # The box is the 200 x 160 crop of the resized image, mapped back to source pixels...
    assert p.height == pytest.approx(200 * h / new_h) and p.width == pytest.approx(160 * w / new_w)
    # ...centred to within one resized pixel (the rounding of the offset).
    assert abs(p.top - (h - p.bottom)) <= h / new_h + 1e-9
    assert abs(p.left - (w - p.right)) <= w / new_w + 1e-9


def test_eval_squash_resize_pair_is_torchvision_resize_hw_then_centre_crop() -> None:
    # Resize((8, 10)) of a 100 x 50 image, then CenterCrop((4, 6)): offsets
    # round((8 - 4) / 2) = 2 and round((10 - 6) / 2) = 2 in the resized image.
    t = EvalTransform((4, 6), resize=(8, 10))
    assert t.resize == (8, 10) and t.output_size == (4, 6)
    p = t.make_params(100, 50, np.random.default_rng(0))
    assert (p.top, p.left, p.height, p.width) == (25.0, 10.0, 50.0, 30.0)
    assert EvalTransform(4, resize=[9]).resize == 9  # a one-element list is the int


def test_eval_default_resize_and_output_size() -> None:
    assert EvalTransform(224).resize == 256
    assert EvalTransform(224).output_size == (224, 224)
    assert TrainTransform((128, 96)).output_size == (128, 96)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: TrainTransform(0), "size"),
        (lambda: TrainTransform((1, 2, 3)), "size"),  # type: ignore[arg-type]
        (lambda: TrainTransform(32, scale=(0.9, 0.1)), "scale"),
        (lambda: TrainTransform(32, ratio=(-1.0, 1.0)), "ratio"),
        (lambda: TrainTransform(32, flip_prob=1.5), "flip_prob"),
        (lambda: TrainTransform(32, std=(0.2, 0.0, 0.2)), "std"),
        (lambda: TrainTransform(32, mean=(0.5, 0.5)), "mean"),  # type: ignore[arg-type]
        (lambda: EvalTransform(224, resize=200), "resize"),
        (lambda: EvalTransform((8, 8), resize=(16, 7)), "at least"),
        (lambda: EvalTransform(8, resize=(16, 16, 16)), "pair of ints"),  # type: ignore[arg-type]
        (lambda: EvalTransform(8, resize=(16.0, 16)), "pair of ints"),  # type: ignore[arg-type]
        (lambda: CropParams(0, 0, 0, 10), "positive size"),
        (lambda: CropParams(-1, 0, 5, 10), "inside"),
    ],
)
def test_invalid_arguments_say_what_is_wrong(factory: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        factory()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        # An infinite bound passed construction, then failed every sample's draw with an
        # OverflowError that named no parameter (QA).
        ({"scale": (0.08, math.inf)}, ValueError, "`scale` must be .*finite"),
        ({"ratio": (0.5, math.inf)}, ValueError, "`ratio` must be .*finite"),
        ({"scale": (math.nan, 1.0)}, ValueError, "`scale`"),
        ({"scale": (0.1, 0.5, 0.9)}, TypeError, "`scale` must be a pair"),
        ({"scale": 0.5}, TypeError, "`scale` must be a pair"),
        ({"ratio": ("a", "b")}, TypeError, "`ratio` must be a pair"),
        ({"flip_prob": "0.5"}, TypeError, "`flip_prob`"),
        ({"flip_prob": True}, TypeError, "`flip_prob`"),
    ],
)
def test_crop_ranges_and_flip_prob_are_checked_by_name(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        TrainTransform(32, **kwargs)  # type: ignore[arg-type]


def test_crop_ranges_take_any_pair_of_numbers() -> None:
    t = TrainTransform(32, scale=np.array([0.25, 0.5]), ratio=[np.float32(0.5), 2])  # type: ignore[arg-type]
    assert t.scale == (0.25, 0.5)
    assert t.ratio == (0.5, 2.0)
    assert all(type(v) is float for v in (*t.scale, *t.ratio, t.flip_prob))


@pytest.mark.parametrize("factory", [TrainTransform, EvalTransform])
def test_mean_and_std_on_the_0_255_scale_are_warned_about(factory: type) -> None:
    # Accepted silently, they turned every pixel into about -2.
    with pytest.warns(UserWarning, match="look like 0-255 values") as record:
        factory(32, mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    assert record[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        factory(32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def test_crop_params_scaled() -> None:
    p = CropParams(10, 20, 30, 40, flip=True).scaled(0.25)
    assert p == CropParams(2.5, 5.0, 7.5, 10.0, flip=True)


def test_transforms_are_frozen_and_normalised() -> None:
    t = TrainTransform(224, mean=[0.5, 0.5, 0.5])  # type: ignore[arg-type]
    assert t.mean == (0.5, 0.5, 0.5) and t.std != IMAGENET_MEAN
    with pytest.raises(AttributeError):
        t.size = 3  # type: ignore[misc]


def test_eval_centre_crop_rounds_half_offsets_to_even_as_torchvision() -> None:
    # Squashed to 9 x 7, cropped to 4 x 4: offsets 2.5 and 1.5 both round to 2 (floor
    # would give 1 on the left; rounding half up, 3 at the top).
    p = EvalTransform((4, 4), resize=(9, 7)).make_params(90, 70, np.random.default_rng(0))
    assert (p.top, p.left) == (pytest.approx(2 * 90 / 9), pytest.approx(2 * 70 / 7))
    assert (p.height, p.width) == (pytest.approx(4 * 90 / 9), pytest.approx(4 * 70 / 7))


def test_eval_default_resize_rounds_the_256_over_224_ratio() -> None:
    assert EvalTransform(96).resize == 110  # 109.71: floor would give 109
    assert EvalTransform((100, 64)).resize == 114  # the longer side: 114.29


def test_reduced_decode_factor_keeps_both_sides_at_least_the_minimum() -> None:
    from gpu_loader.ops._decode import choose_dct_factor

    # A wide image whose crop needs 800 px across: only 1/2 keeps the width.
    assert choose_dct_factor(200, 1600, (20, 800)) == 2
    assert choose_dct_factor(1600, 200, (800, 20)) == 2
    assert choose_dct_factor(1600, 1600, (100, 100)) == 8
    assert choose_dct_factor(1600, 1600, None) == 1
    assert choose_dct_factor(63, 4000, (1, 1)) == 1  # under 64 px a side: never scaled


@pytest.mark.parametrize(
    ("mean", "std"),
    [((0.5, 0.5, 0.5), (58.0, 57.0, 57.0)), ((124.0, 116.0, 104.0), (0.2, 0.2, 0.2))],
)
def test_either_of_mean_or_std_on_the_0_255_scale_warns(
    mean: tuple[float, ...], std: tuple[float, ...]
) -> None:
    with pytest.warns(UserWarning, match="look like 0-255 values"):
        TrainTransform(32, mean=mean, std=std)
