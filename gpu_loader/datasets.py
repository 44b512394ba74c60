"""Synthetic photo-like image folders for tests, examples and benchmarks.

`make_image_folder` writes ``root/class_XX/img_XXXXXX.jpg|png``: images with natural-image
statistics (a smooth 1/f colour field, hard-edged shapes, mild sensor noise) so that JPEG
sizes, decode times and resize behaviour resemble real photos rather than flat colour or white
noise. Everything is a pure function of the seed: the same arguments give identical bytes.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
_GENERATOR_VERSION = 2  # bump whenever the bytes for a given seed change


MAX_SIDE = 8192
"""Largest side `make_image_folder` draws, heavy images included (``max_side`` times
``heavy_scale``'s upper end): a generated photo is built in float32 in memory, 0.8 GB at
8192 x 8192."""


@dataclass(frozen=True)
class DatasetSpec:
    """The parameters of a generated folder (what the manifest records)."""

    num_images: int = 2000
    num_classes: int = 10
    seed: int = 0
    min_side: int = 200
    max_side: int = 800
    png_fraction: float = 0.02
    gray_fraction: float = 0.02
    heavy_fraction: float = 0.0
    heavy_scale: tuple[float, float] = (3.0, 4.0)

    def __post_init__(self) -> None:
        if self.num_images < 0:
            raise ValueError(f"`num_images` must be >= 0, got {self.num_images}")
        if self.num_classes < 1:
            raise ValueError(f"`num_classes` must be >= 1, got {self.num_classes}")
        if self.seed < 0:  # numpy's seeding takes no negative numbers
            raise ValueError(f"`seed` must be >= 0, got {self.seed}")
        if not 16 <= self.min_side <= self.max_side <= MAX_SIDE:
            raise ValueError(
                f"`min_side` and `max_side` must satisfy 16 <= min_side <= max_side <= "
                f"{MAX_SIDE}, got {self.min_side} and {self.max_side}"
            )
        for name in ("png_fraction", "gray_fraction", "heavy_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be in [0, 1], got {value}")
        lo, hi = self.heavy_scale
        if not 1.0 <= lo <= hi:
            raise ValueError(
                f"`heavy_scale` must be (lo, hi) with 1 <= lo <= hi, got {self.heavy_scale}"
            )
        if self.heavy_fraction > 0 and self.max_side * hi > MAX_SIDE:
            # The cap holds for heavy images too (QA58: 8192 x 4 asked for a 13 GB image).
            raise ValueError(
                f"heavy images would be up to {round(self.max_side * hi)} px a side "
                f"(max_side {self.max_side} x heavy_scale {hi:g}), over {MAX_SIDE}: a "
                "generated photo is built in float32 in memory; lower max_side"
            )


def make_image_folder(
    root: str | Path,
    *,
    num_images: int = 2000,
    num_classes: int = 10,
    seed: int = 0,
    min_side: int = 200,
    max_side: int = 800,
    png_fraction: float = 0.02,
    gray_fraction: float = 0.02,
    heavy_fraction: float = 0.0,
    heavy_scale: tuple[float, float] = (3, 4),
    progress: bool = False,
) -> Path:
    """Write a deterministic ImageFolder of photo-like images under ``root`` and return it.

    Image ``i`` goes to class ``i % num_classes``. Sides are drawn from
    ``[min_side, max_side]``; a ``heavy_fraction`` of the images get their sides multiplied by
    a factor from ``heavy_scale`` (stragglers for the batching benchmark). JPEG quality is
    75-95. If ``root/manifest.json`` already records the same parameters, the folder is
    reused as is (generation is deterministic, so its bytes would be identical); an earlier
    generation with other parameters is replaced (both said on stderr with ``progress``), and a
    folder holding any other file is refused. ``progress``: a bar on a terminal, else a
    line per quarter.
    """
    spec = DatasetSpec(
        num_images=num_images,
        num_classes=num_classes,
        seed=seed,
        min_side=min_side,
        max_side=max_side,
        png_fraction=png_fraction,
        gray_fraction=gray_fraction,
        heavy_fraction=heavy_fraction,
        heavy_scale=(float(heavy_scale[0]), float(heavy_scale[1])),
    )
    root = Path(root)
    if manifest_matches(root, spec):
        if progress:
            print(f"{root}: reused (it holds this dataset already)", file=sys.stderr, flush=True)
        return root
    root.mkdir(parents=True, exist_ok=True)
    earlier = _generated_files(root)  # before anything is removed: a refused folder stays
    finished = (root / MANIFEST).is_file()  # else an interrupted generation
    # Remove a stale manifest first: a half-written folder must never look complete.
    (root / MANIFEST).unlink(missing_ok=True)
    images = sum(p.suffix in (".jpg", ".png") for p in earlier)
    if progress and images:
        what = "generated dataset" if finished else "unfinished generation"
        more = "other parameters" if finished else "no manifest"
        print(
            f"{root}: replacing an earlier {what} ({images} images, {more})",
            file=sys.stderr,
            flush=True,
        )
    _clear_generated(root, earlier)
    counts = {"images": 0, "jpeg": 0, "png": 0, "gray": 0, "heavy": 0}
    for rel, data, kind in _progress(_generate(spec), spec.num_images, progress):
        path = root / rel
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        counts["images"] += 1
        for flag in kind:
            counts[flag] += 1
    manifest = {"generator": _GENERATOR_VERSION, "params": _spec_json(spec), "counts": counts}
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.replace(root / MANIFEST)
    return root


_GENERATED = re.compile(r"class_\d+/img_\d{6,}\.(jpg|png)|" + re.escape(MANIFEST) + r"(\.tmp)?")
_CLASS_FOLDER = re.compile(r"class_\d+")


def _written_here(root: Path) -> bool:
    """Whether ``root``'s manifest is one this generator wrote (any version of it)."""
    loaded = read_manifest(root)
    return loaded is not None and {"generator", "params", "counts"} <= loaded.keys()


def _generated_files(root: Path) -> list[Path]:
    """The files under ``root``, all written by this generator; refuses a folder holding
    any other file (never deleted), any folder but a class folder (an empty tree of the
    user's was deleted, QA58), or a manifest this generator did not write (QA58: a
    user's own manifest.json was overwritten)."""
    entries = list(root.rglob("*"))
    files = [p for p in entries if p.is_symlink() or not p.is_dir()]
    foreign = [p for p in files if not _GENERATED.fullmatch(p.relative_to(root).as_posix())]
    folders = [p for p in entries if p.is_dir() and not p.is_symlink()]
    foreign += [p for p in folders if p.parent != root or not _CLASS_FOLDER.fullmatch(p.name)]
    manifest = root / MANIFEST
    if manifest.is_file() and not _written_here(root):
        foreign.append(manifest)
    if foreign:
        raise ValueError(
            f"{root} holds files or folders a generated dataset does not (e.g. "
            f"{foreign[0]}); "
            "choose a new or empty folder"
        )
    return files


def _clear_generated(root: Path, files: list[Path]) -> None:
    """Remove an earlier generation's ``files`` (other parameters), so none is left behind
    in the new dataset."""
    for path in files:
        path.unlink(missing_ok=True)  # the manifest may already be gone
    for folder in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        folder.rmdir()  # the emptied class folders, deepest first


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    """The manifest of a generated folder, or None when there is none (or it is unreadable)."""
    try:
        loaded = json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def manifest_matches(root: str | Path, spec: DatasetSpec) -> bool:
    """True when ``root`` holds a complete folder generated from exactly ``spec``."""
    manifest = read_manifest(root)
    return (
        manifest is not None
        and manifest.get("generator") == _GENERATOR_VERSION
        and manifest.get("params") == _spec_json(spec)
    )


def _spec_json(spec: DatasetSpec) -> dict[str, Any]:
    # Round-trip through JSON so tuples compare equal to the lists read back from disk.
    loaded: dict[str, Any] = json.loads(json.dumps(asdict(spec)))
    return loaded


def _progress(
    items: Iterable[tuple[str, bytes, tuple[str, ...]]], total: int, enabled: bool
) -> Iterable[tuple[str, bytes, tuple[str, ...]]]:
    if not enabled:
        return items
    from gpu_loader.monitor._progress import is_terminal

    if not is_terminal(sys.stderr):
        return _progress_lines(items, total)  # a log file gets lines, not a bar's updates
    from tqdm import tqdm

    bar: Iterable[tuple[str, bytes, tuple[str, ...]]] = tqdm(
        items, total=total, desc="generating images", unit="img"
    )
    return bar


def _progress_lines(
    items: Iterable[tuple[str, bytes, tuple[str, ...]]], total: int
) -> Iterator[tuple[str, bytes, tuple[str, ...]]]:
    """One line per quarter of the work, and the last one (stderr, off a terminal)."""
    marks = {max(1, total * q // 4) for q in (1, 2, 3, 4)}
    start = time.monotonic()
    for done, item in enumerate(items, start=1):
        yield item
        if done in marks:
            elapsed = time.monotonic() - start
            print(
                f"generating images: {done}/{total} ({100 * done // max(1, total)}%, "
                f"{elapsed:.1f} s)",
                file=sys.stderr,
                flush=True,
            )


def _generate(spec: DatasetSpec) -> Iterator[tuple[str, bytes, tuple[str, ...]]]:
    width = max(2, len(str(spec.num_classes - 1)))
    for i in range(spec.num_images):
        # One generator per image: image i is the same whatever num_images is.
        rng = np.random.default_rng([spec.seed, i])
        h = int(rng.integers(spec.min_side, spec.max_side + 1))
        w = int(rng.integers(spec.min_side, spec.max_side + 1))
        kind: list[str] = []
        if rng.random() < spec.heavy_fraction:
            factor = rng.uniform(*spec.heavy_scale)
            h, w = round(h * factor), round(w * factor)
            kind.append("heavy")
        gray = bool(rng.random() < spec.gray_fraction)
        png = bool(rng.random() < spec.png_fraction)
        quality = int(rng.integers(75, 96))
        image = photo_like(h, w, rng, tint=class_tint(i % spec.num_classes, spec.num_classes))
        if gray:
            image = _to_gray(image)
            kind.append("gray")
        if png:
            data = _encode_png(image)
            kind.append("png")
        else:
            data = _encode_jpeg(image, quality, rng)
            kind.append("jpeg")
        ext = "png" if png else "jpg"
        yield f"class_{i % spec.num_classes:0{width}d}/img_{i:06d}.{ext}", data, tuple(kind)


def class_tint(label: int, num_classes: int) -> tuple[float, float, float]:
    """The base colour of class ``label``: hues spread evenly round the colour wheel.

    It gives each class a learnable cue (the colour cast survives crops and flips), so a
    small network trained on a generated folder really learns; see
    examples/train_classifier.py.
    """
    import colorsys

    r, g, b = colorsys.hsv_to_rgb(label / max(1, num_classes), 0.55, 0.75)
    return (r * 255, g * 255, b * 255)


def photo_like(
    height: int,
    width: int,
    rng: np.random.Generator,
    tint: tuple[float, float, float] | None = None,
) -> np.ndarray:
    """An HWC uint8 RGB image with photo-like statistics, drawn from ``rng``.

    ``tint`` sets the base colour (jittered); without it the base colour is random.
    """
    import cv2

    longest = max(height, width)
    field: np.ndarray = np.empty((height, width, 3), np.float32)
    base = rng.uniform(40, 215, size=3)
    if tint is not None:
        base = np.asarray(tint) + rng.uniform(-20, 20, size=3)
    field[:] = base.astype(np.float32)
    # Coarse octaves (illumination, background), then objects, then fine octaves on top so
    # that objects carry texture too instead of being flat fills.
    amplitude = _add_octaves(field, rng, cells=2, max_cells=longest / 32, amplitude=60.0)
    _draw_shapes(field, rng)
    _add_octaves(field, rng, cells=32, max_cells=longest / 4, amplitude=amplitude)
    # Slight optical blur so edges span ~1-2 pixels, as in camera images.
    field = cv2.GaussianBlur(field, (0, 0), float(rng.uniform(0.5, 1.2)))
    # Mild sensor noise, generated at half resolution (real noise is spatially correlated
    # after demosaicing), which also keeps generation fast.
    nh, nw = (height + 1) // 2, (width + 1) // 2
    noise = rng.standard_normal((nh, nw, 3), dtype=np.float32) * float(rng.uniform(2.0, 5.0))
    np.add(field, cv2.resize(noise, (width, height), interpolation=cv2.INTER_LINEAR), out=field)
    return np.clip(field, 0, 255).astype(np.uint8)


def _add_octaves(
    field: np.ndarray, rng: np.random.Generator, *, cells: int, max_cells: float, amplitude: float
) -> float:
    """Add upsampled noise octaves (amplitude falling ~1/f); return the next amplitude."""
    import cv2

    height, width = field.shape[:2]
    longest = max(height, width)
    while cells <= max(max_cells, 2):
        ch = max(2, round(cells * height / longest))
        cw = max(2, round(cells * width / longest))
        coarse = rng.standard_normal((ch, cw, 3), dtype=np.float32)
        # Colour octaves are correlated across channels, like real illumination.
        coarse = coarse * 0.5 + coarse.mean(axis=2, keepdims=True) * 0.5
        field += cv2.resize(coarse * amplitude, (width, height), interpolation=cv2.INTER_CUBIC)
        cells *= 2
        # Slightly slower than 1/f so JPEG sizes land near real photos' at these qualities.
        amplitude *= 0.6
    return amplitude


def _draw_shapes(field: np.ndarray, rng: np.random.Generator) -> None:
    import cv2

    height, width = field.shape[:2]
    scale = min(height, width)
    for _ in range(int(rng.integers(4, 14))):
        colour = tuple(float(c) for c in rng.uniform(0, 255, size=3))
        cx, cy = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = max(2, int(scale * rng.uniform(0.03, 0.35)))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            axes = (size, max(1, int(size * rng.uniform(0.3, 1.0))))
            angle = float(rng.uniform(0, 180))
            cv2.ellipse(field, (cx, cy), axes, angle, 0, 360, colour, -1, cv2.LINE_AA)
        elif kind == 1:
            pts = rng.integers(-size, size, size=(int(rng.integers(3, 7)), 2)) + np.array([cx, cy])
            cv2.fillPoly(field, [pts.astype(np.int32)], colour, cv2.LINE_AA)
        else:
            end = (cx + int(rng.integers(-size, size)), cy + int(rng.integers(-size, size)))
            thickness = max(1, int(size * rng.uniform(0.02, 0.15)))
            cv2.line(field, (cx, cy), end, colour, thickness, cv2.LINE_AA)


def _to_gray(image: np.ndarray) -> np.ndarray:
    import cv2

    gray: np.ndarray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    return gray


def _encode_jpeg(image: np.ndarray, quality: int, rng: np.random.Generator) -> bytes:
    import simplejpeg

    if image.ndim == 2:
        data = simplejpeg.encode_jpeg(image[:, :, None], quality=quality, colorspace="GRAY")
    else:
        # Most camera JPEGs are 4:2:0; some are 4:4:4.
        sub = "420" if rng.random() < 0.8 else "444"
        data = simplejpeg.encode_jpeg(
            image, quality=quality, colorspace="RGB", colorsubsampling=sub
        )
    return bytes(data)


def _encode_png(image: np.ndarray) -> bytes:
    import cv2

    bgr = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise RuntimeError(f"OpenCV failed to encode a PNG of shape {image.shape}")
    return buf.tobytes()
