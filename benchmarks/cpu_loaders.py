"""CPU image loaders side by side: gpu_loader vs DataLoader, SPDL and DALI (issue 5).

Every system decodes the same generated JPEG folder, applies the same transform
(TrainTransform: RandomResizedCrop + flip + normalize; EvalTransform: resize shorter side
+ centre crop + normalize) and yields float32 ``[B, 3, 224, 224]`` torch batches. Each
system runs in its own process; the parent samples its process tree's PSS. Throughput and
CPU time are measured after a short warm-up (worker start-up is excluded for everyone).

    python benchmarks/cpu_loaders.py                 # 2000 images, train and eval, 3 rounds
    python benchmarks/cpu_loaders.py --quick         # a smoke run (704 images, 8 timed batches)
    python benchmarks/cpu_loaders.py --sides 32,64 --size 32 --batch-size 256 --num-images 20000
                                                     # tiny images to a tiny output

``--size`` (output side), ``--batch-size`` and ``--sides`` (the generated images' side range)
change the workload for every system alike; a run off the defaults writes
``cpu_loaders-<size>px-b<batch>.json`` rather than the main table's file.

The peers get as many worker processes or threads as the machine has CPUs (``--peer-workers``;
DataLoader+Pillow also at twice that), as gpu_loader's automatic threads do: on 2 CPUs the
system names read ``dataloader_pillow_w2``, on 16 ``dataloader_pillow_w16``. Ratios are
taken against DataLoader+Pillow at that worker count.

Results: ``benchmarks/results/cpu_loaders.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `gpu_loader.benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_loader.benchmarks._common import (
    BENCH_EXTRA_HINT,
    Timer,
    add_out_argument,
    format_table,
    run_worker,
    write_results,
)

BATCH = 64
SIZE = 224
RESIZE = 256
SIDES = (200, 800)  # the generated images' side range (make_image_folder's default)
DEFAULT_WORKLOAD = (SIZE, BATCH, SIDES)  # the main table's (`set_workload` changes SIZE, BATCH)
WARMUP_BATCHES = 3
MIN_TIMED_BATCHES = 5  # fewer is one batch's noise (or only a short last batch), not a rate
QUICK_IMAGES = (WARMUP_BATCHES + 8) * BATCH


def systems(n: int) -> dict[str, str]:
    """System name -> description, the peers at ``n`` workers or threads."""
    return {
        "gpu_loader": "gpu_loader ImageLoader(device='cpu'), auto threads",
        "gpu_loader_per_sample": "the same with LoaderOptions(samples_per_task=1): one sample "
        "per engine call (the default takes runs of consecutive samples)",
        f"dataloader_pillow_w{n}": f"torch DataLoader, Pillow decode+resize, {n} workers",
        f"dataloader_pillow_w{2 * n}": f"torch DataLoader, Pillow decode+resize, {2 * n} workers",
        f"dataloader_fast_w{n}": "torch DataLoader running gpu_loader's per-sample path "
        f"(ops.load_into), {n} workers",
        "spdl_io": f"SPDL 0.8 pipeline, spdl.io (FFmpeg) decode+crop+scale, {n} threads",
        "spdl_fast": "SPDL 0.8 pipeline running gpu_loader's per-sample path (ops.load_into), "
        f"{n} threads",
        "spdl_simplejpeg": "SPDL 0.8 pipeline, simplejpeg decode + Pillow resize per image "
        f"(gpu_loader's pillow backend), {n} threads",
        "dali_cpu": f"DALI CPU pipeline (device_id=None), {n} threads",
    }


def baseline(n: int) -> str:
    """The system every ratio is taken against: DataLoader+Pillow at ``n`` workers."""
    return f"dataloader_pillow_w{n}"


# ---------------------------------------------------------------- shared sample logic
def make_transform(kind: str) -> Any:
    from gpu_loader.ops import EvalTransform, TrainTransform

    if kind == "train":
        return TrainTransform(SIZE)
    return EvalTransform(SIZE, resize=RESIZE)


def list_files(data: Path) -> tuple[list[str], list[int]]:
    from gpu_loader.sources import ImageFolder

    index = ImageFolder(data)
    return [index.key(i) for i in range(len(index))], [index.label(i) for i in range(len(index))]


def normalize_hwc(arr: Any, mean: Any, std: Any) -> Any:
    """uint8 HWC -> float32 CHW torch tensor, (x/255 - mean)/std (what a peer pipeline does)."""
    import numpy as np
    import torch

    out = (arr.astype(np.float32) / 255.0 - mean) / std
    return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))


class PillowSample:
    """The torchvision-style per-sample path: Pillow decode, crop box resize, flip, normalize."""

    def __init__(self, files: list[str], labels: list[int], kind: str) -> None:
        import numpy as np

        self.files, self.labels, self.transform = files, labels, make_transform(kind)
        self.mean = np.asarray(self.transform.mean, np.float32)
        self.std = np.asarray(self.transform.std, np.float32)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        from PIL import Image, ImageOps

        from gpu_loader.sources import sample_stream

        with Image.open(self.files[i]) as im:
            img = ImageOps.exif_transpose(im).convert("RGB")
        p = self.transform.make_params(img.height, img.width, sample_stream(0, 0, i))
        box = (p.left, p.top, p.left + p.width, p.top + p.height)
        out_h, out_w = self.transform.output_size
        img = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box)
        if p.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return normalize_hwc(np.asarray(img), self.mean, self.std), self.labels[i]


class FastSample:
    """gpu_loader's own per-sample CPU path (ops.load_into: the native backend when built)."""

    def __init__(self, files: list[str], labels: list[int], kind: str) -> None:
        self.files, self.labels, self.transform = files, labels, make_transform(kind)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        import torch

        from gpu_loader.ops import load_into
        from gpu_loader.sources import sample_stream

        out_h, out_w = self.transform.output_size
        out = np.empty((3, out_h, out_w), np.float32)
        data = Path(self.files[i]).read_bytes()
        load_into(
            data, self.transform, sample_stream(0, 0, i), out, dtype="float32", key=self.files[i]
        )
        return torch.from_numpy(out), self.labels[i]


