"""`ImageLoader(augment=...)`: a per-sample function between the resize and the normalisation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import gpu_loader as gl
from gpu_loader.cuda import standin_ports
from gpu_loader.ops import EvalTransform, TrainTransform
from gpu_loader.pipeline import PipelineFailure
from gpu_loader.sources import FileList

SIZE = 32
MEAN = torch.tensor(EvalTransform(SIZE).mean).view(1, 3, 1, 1)
STD = torch.tensor(EvalTransform(SIZE).std).view(1, 3, 1, 1)


def make(source: Any, **kw: Any) -> gl.ImageLoader:
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", EvalTransform(SIZE))
    kw.setdefault("shuffle", False)
    return gl.ImageLoader(source, **kw)


def by_label(loader: gl.ImageLoader) -> dict[int, torch.Tensor]:
    """Each delivered sample's image, by its label (the fixtures' labels name samples)."""
    out: dict[int, torch.Tensor] = {}
    for images, labels in loader:
        for image, label in zip(images, labels.tolist(), strict=True):
            assert label not in out, f"sample {label} delivered twice"
            out[label] = image.clone()
    return out


def normalized(pixels: torch.Tensor) -> torch.Tensor:
    return (pixels.float() / 255 - MEAN[0]) / STD[0]


def identity(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return image


def test_the_function_gets_the_resized_pixels_and_its_result_is_normalised(
    unique_list: FileList,
) -> None:
    pixels = by_label(make(unique_list, dtype="uint8"))  # the transform's 8-bit output
    seen: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def invert(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seen.append((image.dtype, tuple(image.shape)))
        return 255 - image

    got = by_label(make(unique_list, augment=invert))
    assert set(seen) == {(torch.uint8, (3, SIZE, SIZE))}
    assert got.keys() == pixels.keys() == set(range(len(unique_list)))
    for label, image in got.items():
        assert torch.allclose(image, normalized(255 - pixels[label]), atol=1e-5), label


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("returns", ["uint8", "float"])
def test_an_identity_function_changes_only_the_8_bit_rounding(
    unique_list: FileList, dtype: str, returns: str
) -> None:
    def same(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return image if returns == "uint8" else image.to(torch.float64) / 255

    pixels = by_label(make(unique_list, dtype="uint8"))
    got = by_label(make(unique_list, dtype=dtype, augment=same))
    plain = by_label(make(unique_list, dtype=dtype))
    assert got.keys() == pixels.keys()
    for label, image in got.items():
        assert image.dtype == getattr(torch, dtype)
        if dtype == "uint8":
            assert torch.equal(image, pixels[label])
            continue
        tol = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
        assert torch.allclose(image.float(), normalized(pixels[label]), atol=tol, rtol=tol)
        # Rounding to 8 bits first moves a value by at most half a level.
        half_level = 0.5 / 255 / STD[0].min() + 2 * tol
        assert (image.float() - plain[label].float()).abs().max() <= half_level


def brighten(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random gain from the sample's generator (its draws decide the result)."""
    gain = 0.5 + torch.rand(1, generator=generator).item()
    return (image.float() * gain).clamp(0, 255).to(torch.uint8)


def test_draws_from_the_generator_do_not_depend_on_threads_mode_or_crops(
    unique_list: FileList,
) -> None:
    train = TrainTransform(SIZE)

    def run(**kw: Any) -> dict[int, torch.Tensor]:
        return by_label(make(unique_list, transform=train, seed=5, shuffle=True, **kw))

    one = run(augment=brighten, options=gl.LoaderOptions(decode_threads=1, samples_per_task=1))
    many = run(augment=brighten, batching="straggler", options=gl.LoaderOptions(decode_threads=4))
    assert one.keys() == many.keys() == set(range(len(unique_list)))
    assert all(torch.equal(one[k], many[k]) for k in one)
    # The crops are the ones the loader draws without a function: only the gain differs.
    crops = run(augment=identity)
    gains = []
    for k in one:
        base = crops[k] * STD[0] + MEAN[0]  # back to 0-1 pixels
        bright = one[k] * STD[0] + MEAN[0]
        mask = (base > 0.2) & (base < 0.4)  # unclipped and away from 0
        if mask.sum() > 20:
            gains.append((bright[mask] / base[mask]).median().item())
    assert len(gains) > len(one) // 2
    assert min(gains) >= 0.5 and max(gains) <= 1.5 and max(gains) - min(gains) > 0.2


def test_each_epoch_draws_again(unique_list: FileList) -> None:
    loader = make(unique_list, augment=brighten, seed=1)
    first = by_label(loader)
    second = by_label(loader)
    assert loader.epoch == 1
    differ = sum(not torch.equal(first[k], second[k]) for k in first)
    assert differ > len(first) // 2


