"""Fixtures for the GPU orchestration run through the CPU stand-ins."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.cuda._arena import PinnedArena
from gpu_loader.cuda._gpu_stage import FetchedSample, GpuBatchStage, GpuFetcher
from gpu_loader.cuda._standin_device import StandinRuntime
from gpu_loader.cuda._standins import standin_ports
from gpu_loader.datasets import photo_like
from gpu_loader.ops import TrainTransform, decode, transform_into
from gpu_loader.sources import FileList, sample_rng

SEED, EPOCH = 3, 1
OUT = 48


def _jpeg(image: np.ndarray, sub: str = "420") -> bytes:
    return bytes(simplejpeg.encode_jpeg(image, quality=90, colorsubsampling=sub))


def _pil(image: np.ndarray | Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    pil = image if isinstance(image, Image.Image) else Image.fromarray(image)
    pil.save(buf, fmt, **kw)
    return buf.getvalue()


def undefined_tables(jpeg: bytes) -> bytes:
    """``jpeg`` with its scan naming Huffman tables it never defines: the header and the
    marker structure are whole (the fetch passes it), the decode fails (both decoders)."""
    sos = jpeg.index(b"\xff\xda")
    damaged = bytearray(jpeg)
    for c in range(jpeg[sos + 4]):
        damaged[sos + 6 + 2 * c] = 0x33
    return bytes(damaged)


def sample_files() -> dict[str, bytes]:
    """name -> bytes: the formats that decode, and the ones that must fail."""
    rng = np.random.default_rng(11)
    photos = [photo_like(h, w, rng) for h, w in ((120, 160), (200, 90), (75, 75), (300, 260))]
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: the oriented size swaps height and width
    good = {
        "a.jpg": _jpeg(photos[0]),
        "b444.jpg": _jpeg(photos[1], "444"),
        "c.jpg": _jpeg(photos[2]),
        "d.jpg": _jpeg(photos[3]),
        "gray.jpg": bytes(
            simplejpeg.encode_jpeg(photos[0][:, :, :1].copy(), quality=90, colorspace="GRAY")
        ),
        "cmyk.jpg": _pil(Image.fromarray(photos[1]).convert("CMYK"), "JPEG"),
        "exif6.jpg": _pil(photos[3], "JPEG", quality=92, exif=exif.tobytes()),
        "e.png": _pil(photos[2], "PNG"),
        "f.webp": _pil(photos[0], "WEBP", lossless=True),
    }
    bad = {
        "truncated.jpg": _jpeg(photos[3])[:700],
        "undecodable.jpg": undefined_tables(_jpeg(photos[2])),
        "garbage.jpg": b"\xff\xd8\xff" + b"not a jpeg at all" * 40,
        "text.jpg": b"hello, I am not an image\n" * 20,
        "empty.jpg": b"",
    }
    return {**good, **bad}


BAD = {"truncated.jpg", "undecodable.jpg", "garbage.jpg", "text.jpg", "empty.jpg"}


@dataclass
class Dataset:
    root: Path
    source: FileList
    names: list[str]


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp("gpu_stage_data")
    files = sample_files()
    names = sorted(files)
    for name in names:
        (root / name).write_bytes(files[name])
    source = FileList([(root / n, i % 5) for i, n in enumerate(names)])
    return Dataset(root, source, names)


TRANSFORM = TrainTransform(OUT, scale=(0.3, 1.0))


def reference(
    data: bytes, index: int, dtype: str = "float32", transform: TrainTransform = TRANSFORM
) -> np.ndarray:
    """The CPU path at full decode scale: same params, same math, no DCT shortcut."""
    image = decode(data, key="ref", exif=transform.exif_orientation)
    params = transform.make_params(image.height, image.width, sample_rng(SEED, EPOCH, index))
    out = np.empty((3, OUT, OUT), np.float32 if dtype == "float32" else np.uint8)
    transform_into(
        image, params, out, mean=transform.mean, std=transform.std, dtype=dtype,  # type: ignore[arg-type]
        interpolation=transform.interpolation,
    )  # fmt: skip
    return out


def make_stage(
    labels: np.ndarray, dtype: str = "float32", transform: TrainTransform = TRANSFORM
) -> tuple[GpuBatchStage, StandinRuntime]:
    runtime = StandinRuntime()
    stage = GpuBatchStage(standin_ports(runtime), transform, labels, dtype=dtype)  # type: ignore[arg-type]
    return stage, runtime


def fetch_all(
    source: FileList,
    arena: PinnedArena,
    indices: list[int],
    pixel_arena: PinnedArena | None = None,
    transform: TrainTransform = TRANSFORM,
) -> tuple[list[FetchedSample], list[tuple[int, BaseException]]]:
    fetcher = GpuFetcher(source, arena, transform, seed=SEED, epoch=EPOCH, pixel_arena=pixel_arena)
    good, bad = [], []
    for position, index in enumerate(indices):
        try:
            good.append(fetcher.fetch(position, index))
        except Exception as exc:
            bad.append((index, exc))
    return good, bad