def collate(samples: list[tuple[Any, int]]) -> tuple[Any, Any]:
    """SPDL's batching step (threads). DataLoader keeps its default_collate, which stacks
    a worker's batch straight into shared memory (a stack like this one is copied there
    again: the baseline was handicapped by it, QA31)."""
    import torch

    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


# ---------------------------------------------------------------- one iterable per system
def iter_gpu_loader(samples_per_task: int | None) -> Callable[[Path, str], Iterator[Any]]:
    def run(data: Path, kind: str) -> Iterator[tuple[Any, Any]]:
        import gpu_loader as gl

        loader = gl.ImageLoader(
            gl.sources.ImageFolder(data),
            batch_size=BATCH,
            transform=make_transform(kind),
            device="cpu",
            dtype="float32",
            shuffle=True,
            seed=0,
            options=gl.LoaderOptions(samples_per_task=samples_per_task),
        )
        with loader:
            yield from loader

    return run


def iter_dataloader(sample_cls: type, workers: int) -> Callable[[Path, str], Iterable[Any]]:
    def make(data: Path, kind: str) -> Iterable[Any]:
        import torch.utils.data as tud

        files, labels = list_files(data)
        return tud.DataLoader(
            sample_cls(files, labels, kind),
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            prefetch_factor=2,
        )

    return make


def iter_spdl(
    sample: Callable[[Path, str], tuple[Callable[[int], Any], int]], threads: int
) -> Callable[[Path, str], Iterator[Any]]:
    def run(data: Path, kind: str) -> Iterator[Any]:
        import random

        from spdl.pipeline import PipelineBuilder

        load_one, n = sample(data, kind)
        order = list(range(n))
        random.Random(0).shuffle(order)
        pipeline = (
            PipelineBuilder()
            .add_source(order)
            .pipe(load_one, concurrency=threads, output_order="input")
            .aggregate(BATCH)
            .pipe(collate)
            .add_sink(3)
            .build(num_threads=threads)
        )
        with pipeline.auto_stop():
            yield from pipeline

    return run


