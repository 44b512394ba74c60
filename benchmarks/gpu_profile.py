"""Where the GPU path's time goes: decoders alone, one worker's batch, the kernel, threads.

Four sections, on the generated photos of ``gpu_vs_cpu.py`` (RandomResizedCrop 224,
float32, batches of 64), each printed as a table and kept in one JSON:

- ``decode``: ``NvImageCodecDecoder`` alone, one call per batch and the stream
  synchronised after it, by backends, CPU threads per decoder, concurrent decoders and
  batch size (after two warm-up batches per decoder);
- ``stage``: one ``GpuBatchStage`` worker fed from memory (samples fetched beforehand),
  milliseconds per batch and per step (decode call, collect/uploads, launch);
- ``kernel``: the fused kernel on one decoded batch, CUDA events over 20 launches;
- ``sweep``: the fetch -> stage pipeline by fetch threads and workers, over ``--passes``
  passes with the first left out of the timing (it pays for the decoders' creation),
  with the median time of one decode call in the pipeline (``--switch-interval``
  changes the GIL switch interval for it).

The first GPU session measured the same things with scratch scripts; this file makes
them one command, and it ran on an H100 in the second (docs/gpu.md, "Measured on an
H100"). Without a usable CUDA device it says so and exits 0 (nothing written).

    python benchmarks/gpu_profile.py                 # all sections, ~2 min on an H100
    python benchmarks/gpu_profile.py --sections decode sweep
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `gpu_loader.benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_loader.benchmarks._common import add_out_argument, format_table, write_results

BATCH = 64
SECTIONS = ("decode", "stage", "kernel", "sweep")
# (label, backends, CPU threads per decoder, concurrent decoders, batch size)
DECODE_CONFIGS: tuple[tuple[str, tuple[str, ...], int, int, int], ...] = (
    ("hardware", ("hw_gpu",), 4, 1, BATCH),
    ("hardware x2", ("hw_gpu",), 4, 2, BATCH),
    ("hardware, batch 256", ("hw_gpu",), 4, 1, 256),
    ("hardware + cuda (default)", ("hw_gpu", "gpu"), 4, 1, BATCH),
    ("hardware + cuda x2 (default)", ("hw_gpu", "gpu"), 4, 2, BATCH),
    ("hardware + cuda, 16 threads", ("hw_gpu", "gpu"), 16, 1, BATCH),
    ("hybrid x4", ("hybrid",), 4, 4, BATCH),
)
SWEEP: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2), (8, 2), (8, 4), (16, 4))


def _blobs(data: Path, count: int) -> list[memoryview]:
    import numpy as np

    files = sorted(p for p in data.rglob("*.jpg"))[:count]
    return [memoryview(np.fromfile(f, np.uint8)) for f in files]


def profile_decode(data: Path) -> list[dict[str, Any]]:
    """Images/s of the decoders alone, per configuration in DECODE_CONFIGS."""
    from gpu_loader.cuda import NvImageCodecDecoder

    blobs = _blobs(data, 512)
    rows = []
    for label, backends, threads, decoders, batch in DECODE_CONFIGS:
        row: dict[str, Any] = {"config": label, "decoders": decoders, "cpu_threads": threads}
        try:
            made = [
                NvImageCodecDecoder(device_id=0, backends=backends, max_cpu_threads=threads)  # type: ignore[arg-type]
                for _ in range(decoders)
            ]
            chunks = [blobs[i : i + batch] for i in range(0, len(blobs), batch)]
            ok, wall = _decode_concurrently(made, chunks)
        except Exception as exc:  # e.g. GPU_ONLY alone on nvImageCodec 0.9: "Code: 7"
            rows.append({**row, "error": f"{type(exc).__name__}: {exc}"})
            continue
        total = decoders * 2 * len(blobs)
        rows.append({**row, "img_per_s": ok / wall, "decoded": f"{ok}/{total}"})
    return rows


def _decode_concurrently(decoders: list[Any], chunks: list[list[memoryview]]) -> tuple[int, float]:
    """Each decoder in its own thread decodes every chunk twice; (images decoded, seconds)."""
    import torch

    barrier = threading.Barrier(len(decoders) + 1, timeout=120)
    done: list[int] = []
    errors: list[BaseException] = []

    def work(decoder: Any) -> None:
        try:
            stream = torch.cuda.Stream()
            for chunk in chunks[:2]:  # warm-up
                decoder.decode(chunk, stream)
                stream.synchronize()
            barrier.wait()
            ok = 0
            for chunk in chunks * 2:
                images = decoder.decode(chunk, stream)
                stream.synchronize()
                ok += sum(im is not None for im in images)
            done.append(ok)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(d,)) for d in decoders]
    for w in workers:
        w.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return sum(done), time.perf_counter() - t0


def _fetch_samples(data: Path, count: int) -> tuple[Any, Any, Any, list[Any]]:
    from gpu_loader.cuda import GpuFetcher, PinnedArena, cuda_ports
    from gpu_loader.ops import TrainTransform
    from gpu_loader.sources import ImageFolder

    source = ImageFolder(data)
    transform = TrainTransform(224)
    ports = cuda_ports("cuda")
    arena = PinnedArena(512 << 20, allocator=ports.runtime.alloc_pinned)
    pixels = PinnedArena(128 << 20, allocator=ports.runtime.alloc_pinned, lazy=True)
    fetcher = GpuFetcher(source, arena, transform, seed=0, epoch=0, pixel_arena=pixels)
    samples = [fetcher.fetch(p, p) for p in range(min(count, len(source)))]
    return source, transform, ports, samples


def profile_stage(data: Path, batches: int = 8) -> list[dict[str, Any]]:
    """One worker's milliseconds per batch, split by step (samples fetched beforehand)."""
    import torch

    from gpu_loader.cuda import GpuBatchStage

    source, transform, ports, samples = _fetch_samples(data, BATCH * (batches + 2))
    stage = GpuBatchStage(ports, transform, source.labels, dtype="float32")
    spent: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return call

    stage._decode_jpegs = timed("decode call", stage._decode_jpegs)  # type: ignore[method-assign]
    stage._collect = timed("collect + uploads", stage._collect)  # type: ignore[method-assign]
    stage._launch = timed("output + kernel launch + labels", stage._launch)  # type: ignore[method-assign]
    state = stage.worker_init()
    chunks = [samples[i : i + BATCH] for i in range(0, len(samples), BATCH)]
    if len(chunks) < 3:
        raise ValueError(f"the stage section needs at least {3 * BATCH} images in --data")
    for chunk in chunks[:2]:  # warm-up: kernel build, first decodes
        stage(chunk, state)
    torch.cuda.synchronize()
    spent.clear()
    t0 = time.perf_counter()
    for chunk in chunks[2:]:
        stage(chunk, state)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    n = len(chunks) - 2
    rows = [{"what": "whole batch", "ms": 1e3 * wall / n, "img_per_s": BATCH * n / wall}]
    rows += [{"what": k, "ms": 1e3 * v / n} for k, v in spent.items()]
    # The rest is mostly the wait for the decode on the device before the arena slices go.
    rows.append({"what": "the rest (device waits)", "ms": 1e3 * (wall - sum(spent.values())) / n})
    return rows


