"""Small real image files on disk for loader tests (generated, deterministic)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_loader.datasets import make_image_folder
from gpu_loader.sources import FileList


@pytest.fixture(scope="session")
def photo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    return make_image_folder(
        root,
        num_images=48,
        num_classes=4,
        seed=3,
        min_side=48,
        max_side=160,
        png_fraction=0.1,
        gray_fraction=0.1,
    )


def image_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in {".jpg", ".png"})


@pytest.fixture(scope="session")
def unique_list(photo_dir: Path) -> FileList:
    """Every image with its own label, so a batch's labels name its samples."""
    return FileList([(str(p), i) for i, p in enumerate(image_files(photo_dir))])


@pytest.fixture(scope="session")
def bad_list(
    photo_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[FileList, set[str]]:
    """Good images (labels 0..n-1) mixed with corrupt, truncated, empty, missing and non-image files."""
    bad_root = tmp_path_factory.mktemp("bad")
    good = image_files(photo_dir)[:30]
    jpeg = good[0].read_bytes()
    bad: dict[str, bytes | None] = {
        "corrupt.jpg": jpeg[:200] + bytes(range(256)) * 8,
        "truncated.jpg": jpeg[: len(jpeg) // 3],
        "empty.jpg": b"",
        "text.jpg": b"this is not an image at all\n" * 20,
        "missing.jpg": None,
    }
    items: list[tuple[str, int]] = [(str(p), i) for i, p in enumerate(good)]
    bad_keys = set()
    for j, (name, data) in enumerate(bad.items()):
        path = bad_root / name
        if data is not None:
            path.write_bytes(data)
        bad_keys.add(str(path))
        items.insert(3 + 5 * j, (str(path), 1000 + j))
    return FileList(items), bad_keys


def checkpoint_after_a_failure(loader: Any) -> dict[str, Any]:
    """A mid-epoch ``state_dict()`` (through JSON) of ``loader``, taken after its first
    batch once it has met a bad file: its threads run ahead of the batches, but in
    straggler mode the first batch can come before any bad file has been tried. Closes
    the loader."""
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 30
    while not loader.failed_samples() and time.monotonic() < deadline:
        time.sleep(0.01)
    state: dict[str, Any] = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state