def spdl_io_sample(data: Path, kind: str) -> tuple[Callable[[int], Any], int]:
    import numpy as np
    import spdl.io

    from gpu_loader.sources import sample_stream

    files, labels = list_files(data)
    transform = make_transform(kind)
    mean = np.asarray(transform.mean, np.float32)
    std = np.asarray(transform.std, np.float32)
    out_h, out_w = transform.output_size

    def load_one(i: int) -> tuple[Any, int]:
        packets = spdl.io.demux_image(files[i])
        p = transform.make_params(packets.height, packets.width, sample_stream(0, 0, i))
        w, h = max(1, round(p.width)), max(1, round(p.height))
        x, y = round(p.left), round(p.top)
        flip = ",hflip" if p.flip else ""
        desc = f"crop={w}:{h}:{x}:{y},scale={out_w}:{out_h}:flags=bilinear{flip},format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=desc)
        arr = spdl.io.to_numpy(spdl.io.convert_frames(frames))
        return normalize_hwc(arr, mean, std), labels[i]

    return load_one, len(files)


def spdl_fast_sample(data: Path, kind: str) -> tuple[Callable[[int], Any], int]:
    files, labels = list_files(data)
    sample = FastSample(files, labels, kind)
    return sample.__getitem__, len(sample)


def spdl_simplejpeg_sample(data: Path, kind: str) -> tuple[Callable[[int], Any], int]:
    """gpu_loader's Pillow backend per image: simplejpeg decode, Pillow resize, OpenCV normalise."""
    from gpu_loader.ops._backend import ENV_VAR, native_module

    os.environ[ENV_VAR] = "pillow"  # this worker process only
    native_module.cache_clear()
    return spdl_fast_sample(data, kind)


def iter_dali(threads: int) -> Callable[[Path, str], Iterator[Any]]:
    return lambda data, kind: _dali_batches(data, kind, threads)


def _dali_batches(data: Path, kind: str, threads: int) -> Iterator[Any]:
    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types

    files, labels = list_files(data)
    transform = make_transform(kind)
    mean = [255 * m for m in transform.mean]
    std = [255 * s for s in transform.std]

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, seed=0)  # type: ignore[untyped-decorator]
    def pipe() -> Any:
        jpegs, label = fn.readers.file(
            files=files, labels=labels, random_shuffle=True, name="reader"
        )
        if kind == "train":
            images = fn.decoders.image_random_crop(
                jpegs,
                device="cpu",
                output_type=types.RGB,
                random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3],
            )
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True)
            mirror = fn.random.coin_flip(probability=0.5)
            images = fn.crop_mirror_normalize(
                images,
                mirror=mirror,
                mean=mean,
                std=std,
                output_layout="CHW",
                dtype=types.FLOAT,
            )
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=RESIZE, antialias=True)
            images = fn.crop_mirror_normalize(
                images,
                crop=(SIZE, SIZE),
                mean=mean,
                std=std,
                output_layout="CHW",
                dtype=types.FLOAT,
            )
        return images, label

    p = pipe()
    p.build()
    batches = (len(files) + BATCH - 1) // BATCH
    for _ in range(batches):
        images, label = p.run()
        yield (
            torch.from_numpy(np.asarray(images.as_tensor())),
            torch.from_numpy(np.asarray(label.as_tensor()).reshape(-1)),
        )


def quick_systems(n: int) -> list[str]:
    return ["gpu_loader", baseline(n), f"dataloader_fast_w{n}"]


