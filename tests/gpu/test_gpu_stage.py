"""The GPU batch stage on a real device (skipped cleanly without one: needs_cuda).

They ran on an H100 on 2026-11-22 (docs/gpu.md, "What has run where"), except the ones
added since, which say so in their docstrings; the machines they are written on have no
GPU. They use the public pieces only: ``cuda_ports`` + ``GpuBatchStage`` built directly (so they do not
depend on how ``ImageLoader`` wires the stage), and ``ImageLoader(device="cuda")``.
"""

from __future__ import annotations

import gc
import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpu_loader.cuda import (
    GpuBatch,
    GpuBatchStage,
    GpuFetcher,
    PinnedArena,
    cuda_ports,
    handoff,
    standin_ports,
)
from gpu_loader.datasets import photo_like
from gpu_loader.ops import EvalTransform, TrainTransform, decode
from gpu_loader.pipeline import PipelineBuilder
from gpu_loader.sources import FileList

pytestmark = pytest.mark.needs_cuda

SIZES = [
    (120, 160),
    (333, 500),
    (480, 640),
    (64, 900),
    (1024, 768),
    (77, 77),
    (200, 300),
    (512, 512),
]


@dataclass
class Task:
    position: int
    index: int
    key: str


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> FileList:
    root: Path = tmp_path_factory.mktemp("gpu_data")
    rng = np.random.default_rng(0)
    items = []
    for i, (h, w) in enumerate(SIZES):
        image = photo_like(h, w, rng)
        data = simplejpeg.encode_jpeg(image, quality=90, colorsubsampling="420" if i % 2 else "444")
        (root / f"{i}.jpg").write_bytes(bytes(data))
        items.append((root / f"{i}.jpg", i % 3))
    buf = io.BytesIO()
    Image.fromarray(photo_like(100, 120, rng)).save(buf, "PNG")  # takes the CPU fallback
    (root / "p.png").write_bytes(buf.getvalue())
    items.append((root / "p.png", 1))
    return FileList(items)


def _stage(
    ports: object, transform: object, source: FileList, dtype: str = "float32"
) -> GpuBatchStage:
    return GpuBatchStage(ports, transform, source.labels, dtype=dtype)  # type: ignore[arg-type]


def _fetch(source: FileList, arena: PinnedArena, transform: object, indices: list[int]) -> list:
    fetcher = GpuFetcher(source, arena, transform, seed=0, epoch=0)  # type: ignore[arg-type]
    return [fetcher.fetch(p, i) for p, i in enumerate(indices)]


def _host_batch(
    ports: Any, stage: GpuBatchStage, source: FileList
) -> tuple[np.ndarray, np.ndarray, GpuBatch]:
    """Every sample of ``source`` as one batch through ``stage``, copied to the host."""
    import torch

    arena = PinnedArena(8 << 20, allocator=ports.runtime.alloc_pinned)
    samples = _fetch(source, arena, stage.transform, list(range(len(source))))
    batch = stage(samples, stage.worker_init())
    images, labels = handoff(batch)
    if images.is_cuda:
        torch.cuda.current_stream().synchronize()
        return images.cpu().numpy(), labels.cpu().numpy(), batch
    ports.runtime.synchronize()
    return images.numpy().copy(), labels.numpy().copy(), batch


def test_nvimgcodec_gpu_decode_matches_the_cpu_decode(source: FileList) -> None:
    import torch

    from gpu_loader.cuda import NvImageCodecDecoder

    decoder = NvImageCodecDecoder(device_id=0)
    stream = torch.cuda.Stream()
    blobs = [memoryview(source.read(i)) for i in range(len(SIZES))]
    images = decoder.decode_images(blobs, stream)
    stream.synchronize()
    for i, image in enumerate(images):
        assert image is not None, f"nvImageCodec could not decode {source.key(i)} on the GPU"
        gpu = np.asarray(image.cpu())
        cpu = decode(bytes(blobs[i])).array
        assert gpu.shape == cpu.shape
        mse = float(np.mean((gpu.astype(np.float64) - cpu) ** 2))
        psnr = 10 * np.log10(255.0**2 / max(mse, 1e-12))
        assert psnr > 38.0, (source.key(i), psnr)  # IDCT/upsampling differ from libjpeg-turbo


