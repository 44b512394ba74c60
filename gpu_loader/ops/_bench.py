"""Per-stage CPU time of the per-sample path: ``python -m gpu_loader.ops._bench [N]``.

Generates ~450x450 photo-like JPEGs and times each stage of `load_into` separately on one
thread (CPU seconds, so other load on the machine inflates the numbers less than wall time),
on both CPU backends when the native one is built.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpu_loader.datasets import make_image_folder
from gpu_loader.ops._backend import CpuBackend, cpu_backend, forced
from gpu_loader.ops._decode import DEFAULT_MAX_PIXELS, DecodedImage, decode_at, probe_size
from gpu_loader.ops._load import dct_factor_for, load_into
from gpu_loader.ops._transform import resize_box, transform_into
from gpu_loader.ops._transforms import CropParams, EvalTransform, TrainTransform

_OUT = {"float32": np.float32, "float16": np.float16, "bfloat16": np.int16, "uint8": np.uint8}


def _per_item_ms(fn: Callable[[int], object], n: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for i in range(n):
            fn(i)
        best = min(best, (time.process_time() - start) / n * 1e3)
    return best


def stage_times(datas: list[bytes], transform: TrainTransform | EvalTransform) -> dict[str, float]:
    """Milliseconds of CPU per image for each stage (best of 3 passes)."""
    n = len(datas)
    out_size = transform.output_size
    sizes: list[tuple[int, int]] = []
    params: list[CropParams] = []
    images: list[DecodedImage] = []

    for i, data in enumerate(datas):
        size = probe_size(data)
        if size is None:
            raise ValueError("the benchmark expects JPEGs")
        sizes.append(size)
        params.append(transform.make_params(*size, np.random.default_rng(i)))
    factors = [dct_factor_for(p, out_size, *s) for p, s in zip(params, sizes, strict=True)]
    images = [
        decode_at(d, key="", max_pixels=DEFAULT_MAX_PIXELS, factor=k)
        for d, k in zip(datas, factors, strict=True)
    ]
    scaled = [im.box(p) for p, im in zip(params, images, strict=True)]
    rng = np.random.default_rng(0)
    result = {
        "probe_size": _per_item_ms(lambda i: probe_size(datas[i]), n),
        "make_params": _per_item_ms(lambda i: transform.make_params(*sizes[i], rng), n),
        "decode (simplejpeg, whole image)": _per_item_ms(
            lambda i: decode_at(datas[i], key="", max_pixels=DEFAULT_MAX_PIXELS, factor=factors[i]),
            n,
        ),
    }
    result["resize (Pillow, box)"] = _per_item_ms(
        lambda i: resize_box(images[i], scaled[i], out_size), n
    )
    backends: list[CpuBackend] = ["native", "pillow"] if cpu_backend() == "native" else ["pillow"]
    for backend in backends:
        with forced(backend):
            for dtype, np_dtype in _OUT.items():
                out = np.empty((3, *out_size), np_dtype)
                result[f"transform_into[{dtype}] {backend}"] = _per_item_ms(
                    lambda i, o=out, d=dtype: transform_into(  # type: ignore[misc]
                        images[i], scaled[i], o, mean=transform.mean, std=transform.std, dtype=d
                    ),
                    n,
                )
            out = np.empty((3, *out_size), np.float32)
            result[f"load_into[float32] {backend}"] = _per_item_ms(
                lambda i, o=out: load_into(  # type: ignore[misc]
                    datas[i], transform, np.random.default_rng(i), o, dtype="float32"
                ),
                n,
            )
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    count = int(args[0]) if args else 300
    with tempfile.TemporaryDirectory() as tmp:
        root = make_image_folder(
            Path(tmp),
            num_images=count,
            min_side=350,
            max_side=550,
            png_fraction=0,
            gray_fraction=0,
        )
        datas = [p.read_bytes() for p in sorted(root.rglob("*.jpg"))]
    mean_px = np.mean([probe_size(d) or (0, 0) for d in datas], axis=0)
    print(
        f"{len(datas)} JPEGs, mean {mean_px[0]:.0f}x{mean_px[1]:.0f}, "
        f"{np.mean([len(d) for d in datas]) / 1e3:.0f} KB; CPU ms per image, one thread"
    )
    for transform in (TrainTransform(224), EvalTransform(224)):
        print(f"\n{type(transform).__name__}(224)")
        for name, ms in stage_times(datas, transform).items():
            print(f"  {name:34s} {ms:6.3f}")


if __name__ == "__main__":
    main()
