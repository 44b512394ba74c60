"""examples/train_classifier.py: a short real training run through ImageLoader learns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpu_loader.datasets import make_image_folder

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_classifier.py"


def _example() -> object:
    spec = importlib.util.spec_from_file_location("train_classifier", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--augment", "--batching", "straggler"]])
def test_short_training_run_reduces_the_loss(tmp_path: Path, extra: list[str]) -> None:
    data = make_image_folder(
        tmp_path / "data", num_images=192, num_classes=3, seed=5, min_side=64, max_side=128
    )
    history = _example().main(  # type: ignore[attr-defined]
        [
            "--data",
            str(data),
            "--epochs",
            "4",
            "--batch-size",
            "16",
            "--size",
            "48",
            "--device",
            "cpu",
            "--lr",
            "0.02",
            *extra,
        ]
    )
    assert len(history) == 4
    assert history[-1]["loss"] < 0.8 * history[0]["loss"]
    assert history[-1]["accuracy"] > 0.5  # chance is 1/3
    assert all(0.0 <= h["stall_percent"] <= 100.0 for h in history)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--classes", "0"], "--classes must be >= 1"),  # a raw traceback before (QA)
        (["--lr", "-1"], "--lr must be > 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--device", "cpu", "--decode-on", "gpu"], "--decode-on gpu needs a CUDA device"),
        (["--decode-on", "gpu", "--augment"], "--augment runs on the CPU decode path"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        _example().parse_args(argv)  # type: ignore[attr-defined]
    assert stopped.value.code == 2
    assert needle in capsys.readouterr().err


def test_an_unwritable_cache_folder_is_named_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")  # a file where the cache folder should be
    monkeypatch.setenv("GPU_LOADER_CACHE", str(blocker))
    with pytest.raises(SystemExit) as stopped:
        _example().main(["--num-images", "8", "--epochs", "1"])  # type: ignore[attr-defined]
    message = str(stopped.value.code)
    assert f"cannot write the example dataset into the cache folder {blocker}" in message
    assert "set GPU_LOADER_CACHE to a writable folder" in message
