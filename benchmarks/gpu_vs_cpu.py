"""GPU decode vs CPU decode + copy vs DALI's GPU pipeline: img/s and NVML GPU utilisation.

Systems, each in its own process, on the same generated photos (RandomResizedCrop 224,
flip, normalise, float32, batch 64). Each runs ``--epochs`` passes over the data and only
the passes after the first are timed: the first pays for start-up (CUDA context, kernel
build, one nvImageCodec decoder per worker: about a second on an H100), which a
few-second run would otherwise mostly measure.

- ``stage_cuda``: gpu_loader's GPU batch stage built directly (pinned arena fetch ->
  nvImageCodec batch decode on per-thread streams -> fused kernel -> hand-off);
- ``loader_cuda``: ``ImageLoader(device="cuda")`` as the loader currently wires it;
- ``loader_cpu_h2d``: ``ImageLoader(device="cpu")`` with ``pin_memory=True`` +
  ``.to("cuda", non_blocking=True)``;
- ``dali_gpu``: DALI with ``fn.decoders.image(device="mixed")`` and GPU resize/normalise.

Without a usable CUDA device it prints that it needs one and exits 0 (nothing written).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_loader.benchmarks._common import (
    BENCH_EXTRA_HINT,
    add_out_argument,
    format_table,
    run_worker,
    write_results,
)

BATCH = 64
SIZE = 224
SYSTEMS = ("stage_cuda", "loader_cuda", "loader_cpu_h2d", "dali_gpu")


class NvmlUtilisation:
    """Samples NVML's GPU utilisation (percent of time a kernel ran) every 100 ms."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-util", daemon=True)

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:  # no NVML: the row says "-" for utilisation
            return
        while not self._stop.wait(0.1):
            self.samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

    def __enter__(self) -> NvmlUtilisation:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


# ------------------------------------------------------------------ systems (worker side)
def _transform() -> Any:
    from gpu_loader.ops import TrainTransform

    return TrainTransform(SIZE)


@dataclass
class _Task:
    position: int
    index: int
    key: str


def iter_stage_cuda(
    data: Path, epochs: int, fetch_threads: int = 8, workers: int = 2, ports: Any = None
) -> Iterator[tuple[Any, Any]]:
    """``ports``: the device ports (default ``cuda_ports("cuda")``; gpu_profile wraps them)."""
    import numpy as np

    from gpu_loader.cuda import GpuBatchStage, GpuFetcher, PinnedArena, cuda_ports, handoff
    from gpu_loader.pipeline import PipelineBuilder
    from gpu_loader.sources import ImageFolder

    source = ImageFolder(data)
    ports = ports or cuda_ports("cuda")
    transform = _transform()
    arena = PinnedArena(256 << 20, allocator=ports.runtime.alloc_pinned)
    pixels = PinnedArena(64 << 20, allocator=ports.runtime.alloc_pinned, lazy=True)  # as the loader
    stop = threading.Event()
    fetcher = GpuFetcher(
        source, arena, transform, seed=0, epoch=0, stop_event=stop, pixel_arena=pixels
    )
    stage = GpuBatchStage(ports, transform, source.labels, dtype="float32")
    rng = np.random.default_rng(0)
    orders = (rng.permutation(len(source)) for _ in range(epochs))
    tasks = (_Task(p, int(i), source.key(int(i))) for o in orders for p, i in enumerate(o))
    pipeline = (
        PipelineBuilder()
        .add_source(tasks)
        .pipe(fetcher, concurrency=fetch_threads, name="fetch", output_order="completion")
        .aggregate(BATCH)
        .pipe(stage, concurrency=workers, name="gpu_batch", worker_init=stage.worker_init)
        .add_sink(buffer_size=3)
        .build()
    )
    try:
        with pipeline:
            for batch in pipeline:
                yield handoff(batch)
    finally:
        stop.set()


def iter_loader(device: str) -> Callable[[Path, int], Iterator[tuple[Any, Any]]]:
    def run(data: Path, epochs: int) -> Iterator[tuple[Any, Any]]:
        import gpu_loader as gl

        loader = gl.ImageLoader(
            gl.sources.ImageFolder(data),
            batch_size=BATCH,
            transform=_transform(),
            device=device,
            dtype="float32",
            options=gl.LoaderOptions(pin_memory=True) if device == "cpu" else None,
        )
        with loader:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for images, labels in loader:
                    if device == "cpu":  # the copy the training loop would make
                        images = images.to("cuda", non_blocking=True)
                        labels = labels.to("cuda", non_blocking=True)
                    yield images, labels

    return run


