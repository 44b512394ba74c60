"""Memory safety of the native extension on valid and hostile JPEGs, under AddressSanitizer."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.datasets import photo_like

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "gpu_loader" / "ops" / "_native.c"


def libasan() -> str | None:
    cc = shutil.which("gcc")
    if cc is None:
        return None
    path = subprocess.run(
        [cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def cases() -> list[bytes]:
    shapes = [
        (613, 877, "420"),
        (301, 457, "444"),
        (200, 240, "422"),
        (9, 17, "420"),
        (1, 1, "420"),
        (33, 2, "444"),
    ]
    out = []
    for seed, (h, w, sub) in enumerate(shapes):
        image = photo_like(max(h, 8), max(w, 8), np.random.default_rng(seed))[:h, :w].copy()
        out.append(bytes(simplejpeg.encode_jpeg(image, quality=88, colorsubsampling=sub)))
    buf = io.BytesIO()
    Image.fromarray(photo_like(300, 400, np.random.default_rng(9))).save(
        buf, "JPEG", progressive=True
    )
    out.append(buf.getvalue())
    grey = photo_like(150, 170, np.random.default_rng(10)).mean(axis=2, keepdims=True)
    out.append(bytes(simplejpeg.encode_jpeg(grey.astype(np.uint8), quality=90, colorspace="GRAY")))
    out.append(with_exif(out[3]))
    out.append(with_odd_exif(out[3]))
    out.append(with_odd_exif(out[3], split=21))  # the block in two segments, joined
    return out


def with_exif(jpeg: bytes) -> bytes:
    """``jpeg`` with an Exif block whose Orientation holds three SHORTs stored out of line,
    ending exactly where the block does: every cut of the header reads toward that edge."""
    entries = struct.pack("<HHII", 0x010F, 2, 8, 38) + struct.pack("<HHII", 0x0112, 3, 3, 46)
    tiff = b"II*\x00" + struct.pack("<IH", 8, 2) + entries + b"\x00" * 4  # 38 bytes
    tiff += b"Make\x00\x00\x00\x00" + struct.pack("<HHH", 6, 1, 1)
    segment = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment + jpeg[2:]


def with_odd_exif(jpeg: bytes, split: int | None = None) -> bytes:
    """``jpeg`` with a doubled Exif prefix, big-endian, an Orientation of an unknown type,
    then one that is a DOUBLE stored out of line, ending exactly where the block does;
    with ``split``, the block cut there into two APP1 Exif segments."""
    entries = struct.pack(">HHII", 0x0112, 14, 1, 0) + struct.pack(">HHII", 0x0112, 12, 1, 38)
    tiff = b"MM\x00*" + struct.pack(">IH", 8, 2) + entries + b"\x00" * 4  # 38 bytes
    block = b"Exif\x00\x00" + tiff + struct.pack(">d", 6.0)
    parts = [block] if split is None else [block[:split], block[split:]]
    segments = b""
    for part in parts:
        body = b"Exif\x00\x00" + part
        segments += b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body
    return jpeg[:2] + segments + jpeg[2:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_native_is_memory_safe_under_asan(tmp_path: Path) -> None:
    runtime = libasan()
    if runtime is None:
        pytest.skip("needs gcc with AddressSanitizer (libasan)")
    so = tmp_path / "_native_asan.so"
    include = sysconfig.get_paths()["include"]
    build = subprocess.run(
        [
            "gcc",
            "-O1",
            "-g",
            "-fsanitize=address",
            "-fno-omit-frame-pointer",
            "-fno-trapping-math",
            "-std=c11",
            "-shared",
            "-fPIC",
            f"-I{include}",
            str(SOURCE),
            "-ljpeg",
            "-o",
            str(so),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    data = tmp_path / "cases.pkl"
    data.write_bytes(pickle.dumps(cases()))
    env = {**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"}
    run = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_asan_driver.py")), str(so), str(data)],
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "asan ok:" in run.stdout and "scan limit 256" in run.stdout, run.stdout