def test_cuda_stage_matches_the_stand_in_stage(source: FileList) -> None:
    """Same bytes, same parameters: the GPU stage vs nvImageCodec-CPU + emulated kernel."""
    transform = TrainTransform(96)
    outputs = []
    for ports in (cuda_ports("cuda"), standin_ports()):
        images, labels, batch = _host_batch(ports, _stage(ports, transform, source), source)
        outputs.append((images, labels, batch.positions))
    (gpu, gpu_labels, gpu_pos), (cpu, cpu_labels, cpu_pos) = outputs
    assert gpu_pos == cpu_pos == list(range(len(source)))
    assert np.array_equal(gpu_labels, cpu_labels)
    # Decoders differ by about a level; the kernel matches its emulation to float32 rounding.
    assert float(np.abs(gpu - cpu).mean()) < 0.02
    assert float(np.abs(gpu - cpu).max()) < 0.35


@pytest.mark.parametrize(
    ("exif_orientation", "interpolation"),
    [(False, "bilinear"), (True, "bicubic"), (False, "bicubic")],
)
def test_cuda_stage_keeps_stored_pixels_and_bicubic_as_the_stand_in_does(
    tmp_path: Path, exif_orientation: bool, interpolation: str
) -> None:
    """exif_orientation=False and bicubic (both added after the last GPU run): the GPU
    decoder keeps a rotated JPEG as stored, without the CPU fallback, and the bicubic
    entry points match their emulation."""
    import dataclasses

    from tests.cuda.conftest import sample_files

    files = sample_files()
    names = ["exif6.jpg", "a.jpg", "d.jpg", "e.png"]
    for name in names:
        (tmp_path / name).write_bytes(files[name])
    source = FileList([(tmp_path / n, i) for i, n in enumerate(names)])
    transform = dataclasses.replace(
        TrainTransform(96, exif_orientation=exif_orientation), interpolation=interpolation
    )
    outputs = []
    for ports in (cuda_ports("cuda"), standin_ports()):
        stage = _stage(ports, transform, source)
        fallbacks: list[str] = []
        cpu_decode = stage._fallback

        def counted(
            sample: Any, stream: Any, cpu_decode: Any = cpu_decode, fallbacks: Any = fallbacks
        ) -> Any:
            fallbacks.append(sample.key)
            return cpu_decode(sample, stream)

        stage._fallback = counted  # type: ignore[method-assign]
        images, _, batch = _host_batch(ports, stage, source)
        outputs.append(images)
        assert fallbacks == [] and batch.failed == [], (fallbacks, batch.failed)
    gpu, cpu = outputs
    assert float(np.abs(gpu - cpu).mean()) < 0.02
    assert float(np.abs(gpu - cpu).max()) < 0.35


def test_cuda_kernel_port_matches_the_emulation_on_identical_pixels() -> None:
    from gpu_loader.cuda import CudaKernelLauncher, CudaRuntime
    from gpu_loader.cuda._emulation import launch_fused_emulated

    rng = np.random.default_rng(1)
    hosts = [photo_like(h, w, rng) for h, w in SIZES[:4]]
    runtime = CudaRuntime("cuda")
    stream = runtime.new_stream()
    dev = [runtime.upload_image(h, stream) for h in hosts]
    boxes = np.array([[0, 0, h.shape[0], h.shape[1]] for h in hosts], np.float64)
    flips = np.array([0, 1, 0, 1], bool)
    out = runtime.empty_output((4, 3, 64, 80), "float32", stream)
    CudaKernelLauncher(0).launch(
        [d.ref for d in dev],
        boxes,
        flips,
        out.data_ptr(),
        64,
        80,
        (0.5, 0.4, 0.3),
        (0.2, 0.25, 0.3),
        "float32",
        stream,
    )
    stream.synchronize()
    ref = np.empty((4, 3, 64, 80), np.float32)
    contiguous = [np.ascontiguousarray(h) for h in hosts]
    refs = [(c.ctypes.data, c.shape[0], c.shape[1], 3 * c.shape[1]) for c in contiguous]
    launch_fused_emulated(
        refs, boxes, flips, ref.ctypes.data, 64, 80, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), "float32"
    )
    np.testing.assert_allclose(out.cpu().numpy(), ref, rtol=1e-3, atol=1e-4)