def iter_dali(data: Path, epochs: int) -> Iterator[tuple[Any, Any]]:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    files = sorted(str(p) for p in data.rglob("*") if p.suffix in (".jpg", ".png"))
    classes = sorted({Path(f).parent.name for f in files})
    labels = [classes.index(Path(f).parent.name) for f in files]
    t = _transform()

    @pipeline_def(batch_size=BATCH, num_threads=4, device_id=0, seed=0)  # type: ignore[untyped-decorator]
    def pipe() -> Any:
        jpegs, label = fn.readers.file(files=files, labels=labels, random_shuffle=True, name="r")
        images = fn.decoders.image_random_crop(
            jpegs, device="mixed", output_type=types.RGB, random_area=[0.08, 1.0]
        )
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True)
        images = fn.crop_mirror_normalize(
            images,
            mirror=fn.random.coin_flip(probability=0.5),
            mean=[255 * m for m in t.mean],
            std=[255 * s for s in t.std],
            output_layout="CHW",
            dtype=types.FLOAT,
        )
        return images, label.gpu()

    loader = DALIGenericIterator(pipe(), ["images", "labels"], reader_name="r")
    for _ in range(epochs):
        for out in loader:
            yield out[0]["images"], out[0]["labels"]
        loader.reset()


RUNNERS: dict[str, Callable[[Path, int], Iterable[tuple[Any, Any]]]] = {
    "stage_cuda": iter_stage_cuda,
    "loader_cuda": iter_loader("cuda"),
    "loader_cpu_h2d": iter_loader("cpu"),
    "dali_gpu": iter_dali,
}


def measure(system: str, data: Path, epochs: int) -> dict[str, Any]:
    """img/s and mean GPU utilisation over the passes after the first."""
    return time_after_first_pass(RUNNERS[system](data, max(2, epochs)), data)


def time_after_first_pass(batches: Iterable[tuple[Any, Any]], data: Path) -> dict[str, Any]:
    """Consume ``batches`` (several passes over ``data``); time those after the first."""
    import torch

    from gpu_loader.sources import ImageFolder

    warmup = len(ImageFolder(data))  # images in the first pass (its last batch may be short)
    seen = images = 0
    t0 = 0.0
    iterator = iter(batches)
    with NvmlUtilisation() as util:
        for batch, _ in iterator:
            n = int(batch.shape[0])
            if seen < warmup <= seen + n:  # the first pass ends with this batch
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                util.samples.clear()
            elif seen >= warmup:
                images += n
            seen += n
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    return {"images": images, "wall_s": wall, "img_per_s": images / wall, "gpu_util": util.mean()}


# ------------------------------------------------------------------ the parent process
def available(system: str) -> str | None:
    from gpu_loader._optional import is_importable

    if system == "dali_gpu" and not is_importable("nvidia.dali"):
        return f"nvidia-dali-cuda120 is not installed ({BENCH_EXTRA_HINT})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="image folder (default: generated photos)")
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    add_out_argument(parser)
    parser.add_argument(
        "--epochs", type=int, default=3, help="passes; the first is warm-up (default: 3)"
    )
    parser.add_argument("--quick", action="store_true", help="1000 images")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from gpu_loader.cuda import cuda_available

    if not cuda_available():
        print("gpu_vs_cpu needs a usable CUDA GPU and none is visible here; nothing measured.")
        return 0
    if args.worker:
        import json

        print(json.dumps(measure(args.worker, args.data, args.epochs)))
        return 0

    from gpu_loader.benchmarks.cpu_loaders import ensure_dataset  # the same data recipe

    data = ensure_dataset(args.data, 1000 if args.quick else args.num_images)
    rows = []
    for system in [s.strip() for s in args.systems.split(",") if s.strip()]:
        why = available(system)
        if why is not None:
            print(f"[skip] {system}: {why}", file=sys.stderr)
            continue
        print(f"[run] {system} ...", file=sys.stderr, flush=True)
        argv_w = [
            "-m", "gpu_loader.benchmarks.gpu_vs_cpu", "--worker", system, "--data", str(data),
            "--epochs", str(args.epochs),
        ]  # fmt: skip
        result, pss = run_worker(argv_w)
        rows.append({"system": system, "peak_pss_mb": pss, **result})
    base = next((r for r in rows if r["system"] == "loader_cpu_h2d" and "img_per_s" in r), None)
    for row in rows:
        if base is not None and "img_per_s" in row:
            row["vs_cpu_h2d"] = row["img_per_s"] / base["img_per_s"]
    columns = [
        ("system", "system"),
        ("img_per_s", "img/s"),
        ("vs_cpu_h2d", "vs CPU loader + copy"),
        ("gpu_util", "GPU util %"),
        ("peak_pss_mb", "peak PSS MB"),
        ("error", "error"),
    ]
    print(format_table(rows, columns))
    settings = {"batch_size": BATCH, "size": SIZE, "epochs": args.epochs, "timed": "passes 2.."}
    path = write_results("gpu_vs_cpu", {**settings, "rows": rows}, args.out)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