def test_the_function_runs_on_one_torch_thread_and_the_process_keeps_its_own(
    photo_dir: Path,
) -> None:
    # torch.set_num_threads is process-wide: every decode thread ran the function's ops
    # on an OpenMP team as wide as the machine (DataLoader's workers use one thread each).
    # Checked through the loader, in a fresh process, with a width of 3 set beforehand.
    script = f"""
import json, sys, threading, torch, gpu_loader as gl
torch.set_num_threads(3)
seen = []
def probe(image, generator):
    seen.append((threading.current_thread().name, torch.get_num_threads()))
    return image.float().mul_(1 / 255)
source = gl.sources.ImageFolder({str(photo_dir)!r})
loader = gl.ImageLoader(source, batch_size=4, transform=gl.ops.EvalTransform(32),
                        augment=probe)
for _ in loader:
    pass
print(json.dumps({{"seen": seen, "n": len(source), "main": torch.get_num_threads()}}))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report["seen"]) == report["n"] > 0
    assert {width for _, width in report["seen"]} == {1}
    assert all(name.startswith("gpu_loader-") for name, _ in report["seen"])
    assert report["main"] == 3


@pytest.mark.parametrize("batching", ["ordered", "straggler"])
def test_a_resume_gives_the_remaining_samples_the_same_augmentation(
    unique_list: FileList, batching: str
) -> None:
    full = by_label(make(unique_list, augment=brighten, seed=2, batching=batching))
    loader = make(unique_list, augment=brighten, seed=2, batching=batching)
    it = iter(loader)
    before = {int(v) for _ in range(2) for v in next(it)[1]}
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = make(unique_list, augment=brighten, seed=2, batching=batching)
    resumed.load_state_dict(state)
    rest = by_label(resumed)
    assert Counter([*before, *rest]) == Counter(range(len(unique_list)))
    assert all(torch.equal(rest[k], full[k]) for k in rest)


def refuses(image: torch.Tensor) -> bool:
    return int(image.float().mean() * 1000) % 7 == 0  # decided by the pixels alone


def picky(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if refuses(image):
        raise ValueError("refused by picky")
    return image


def test_a_sample_the_function_fails_is_reported_with_its_key(unique_list: FileList) -> None:
    # The function sees the transform's 8-bit output, so which samples it refuses can be
    # found from a uint8 run.
    pixels = by_label(make(unique_list, dtype="uint8"))
    bad = {label for label, image in pixels.items() if refuses(image)}
    assert 0 < len(bad) < len(pixels)
    loader = make(unique_list, augment=picky, max_failures=None)
    assert set(by_label(loader)) == set(pixels) - bad
    failed = loader.failed_samples()
    keys = [unique_list.key(i) for i in range(len(unique_list)) if unique_list.label(i) in bad]
    assert sorted(f.key for f in failed) == sorted(keys)
    assert {(f.stage, f.error) for f in failed} == {("augment", "ValueError: refused by picky")}

    with pytest.raises(PipelineFailure) as caught:
        by_label(make(unique_list, augment=picky, on_error="raise"))
    error = caught.value.exceptions[0]
    assert isinstance(error, ValueError)
    assert "raised by the loader's `augment` function" in error.__notes__


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda image: None, "return the tensor it changed in place"),
        (lambda image: image.numpy(), "must return a \\[3, H, W\\] torch tensor, got ndarray"),
        (lambda image: image[:, :-1], "shape \\[3, 32, 32\\]"),
        (lambda image: image.to(torch.int32), "uint8 \\(0-255\\) or floating point"),
        (lambda image: image.float(), "float pixels from 0 to 2\\d\\d: .* divide 0-255 values"),
        (lambda image: image.float() * float("nan"), "from nan to nan"),
        (lambda image: (image, None), "tuple \\(a torchvision transform .*lambda image"),
    ],
)
def test_a_wrong_result_fails_the_sample_saying_what_is_wrong(
    unique_list: FileList, returned: Any, message: str
) -> None:
    loader = make(unique_list, augment=lambda image, gen: returned(image), on_error="raise")
    with pytest.raises(PipelineFailure) as caught:
        by_label(loader)
    assert re.search(message, str(caught.value.exceptions[0]))
    skipping = make(unique_list, augment=lambda image, gen: returned(image), max_failures=None)
    assert by_label(skipping) == {}
    assert {f.stage for f in skipping.failed_samples()} == {"augment"}


def test_a_function_is_checked_when_the_loader_is_built(unique_list: FileList) -> None:
    with pytest.raises(TypeError, match="`augment` must be a function"):
        make(unique_list, augment="ColorJitter")
    with pytest.raises(TypeError, match=r"cannot take .*augment=lambda image, generator: t"):
        make(unique_list, augment=lambda image: image)  # a one-argument transform


def test_the_gpu_path_refuses_it_and_auto_picks_the_cpu_path(unique_list: FileList) -> None:
    options = gl.LoaderOptions(decode_on="gpu", gpu_ports=standin_ports(), monitor_gpu=False)
    with pytest.raises(ValueError, match="`augment` runs on the CPU decode path only"):
        make(unique_list, augment=identity, options=options)
    # decode_on="auto" on a CUDA device: the GPU path, unless there is a function.
    plain, augmented = make(unique_list), make(unique_list, augment=identity)
    for loader in (plain, augmented):
        loader.device = torch.device("cuda")
    assert plain.decodes_on_gpu and not augmented.decodes_on_gpu


def test_bad_files_are_still_reported_with_a_function(bad_list: tuple[FileList, set[str]]) -> None:
    source, bad_keys = bad_list
    loader = make(source, augment=brighten, max_failures=None, batching="straggler")
    assert set(by_label(loader)) == set(range(30))  # by_label refuses a repeat
    assert {f.key for f in loader.failed_samples()} == bad_keys