def _run_epoch(
    source: FileList,
    ports: object,
    stage: GpuBatchStage,
    positions: list[int],
    index_of: list[int],
    transform: object,
    on_batch: object,
) -> None:
    arena = PinnedArena(16 << 20, allocator=ports.runtime.alloc_pinned)  # type: ignore[attr-defined]
    stop = threading.Event()
    fetcher = GpuFetcher(source, arena, transform, seed=0, epoch=0, stop_event=stop)  # type: ignore[arg-type]
    tasks = (Task(p, index_of[p], source.key(index_of[p])) for p in positions)
    pipeline = (
        PipelineBuilder()
        .add_source(tasks)
        .pipe(fetcher, concurrency=4, name="fetch", output_order="completion")
        .aggregate(8)
        .pipe(stage, concurrency=3, name="gpu_batch", worker_init=stage.worker_init)
        .add_sink(buffer_size=4)
        .build()
    )
    with pipeline:
        for batch in pipeline:
            on_batch(batch)  # type: ignore[operator]
    stop.set()
    assert arena.stats().live_slices == 0


def test_stress_1000_batches_training_loop_runs_its_own_kernels(source: FileList) -> None:
    """The loader runs ahead while the training loop's own kernels keep the device busy;
    any early read or early reuse of a batch buffer would show up as a wrong value."""
    import torch

    transform = EvalTransform(64)  # deterministic: every sample has one right answer
    ports = cuda_ports("cuda")
    stage = _stage(ports, transform, source)
    n = len(source)
    # The right answer per sample, from a single synchronised batch.
    arena = PinnedArena(8 << 20, allocator=ports.runtime.alloc_pinned)
    first = stage(_fetch(source, arena, transform, list(range(n))), stage.worker_init())
    ref, _ = handoff(first)
    torch.cuda.synchronize()
    expected = ref.clone()
    positions = list(range(8 * 1000))
    index_of = [int(i) % n for i in np.random.default_rng(2).permutation(len(positions))]
    worst = torch.zeros((), device="cuda")
    seen = 0
    weight = torch.randn(512, 512, device="cuda")

    def on_batch(batch: object) -> None:
        nonlocal seen, worst
        images, labels = handoff(batch)  # type: ignore[arg-type]
        idx = torch.tensor([index_of[p] for p in batch.positions], device="cuda")  # type: ignore[attr-defined]
        for _ in range(4):  # the "training step": enough work that the loader gets ahead
            torch.mm(weight, weight)
        worst = torch.maximum(worst, (images - expected[idx]).abs().max())
        seen += int(labels.shape[0])

    _run_epoch(source, ports, stage, positions, index_of, transform, on_batch)
    torch.cuda.synchronize()
    assert seen == len(positions)
    assert float(worst) == 0.0


def test_no_device_memory_growth_across_epochs(source: FileList) -> None:
    import torch

    transform = TrainTransform(96)
    ports = cuda_ports("cuda")
    stage = _stage(ports, transform, source, "float16")
    positions = list(range(8 * 40))
    index_of = [p % len(source) for p in positions]
    used = []
    for _ in range(4):
        _run_epoch(
            source,
            ports,
            stage,
            positions,
            index_of,
            transform,
            lambda b: handoff(b)[0].float().sum(),
        )
        gc.collect()
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        used.append((torch.cuda.memory_allocated(), total - free))
    assert used[-1][0] <= used[1][0] + (1 << 20)
    assert used[-1][1] <= used[1][1] + (64 << 20)  # nvImageCodec's own pools included


def test_image_loader_on_cuda(source: FileList) -> None:
    import torch

    import gpu_loader as gl

    loader = gl.ImageLoader(
        source,
        batch_size=4,
        transform=TrainTransform(64),
        device="cuda",
        dtype="float16",
        shuffle=False,
    )
    count = 0
    for images, labels in loader:
        assert images.is_cuda and labels.is_cuda
        assert images.dtype == torch.float16 and images.shape[1:] == (3, 64, 64)
        assert torch.isfinite(images).all()
        count += int(labels.shape[0])
    assert count == len(source)