def profile_kernel(data: Path) -> list[dict[str, Any]]:
    """The fused kernel on one decoded batch: CUDA events over 20 launches."""
    import numpy as np
    import torch

    from gpu_loader.cuda._fused import launch_fused

    _, transform, ports, samples = _fetch_samples(data, BATCH)
    jpegs = [s for s in samples if s.size is not None]
    decoder = ports.make_decoder()
    stream = torch.cuda.Stream()
    images = decoder.decode([s.data for s in jpegs], stream)
    stream.synchronize()
    kept = [(s, im) for s, im in zip(jpegs, images, strict=True) if im is not None]
    refs = [im.ref for _, im in kept]
    boxes = np.asarray(
        [(s.params.top, s.params.left, s.params.height, s.params.width) for s, _ in kept]
    )
    flips = np.asarray([s.params.flip for s, _ in kept])
    out = torch.empty((len(refs), 3, 224, 224), device="cuda")

    def launch() -> None:
        launch_fused(refs, boxes, flips, out.data_ptr(), 224, 224, transform.mean, transform.std,
                     "float32", stream)  # fmt: skip

    for _ in range(3):
        launch()
    stream.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    t0 = time.perf_counter()
    for _ in range(20):
        launch()
    host_ms = 1e3 * (time.perf_counter() - t0) / 20
    end.record(stream)
    stream.synchronize()
    pixels = sum(float(s.params.height * s.params.width) for s, _ in kept)
    moved = 3 * pixels + out.numel() * out.element_size()  # crop boxes read once + output
    return [
        {
            "images": len(refs),
            "device_ms": start.elapsed_time(end) / 20,
            "host_ms": host_ms,
            "bytes_mb": moved / 1e6,
            "bound_ms_at_3tbps": 1e3 * moved / 3e12,
        }
    ]


