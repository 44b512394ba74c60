"""Tiny real image files and tar shards for the sources tests (Pillow-made bytes)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def image_bytes(seed: int, fmt: str = "JPEG", size: tuple[int, int] = (8, 6)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def shard_bytes(samples: list[tuple[str, str, bytes, int | None]]) -> bytes:
    """A tar with ``key.ext`` image members and ``key.cls`` labels (None: no .cls)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key, ext, data, label in samples:
            add_member(tar, f"{key}.{ext}", data)
            if label is not None:
                add_member(tar, f"{key}.cls", str(label).encode())
    return out.getvalue()


def same_outcome(alone: object, batched: object) -> bool:
    """A batched read's result (`_read_local_run`) against the one-by-one `read`'s: the
    same bytes, or an error of the same type, words, notes, errno and file name, which
    holds no traceback (QA74: one held the whole run's bytes)."""
    if not isinstance(alone, Exception):
        return alone == batched
    return (
        type(alone) is type(batched)
        and str(alone) == str(batched)
        and getattr(alone, "__notes__", None) == getattr(batched, "__notes__", None)
        and getattr(alone, "errno", None) == getattr(batched, "errno", None)
        and getattr(alone, "filename", None) == getattr(batched, "filename", None)
        and isinstance(batched, Exception)
        and batched.__traceback__ is None
    )
