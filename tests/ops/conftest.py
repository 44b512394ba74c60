"""Shared fixtures: photo-like test images encoded once per session."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.datasets import photo_like
from gpu_loader.ops._backend import forced


@dataclass(frozen=True)
class Photo:
    name: str
    data: bytes
    height: int
    width: int


def jpeg(image: np.ndarray, quality: int = 90, sub: str = "420") -> bytes:
    return bytes(simplejpeg.encode_jpeg(image, quality=quality, colorsubsampling=sub))


def pillow_jpeg(image: np.ndarray, mode: str = "RGB", **kw: object) -> bytes:
    """``image`` as a JPEG from Pillow (``kw``: its save options, progressive, restart
    markers, ...), in colour ``mode``."""
    buf = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(params=["native", "pillow"])
def cpu_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per CPU backend (``$GPU_LOADER_CPU_BACKEND``)."""
    with forced(request.param):
        yield request.param


# (height, width, subsampling): small, typical, portrait, wide, and big ones that take the
# reduced-size (DCT) decode path.
SHAPES = [
    (200, 240, "420"),
    (375, 500, "444"),
    (640, 427, "420"),
    (300, 900, "420"),
    (1100, 1500, "420"),
    (2000, 1400, "444"),
]


@pytest.fixture(scope="session")
def photos() -> list[Photo]:
    out = []
    for i, (h, w, sub) in enumerate(SHAPES):
        image = photo_like(h, w, np.random.default_rng(100 + i))
        out.append(Photo(f"jpeg{sub}_{h}x{w}", jpeg(image, 88, sub), h, w))
    image = photo_like(333, 280, np.random.default_rng(7))
    out.append(Photo("png_333x280", png(image), 333, 280))
    return out