class TimedDecoder:
    """A batch decoder that records how long each ``decode`` call takes (in ``calls_s``).

    In the second H100 session the decode call took 7.9 ms alone and 28-69 ms with fetch
    threads running beside it; the sweep reports this median so that the effect of a
    change on the call itself is visible next to the throughput.
    """

    def __init__(self, inner: Any, calls_s: list[float]) -> None:
        self.inner = inner
        self.calls_s = calls_s

    def decode(
        self, blobs: Sequence[memoryview], stream: Any, exif_orientation: bool = True
    ) -> list[Any]:
        t0 = time.perf_counter()
        try:
            # As the stage passes it: by keyword, and only when not the default.
            flag = {} if exif_orientation else {"exif_orientation": False}
            images: list[Any] = self.inner.decode(blobs, stream, **flag)
            return images
        finally:
            self.calls_s.append(time.perf_counter() - t0)  # list.append is thread-safe


def timed_ports(ports: Any, calls_s: list[float]) -> Any:
    """``ports`` whose decoders are wrapped in :class:`TimedDecoder`."""
    import dataclasses

    return dataclasses.replace(
        ports, make_decoder=lambda: TimedDecoder(ports.make_decoder(), calls_s)
    )


def profile_sweep(
    data: Path, passes: int, switch_interval: float | None = None
) -> list[dict[str, Any]]:
    """The fetch -> stage pipeline by (fetch threads, workers), passes after the first.

    ``switch_interval``: ``sys.setswitchinterval`` for the sweep (restored after it).
    """
    import statistics

    from gpu_loader.benchmarks.gpu_vs_cpu import iter_stage_cuda, time_after_first_pass

    from gpu_loader.cuda import cuda_ports

    rows = []
    before = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    try:
        for fetch_threads, workers in SWEEP:
            calls_s: list[float] = []
            ports = timed_ports(cuda_ports("cuda"), calls_s)
            batches = iter_stage_cuda(data, max(2, passes), fetch_threads, workers, ports=ports)
            result = time_after_first_pass(batches, data)
            median_ms = 1e3 * statistics.median(calls_s) if calls_s else None
            rows.append(
                {
                    "fetch_threads": fetch_threads,
                    "workers": workers,
                    **result,
                    "decode_call_ms": median_ms,
                    "switch_interval_s": sys.getswitchinterval(),
                }
            )
            print(f"  sweep {fetch_threads}x{workers}: {result['img_per_s']:.0f} img/s", flush=True)
    finally:
        sys.setswitchinterval(before)
    return rows


TABLES: dict[str, Sequence[tuple[str, str]]] = {
    "decode": (("config", "decoders"), ("decoders", "n"), ("cpu_threads", "CPU threads"),
               ("img_per_s", "img/s"), ("decoded", "decoded"), ("error", "error")),
    "stage": (("what", "one worker"), ("ms", "ms per batch"), ("img_per_s", "img/s")),
    "kernel": (("images", "images"), ("device_ms", "device ms"), ("host_ms", "host ms"),
               ("bytes_mb", "MB moved"), ("bound_ms_at_3tbps", "bound ms")),
    "sweep": (("fetch_threads", "fetch threads"), ("workers", "workers"),
              ("img_per_s", "img/s"), ("decode_call_ms", "decode call ms (median)"),
              ("gpu_util", "GPU util %")),
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="image folder (default: generated photos)")
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=3, help="sweep passes; the first untimed")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for the sweep, in seconds (default: Python's, 0.005)",
    )
    add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="1000 images, 2 sweep passes")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_images, args.passes = 1000, 2
    if args.switch_interval is not None and not args.switch_interval > 0:
        parser.error(f"--switch-interval must be > 0 seconds, got {args.switch_interval}")

    from gpu_loader.cuda import cuda_available

    if not cuda_available():
        print("gpu_profile needs a usable CUDA GPU and none is visible here; nothing measured.")
        return 0
    from gpu_loader.benchmarks.cpu_loaders import ensure_dataset

    data = ensure_dataset(args.data, args.num_images)
    runs: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "decode": lambda: profile_decode(data),
        "stage": lambda: profile_stage(data),
        "kernel": lambda: profile_kernel(data),
        "sweep": lambda: profile_sweep(data, args.passes, args.switch_interval),
    }
    results: dict[str, Any] = {}
    for section in args.sections:
        print(f"[{section}] ...", file=sys.stderr, flush=True)
        results[section] = runs[section]()
        print(f"\n{section}\n{format_table(results[section], TABLES[section])}", flush=True)
    path = write_results("gpu_profile", {"batch_size": BATCH, **results}, args.out)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
