"""Fixtures for the sources tests: a class-folder tree on disk and in fsspec's memory://."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from tests.sources._data import image_bytes, write

# (relative path, label under torchvision's rule); classes sort by code point: "Cat" < "bird".
TREE_EXPECTED = [
    ("Cat/x.webp", 0),
    ("bird/a.bmp", 1),
    ("bird/zz/y.jpg", 1),
    ("dog/Z.JPG", 2),
    ("dog/a.png", 2),
    ("dog/b.jpg", 2),
    ("dog/sub/c.jpeg", 2),
]
_FORMATS = {"webp": "WEBP", "bmp": "BMP", "png": "PNG"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "train"
    for n, (rel, _) in enumerate(TREE_EXPECTED):
        fmt = _FORMATS.get(rel.rsplit(".", 1)[1].lower(), "JPEG")
        write(root / rel, image_bytes(n, fmt))
    write(root / "dog" / "notes.txt", b"not an image")  # wrong extension: ignored
    write(root / "loose.jpg", image_bytes(99))  # not inside a class folder: ignored
    return root


@pytest.fixture
def memfs() -> Iterator[tuple[fsspec.AbstractFileSystem, str]]:
    """A private folder in memory:// (a process-global store), removed afterwards."""
    fs = fsspec.filesystem("memory")
    base = f"/t-{uuid.uuid4().hex}"
    yield fs, base
    if fs.exists(base):
        fs.rm(base, recursive=True)


def copy_to_memory(fs: fsspec.AbstractFileSystem, local: Path, base: str) -> str:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{base}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"memory://{base}"