def runners(n: int) -> dict[str, Callable[[Path, str], Iterable[Any]]]:
    """How each of `systems(n)` runs (the same names, the same order)."""
    return dict(
        zip(
            systems(n),
            [
                iter_gpu_loader(None),
                iter_gpu_loader(1),
                iter_dataloader(PillowSample, n),
                iter_dataloader(PillowSample, 2 * n),
                iter_dataloader(FastSample, n),
                iter_spdl(spdl_io_sample, n),
                iter_spdl(spdl_fast_sample, n),
                iter_spdl(spdl_simplejpeg_sample, n),
                iter_dali(n),
            ],
            strict=True,
        )
    )


def measure(system: str, data: Path, kind: str, peer_workers: int) -> dict[str, Any]:
    """One pass over the data; wall and process-tree CPU time after the warm-up batches."""
    timer = Timer()
    images = 0
    shape: list[int] = []
    last = 0.0
    iterator = iter(runners(peer_workers)[system](data, kind))
    timed = 0
    for batches, batch in enumerate(iterator, start=1):
        if batches == WARMUP_BATCHES:
            timer.start()
        elif batches > WARMUP_BATCHES:
            images += int(batch[0].shape[0])
            shape = list(batch[0].shape)
            last = time.perf_counter()
            timed += 1
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    del iterator  # worker processes exit and are reaped, so their CPU time is counted
    if timed < MIN_TIMED_BATCHES:  # a system that dropped every sample lands here too
        raise ValueError(
            f"only {timed} batches after the {WARMUP_BATCHES} warm-up ones: too few to time; "
            f"use a folder of at least {(WARMUP_BATCHES + MIN_TIMED_BATCHES) * BATCH} images"
        )
    _, cpu = timer.stop()
    wall = last - timer.t0
    return {
        "images": images,
        "wall_s": wall,
        "img_per_s": images / wall,
        "cpu_s_per_1000": 1000 * cpu / images,
        "batch_shape": shape,
    }


# ---------------------------------------------------------------- the parent process
def available(system: str) -> str | None:
    """None when `system` can run here, else why not."""
    import importlib.util

    need = {
        "spdl_io": "spdl",
        "spdl_fast": "spdl",
        "spdl_simplejpeg": "spdl",
        "dali_cpu": "nvidia.dali",
    }.get(system)
    if need is None:
        return None
    try:
        found = importlib.util.find_spec(need) is not None
    except ImportError:
        found = False
    if not found:
        return f"{need} is not installed ({BENCH_EXTRA_HINT})"
    if system == "spdl_io":  # spdl.io decodes with the machine's FFmpeg shared libraries
        try:
            from spdl.io.lib import _import_libspdl

            _import_libspdl()
        except Exception as exc:
            return f"spdl.io cannot load FFmpeg here ({str(exc)[:160]})"
    return None


def ensure_dataset(data: Path | None, num_images: int, sides: tuple[int, int] = SIDES) -> Path:
    from gpu_loader.cli import cache_dir
    from gpu_loader.datasets import make_image_folder

    if data is not None:
        return data
    name = f"bench-photos-{num_images}"
    if sides != SIDES:
        name += f"-{sides[0]}-{sides[1]}px"
    return make_image_folder(
        cache_dir() / name,
        num_images=num_images,
        num_classes=10,
        seed=0,
        min_side=sides[0],
        max_side=sides[1],
        progress=True,
    )


def warm_page_cache(data: Path) -> None:
    """Read every file of ``data`` once, so that the first system measured does not read
    from disk while the rest read from the page cache (a run after the test suite: the
    first round's first system gave 8.8k img/s against 21-23k in the next two)."""
    files, _ = list_files(data)
    began = time.perf_counter()
    size = sum(len(Path(f).read_bytes()) for f in files)
    took = time.perf_counter() - began
    print(f"read {len(files):,} files ({size / 2**20:.0f} MiB) in {took:.1f} s", file=sys.stderr)


def set_workload(size: int, batch: int) -> None:
    """The output side and batch size every system runs (module-wide, in each process);
    eval resizes the shorter side to ``size`` x 256/224 first, as at 224."""
    global SIZE, RESIZE, BATCH
    SIZE, BATCH = size, batch
    RESIZE = round(size * 256 / 224)


def _sides(text: str) -> tuple[int, int]:
    try:
        low, high = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX (two integers), got {text!r}") from None
    if not 8 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 8 <= MIN <= MAX, got {text!r}")
    return low, high


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="image folder (default: generated photos)")
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=SIZE, help=f"output side (default {SIZE})")
    parser.add_argument(
        "--batch-size", type=int, default=BATCH, help=f"batch size (default {BATCH})"
    )
    parser.add_argument(
        "--sides",
        type=_sides,
        default=SIDES,
        help=f"MIN,MAX: side range of the generated images (default {SIDES[0]},{SIDES[1]})",
    )
    parser.add_argument("--transforms", default="train,eval", help="comma list: train,eval")
    parser.add_argument(
        "--systems", help="comma list of systems (default: all of them; see the JSON's 'systems')"
    )
    parser.add_argument(
        "--peer-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes / threads for DataLoader, SPDL and DALI (default: the CPU "
        "count, as gpu_loader's automatic threads)",
    )
    add_out_argument(parser)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds; each runs every system once (round-robin), medians are reported",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_IMAGES} images (at batch {BATCH}), train only, one round, gpu_loader vs "
        "DataLoader with Pillow and with gpu_loader's per-sample path",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    workers = args.peer_workers
    if workers < 1:
        parser.error(f"--peer-workers must be >= 1, got {workers}")
    if not 1 <= args.size <= 8192:
        parser.error(f"--size must be 1 to 8192, got {args.size}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    set_workload(args.size, args.batch_size)
    known = systems(workers)
    if args.worker:
        print(json.dumps(measure(args.worker, args.data, args.kind, workers)))
        return 0

    num = (WARMUP_BATCHES + 8) * BATCH if args.quick else args.num_images
    least = (WARMUP_BATCHES + MIN_TIMED_BATCHES) * BATCH
    if args.data is None and num < least:
        parser.error(f"--num-images must be at least {least} ({MIN_TIMED_BATCHES} timed batches)")
    kinds = ["train"] if args.quick else args.transforms.split(",")
    chosen = quick_systems(workers) if args.quick else (args.systems or ",".join(known)).split(",")
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(
            f"unknown system(s) {unknown} with --peer-workers {workers}; choose from {list(known)}"
        )
    repeats = 1 if args.quick else args.repeats
    data = ensure_dataset(args.data, num, args.sides)
    warm_page_cache(data)
    runnable = []
    for system in chosen:
        why = available(system)
        if why is None:
            runnable.append(system)
        else:
            print(f"[skip] {system}: {why}", file=sys.stderr)
    runs: list[dict[str, Any]] = []
    # Round-robin: every system runs once per round, so a change in how much CPU the
    # (shared) machine gives us hits all systems alike; ratios are taken within a round.
    for round_no in range(repeats):
        for kind in kinds:
            for system in runnable:
                print(
                    f"[run {round_no + 1}/{repeats}] {kind:5s} {system} ...",
                    file=sys.stderr,
                    flush=True,
                )
                result, pss = run_worker(
                    [
                        "-m",
                        "gpu_loader.benchmarks.cpu_loaders",
                        "--worker",
                        system,
                        "--kind",
                        kind,
                        "--data",
                        str(data),
                        "--peer-workers",
                        str(workers),
                        "--size",
                        str(SIZE),
                        "--batch-size",
                        str(BATCH),
                    ]
                )
                runs.append(
                    {
                        "round": round_no,
                        "transform": kind,
                        "system": system,
                        "peak_pss_mb": pss,
                        **result,
                    }
                )
    base = baseline(workers)
    rows = summarize(runs, base)
    columns = [
        ("transform", "transform"),
        ("system", "system"),
        ("img_per_s", "img/s"),
        ("cpu_s_per_1000", "CPU-s/1000 img"),
        ("cores", "cores used"),
        ("peak_pss_mb", "peak PSS MB"),
        ("speedup_vs_baseline", f"x DataLoader+Pillow({workers})"),
        ("cpu_vs_baseline", f"CPU/img vs DataLoader+Pillow({workers})"),
        ("error", "error"),
    ]
    table = format_table(rows, columns)
    path = write_results(
        "cpu_loaders"
        if (SIZE, BATCH, args.sides) == DEFAULT_WORKLOAD
        else f"cpu_loaders-{SIZE}px-b{BATCH}",
        {
            "dataset": {
                "path": str(data),
                "images": num,
                "sides": None if args.data is not None else list(args.sides),
            },
            "batch_size": BATCH,
            "output_size": SIZE,
            "repeats": repeats,
            "peer_workers": workers,
            "baseline": base,
            "systems": known,
            "rows": rows,
            "runs": runs,
            "table": table,
        },
        args.out,
    )
    print(table)
    for kind in kinds:
        ours = next(
            (r for r in rows if r["transform"] == kind and r["system"] == "gpu_loader"), None
        )
        if ours and ours.get("vs_best_other"):
            print(
                f"{kind}: gpu_loader img/s / best other system ({ours['best_other']}): "
                f"{ours['vs_best_other']:.2f}x"
            )
    print(f"\nwritten: {path}")
    return 0


def summarize(runs: list[dict[str, Any]], base_system: str) -> list[dict[str, Any]]:
    """One row per (transform, system): medians over the rounds; ratios per round, then median.

    ``speedup_vs_baseline`` / ``cpu_vs_baseline``: img/s and CPU-s per image over
    ``base_system`` (DataLoader+Pillow at the peers' worker count) in the same round.
    ``vs_best_other`` (gpu_loader rows): its median img/s over the best median img/s of
    any peer (not ``gpu_loader_per_sample``, the same loader with one setting changed).
    """
    import statistics

    def med(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    base = {
        (r["round"], r["transform"]): r
        for r in runs
        if r["system"] == base_system and "img_per_s" in r
    }
    rows: list[dict[str, Any]] = []
    keys = dict.fromkeys((r["transform"], r["system"]) for r in runs)
    for kind, system in keys:
        mine = [r for r in runs if (r["transform"], r["system"]) == (kind, system)]
        ok = [r for r in mine if "img_per_s" in r]
        row: dict[str, Any] = {"transform": kind, "system": system, "rounds": len(ok)}
        if not ok:
            row["error"] = mine[-1].get("error", "no result")
            rows.append(row)
            continue
        row["img_per_s"] = med([r["img_per_s"] for r in ok])
        row["cpu_s_per_1000"] = med([r["cpu_s_per_1000"] for r in ok])
        row["cores"] = med([r["img_per_s"] * r["cpu_s_per_1000"] / 1000 for r in ok])
        row["peak_pss_mb"] = max(r["peak_pss_mb"] for r in ok)
        row["img_per_s_all"] = [round(r["img_per_s"], 1) for r in ok]
        speed, cpu = [], []
        for r in ok:
            ref = base.get((r["round"], kind))
            if ref:
                speed.append(r["img_per_s"] / ref["img_per_s"])
                cpu.append(r["cpu_s_per_1000"] / ref["cpu_s_per_1000"])
        row["speedup_vs_baseline"] = med(speed)
        row["cpu_vs_baseline"] = med(cpu)
        row["batch_shape"] = ok[-1].get("batch_shape")
        rows.append(row)
    for kind in dict.fromkeys(k for k, _ in keys):
        ours = next(
            (r for r in rows if r["transform"] == kind and r["system"] == "gpu_loader"), None
        )
        others = [
            r
            for r in rows
            # Peers only: gpu_loader_per_sample is gpu_loader itself with one setting changed.
            if r["transform"] == kind
            and not r["system"].startswith("gpu_loader")
            and r.get("img_per_s")
        ]
        if ours and ours.get("img_per_s") and others:
            best = max(others, key=lambda r: r["img_per_s"])
            ours["best_other"] = best["system"]
            ours["vs_best_other"] = ours["img_per_s"] / best["img_per_s"]
    return rows


if __name__ == "__main__":
    sys.exit(main())
