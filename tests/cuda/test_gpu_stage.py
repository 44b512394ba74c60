"""The GPU batch stage end to end on the CPU stand-ins: real files -> arena -> nvImageCodec
(CPU backend) batch decode with CPU fallback -> emulated fused kernel -> hand-off."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpu_loader.cuda._arena import ALIGN, ArenaFullError, PinnedArena
from gpu_loader.cuda._gpu_stage import (
    FetchedSample,
    GpuBatch,
    GpuBatchStage,
    GpuFetcher,
    handoff,
)
from gpu_loader.cuda._standin_device import StandinRuntime
from gpu_loader.ops import DecodeError, TrainTransform
from tests.cuda.conftest import (
    BAD,
    EPOCH,
    OUT,
    SEED,
    TRANSFORM,
    Dataset,
    fetch_all,
    make_stage,
    reference,
)


def run_batch(
    dataset: Dataset, dtype: str = "float32", indices: list[int] | None = None
) -> tuple[GpuBatch, StandinRuntime, PinnedArena, list[tuple[int, BaseException]]]:
    stage, runtime = make_stage(dataset.source.labels, dtype)
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned, poison=True)
    todo = list(range(len(dataset.names))) if indices is None else indices
    samples, fetch_failed = fetch_all(dataset.source, arena, todo)
    state = stage.worker_init()
    batch = stage(samples, state)
    return batch, runtime, arena, fetch_failed


def test_every_good_image_matches_the_cpu_path(dataset: Dataset) -> None:
    batch, runtime, arena, _ = run_batch(dataset)
    images, labels = handoff(batch)
    host = runtime.to_host(images).numpy()
    assert runtime.violations == []
    delivered = {key.rsplit("/", 1)[-1] for key in batch.keys}
    good = {n for n in dataset.names if n not in BAD}
    assert delivered == good
    assert images.shape == (len(good), 3, OUT, OUT)
    for row, (position, key) in enumerate(zip(batch.positions, batch.keys, strict=True)):
        index = position  # fetched in index order
        expected = reference((dataset.root / dataset.names[index]).read_bytes(), index)
        diff = np.abs(host[row] - expected).max()
        # Same weights and parameters; the kernel rounds in float32 like the CPU path,
        # so one 8-bit level (1/255/std = 0.0175) bounds the difference.
        assert diff < 0.02, (key, diff)
    assert runtime.to_host(labels).tolist() == [
        int(dataset.source.labels[p]) for p in batch.positions
    ]
    assert arena.stats().in_use == 0 and arena.stats().live_slices == 0


def test_bad_inputs_fail_with_their_key(dataset: Dataset) -> None:
    batch, runtime, _, fetch_failed = run_batch(dataset)
    failed_keys = {key.rsplit("/", 1)[-1] for _, key, _ in batch.failed}
    fetch_keys = {dataset.names[i] for i, _ in fetch_failed}
    # Input that is not a JPEG is decoded at fetch, so it fails there (as on the CPU path),
    # like a JPEG whose header cannot be read or whose data is cut short; one whose scan
    # names undefined tables decodes to None in nvImageCodec, then fails in the stage's
    # CPU fallback too.
    assert fetch_keys == {"garbage.jpg", "text.jpg", "empty.jpg", "truncated.jpg"}
    assert failed_keys == {"undecodable.jpg"}
    for _, key, exc in batch.failed:
        assert isinstance(exc, DecodeError)
        assert key in str(exc)
        assert any("stage: gpu_decode" in note for note in exc.__notes__)
    handoff(batch)
    runtime.synchronize()
    assert runtime.violations == []


@pytest.mark.parametrize("dtype", ["uint8", "float16", "bfloat16"])
def test_output_dtypes(dataset: Dataset, dtype: str) -> None:
    import torch

    good = [i for i, n in enumerate(dataset.names) if n.endswith(".jpg") and n not in BAD][:3]
    batch, runtime, _, _ = run_batch(dataset, dtype, good)
    images, _ = handoff(batch)
    host = runtime.to_host(images)
    assert host.dtype == getattr(torch, dtype)
    for row, index in enumerate(good):
        data = (dataset.root / dataset.names[index]).read_bytes()
        if dtype == "uint8":
            diff = np.abs(
                host[row].numpy().astype(int) - reference(data, index, "uint8").astype(int)
            )
            assert diff.max() <= 1
        else:
            diff = np.abs(host[row].float().numpy() - reference(data, index))
            assert diff.max() < (0.03 if dtype == "float16" else 0.05)


def test_all_failed_batch_is_empty_but_well_formed(dataset: Dataset) -> None:
    # text.jpg fails at fetch (not a JPEG), undecodable.jpg in the stage: a batch of one
    # sample that fails there is empty.
    bad = [dataset.names.index(n) for n in ("undecodable.jpg", "text.jpg")]
    batch, _, arena, fetch_failed = run_batch(dataset, indices=bad)
    images, labels = handoff(batch)
    assert tuple(images.shape) == (0, 3, OUT, OUT) and tuple(labels.shape) == (0,)
    assert len(batch.failed) == 1 and len(fetch_failed) == 1 and batch.positions == []
    assert arena.stats().live_slices == 0


def test_one_batch_decode_call_per_batch(dataset: Dataset) -> None:
    stage, runtime = make_stage(dataset.source.labels)
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned)
    samples, _ = fetch_all(dataset.source, arena, list(range(len(dataset.names))))
    state = stage.worker_init()
    stage(samples, state)
    jpegs = sum(s.size is not None for s in samples)
    assert state.decoder.calls == 1  # type: ignore[attr-defined]
    assert state.decoder.sizes == [jpegs]  # type: ignore[attr-defined]


def stage_one(stage: GpuBatchStage, runtime: StandinRuntime, sample: FetchedSample) -> np.ndarray:
    """The stage's output image for one sample, read back on the host."""
    images, _ = handoff(stage([sample], stage.worker_init()))
    image: np.ndarray = runtime.to_host(images).numpy()[0]
    return image


def test_decoded_pixels_are_staged_in_the_pixel_arena_and_uploaded_from_there(
    dataset: Dataset,
) -> None:
    # A PNG is decoded at fetch; its pixels go to the pinned pixel arena so the stage's
    # upload is an asynchronous copy from there. The arena is poisoned on release, so a
    # slice given back before the copy ran would be reported (and the pixels be wrong).
    index = dataset.names.index("e.png")
    stage, runtime = make_stage(dataset.source.labels)
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned, poison=True)
    pixels = PinnedArena(1 << 20, allocator=runtime.alloc_pinned, poison=True, lazy=True)
    assert not pixels.allocated
    (sample,), _ = fetch_all(dataset.source, arena, [index], pixels)
    assert sample.host is not None and sample.slice is not None
    assert np.shares_memory(sample.host.array, sample.slice.buffer)
    assert runtime.is_pinned(sample.host.array)
    assert arena.stats().live_slices == 0  # the encoded bytes went back at once
    assert pixels.stats().live_slices == 1
    image = stage_one(stage, runtime, sample)
    assert runtime.violations == []
    expected = reference((dataset.root / "e.png").read_bytes(), index)
    assert np.abs(image - expected).max() < 0.02
    assert pixels.stats().live_slices == 0


def test_staged_pixels_never_take_the_room_fetches_need(dataset: Dataset) -> None:
    # A batch being gathered holds its samples' slices; its last fetch waits for room
    # that only a finished batch gives back. Pixels staged in the fetch arena could fill
    # it (they are 5-10x their file) and hang the pipeline: the fetch arena must keep
    # exactly what it had without them.
    index = dataset.names.index("e.png")
    _, runtime = make_stage(dataset.source.labels)
    encoded = -(-len((dataset.root / "e.png").read_bytes()) // ALIGN) * ALIGN
    arena = PinnedArena(encoded, allocator=runtime.alloc_pinned)  # room for the file only
    pixels = PinnedArena(1 << 20, allocator=runtime.alloc_pinned)
    (sample,), _ = fetch_all(dataset.source, arena, [index], pixels)
    assert sample.slice is not None and pixels.stats().live_slices == 1
    whole = arena.acquire(arena.capacity, timeout=0)  # all of it, without waiting
    whole.release()
    sample.slice.release()
    with pytest.raises(ValueError, match="separate PinnedArena"):
        GpuFetcher(dataset.source, arena, TRANSFORM, seed=0, epoch=0, pixel_arena=arena)


def test_decoded_pixels_stay_pageable_when_the_pixel_arena_has_no_room(
    dataset: Dataset,
) -> None:
    index = dataset.names.index("e.png")
    stage, runtime = make_stage(dataset.source.labels)
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned, poison=True)
    pixels = PinnedArena(64 << 10, allocator=runtime.alloc_pinned, poison=True)
    hog = pixels.acquire(pixels.capacity - 4096)  # less room than its 75x75x3 pixels
    (sample,), _ = fetch_all(dataset.source, arena, [index], pixels)
    assert sample.host is not None and sample.slice is None
    assert not runtime.is_pinned(sample.host.array)
    image = stage_one(stage, runtime, sample)
    expected = reference((dataset.root / "e.png").read_bytes(), index)
    assert np.abs(image - expected).max() < 0.02
    assert runtime.violations == []
    hog.release()
    assert arena.stats().in_use == 0 and pixels.stats().in_use == 0


def test_a_fetch_with_no_hole_large_enough_reads_outside_the_arena(dataset: Dataset) -> None:
    # A batch being gathered holds its samples' slices, and the free room can be split
    # between them: enough bytes free, no hole large enough. Waiting would never end
    # (the threaded test hung that way); after `overflow_after_s` the sample is read
    # into ordinary memory and decodes as before.
    index = dataset.names.index("a.jpg")
    encoded = (dataset.root / "a.jpg").read_bytes()
    need = -(-len(encoded) // ALIGN) * ALIGN
    assert need >= 2 * ALIGN
    stage, runtime = make_stage(dataset.source.labels)
    arena = PinnedArena(3 * need, allocator=runtime.alloc_pinned, poison=True)
    first, held, third = (arena.acquire(n) for n in (need - ALIGN, ALIGN, need - ALIGN))
    rest = arena.acquire(arena.capacity - 2 * need + ALIGN)
    first.release()
    third.release()
    assert arena.stats().capacity - arena.stats().in_use >= need  # free, but split in two
    fetcher = GpuFetcher(
        dataset.source, arena, TRANSFORM, seed=SEED, epoch=EPOCH, overflow_after_s=0.05
    )
    sample = fetcher.fetch(0, index)
    assert sample.slice is None and bytes(sample.data) == encoded
    assert fetcher.overflows == 1
    image = stage_one(stage, runtime, sample)
    assert runtime.violations == []
    assert np.abs(image - reference(encoded, index)).max() < 0.02
    # Without `overflow_after_s` the fetch keeps the old contract: it waits, then fails.
    strict = GpuFetcher(dataset.source, arena, TRANSFORM, seed=0, epoch=0, timeout=0.05)
    with pytest.raises(ArenaFullError, match="no room"):
        strict.fetch(1, index)
    held.release()
    rest.release()
    assert arena.stats().in_use == 0


def test_a_decode_call_that_raises_sends_its_batch_to_the_cpu_and_says_so(
    dataset: Dataset, caplog: pytest.LogCaptureFixture
) -> None:
    # A whole-call error (device memory out, a sticky CUDA error) moved every later batch
    # to the CPU with no word: a warning at the first, then at each power of two.
    stage, runtime = make_stage(dataset.source.labels)
    good = [i for i, n in enumerate(dataset.names) if n not in BAD]
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned)
    state = stage.worker_init()

    def broken(blobs: object, stream: object) -> list[object]:
        raise RuntimeError("out of device memory")

    state.decoder.decode = broken  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="gpu_loader.cuda"):
        for _ in range(5):
            samples, _ = fetch_all(dataset.source, arena, good)
            batch = stage(samples, state)
            assert len(batch.positions) == len(good) and batch.failed == []
            handoff(batch)
    runtime.synchronize()
    assert stage.failed_decode_calls == 5
    warned = [r.getMessage() for r in caplog.records if "batch decoder raised" in r.getMessage()]
    assert len(warned) == 3  # the 1st, 2nd and 4th
    assert "RuntimeError: out of device memory" in warned[0] and "(4 such batches" in warned[2]


def test_the_cpu_fallback_keeps_the_fetch_crop_and_catches_a_wrong_geometry(
    dataset: Dataset,
) -> None:
    # One JPEG the batch decoder could not decode (None) and one it returned with another
    # image's geometry: both go to the CPU decoder, cropped with the box the fetch drew
    # from the header (a new draw would differ from the CPU path), and match the CPU path.
    stage, runtime = make_stage(dataset.source.labels)
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned)
    good = [i for i, n in enumerate(dataset.names) if n not in BAD]
    samples, _ = fetch_all(dataset.source, arena, good)
    state = stage.worker_init()
    real = state.decoder.decode
    swapped: list[tuple[int, int]] = []

    # Written without `exif_orientation`, as a decoder may be: the default still calls it.
    def tampered(blobs: object, stream: object) -> list[object]:
        out = list(real(blobs, stream))
        first, second = [i for i, image in enumerate(out) if image is not None][:2]
        assert (out[first].height, out[first].width) != (out[second].height, out[second].width)
        out[first], out[second] = None, out[first]
        swapped.append((first, second))
        return out

    state.decoder.decode = tampered  # type: ignore[method-assign]
    batch = stage(samples, state)
    images, _ = handoff(batch)
    host = runtime.to_host(images).numpy()
    assert swapped and batch.failed == [] and len(batch.positions) == len(good)
    for row, position in enumerate(batch.positions):
        index = good[position]
        expected = reference((dataset.root / dataset.names[index]).read_bytes(), index)
        assert np.abs(host[row] - expected).max() < 0.02, dataset.names[index]


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_exif_orientation_false_keeps_the_pixels_as_stored(
    dataset: Dataset, interpolation: str
) -> None:
    # The transform's exif_orientation=False reaches the fetch's header size and the batch
    # decoder: the orientation-6 JPEG comes out as stored, decoded by the batch decoder
    # itself (no CPU fallback), and equals the CPU path's (bicubic too).
    stored = TrainTransform(OUT, scale=(0.3, 1.0), exif_orientation=False)
    stored = dataclasses.replace(stored, interpolation=interpolation)
    stage, runtime = make_stage(dataset.source.labels, transform=stored)
    arena = PinnedArena(1 << 20, allocator=runtime.alloc_pinned)
    names = ["exif6.jpg", "a.jpg", "e.png"]
    indices = [dataset.names.index(n) for n in names]
    samples, failed = fetch_all(dataset.source, arena, indices, transform=stored)
    assert failed == [] and samples[0].size == (300, 260)  # as stored; upright: 260 x 300
    fallbacks: list[str] = []
    cpu_decode = stage._fallback

    def counted(sample: FetchedSample, stream: object) -> object:
        fallbacks.append(sample.key)
        return cpu_decode(sample, stream)

    stage._fallback = counted  # type: ignore[method-assign,assignment]
    batch = stage(samples, stage.worker_init())
    host = runtime.to_host(handoff(batch)[0]).numpy()
    assert fallbacks == [] and batch.failed == []
    for row, position in enumerate(batch.positions):
        data = (dataset.root / names[position]).read_bytes()
        expected = reference(data, indices[position], transform=stored)
        assert np.abs(host[row] - expected).max() < 0.02, names[position]
    upright = reference((dataset.root / "exif6.jpg").read_bytes(), indices[0], transform=TRANSFORM)
    assert np.abs(host[batch.positions.index(0)] - upright).max() > 0.5
    # The CPU fallback (a JPEG the batch decoder gives up on) keeps them as stored too.
    samples, _ = fetch_all(dataset.source, arena, indices, transform=stored)
    state = stage.worker_init()
    state.decoder.decode = lambda blobs, *_: [None] * len(blobs)  # type: ignore[method-assign]
    again = stage(samples, state)
    assert sorted(fallbacks) == sorted(s.key for s in samples if s.size is not None)
    np.testing.assert_allclose(runtime.to_host(handoff(again)[0]).numpy(), host, atol=0.02)


def test_a_worker_state_is_never_shared_with_a_thread_still_running() -> None:
    # A stuck worker keeps its stream and decoder: reclaim() after the epoch's join must
    # not hand them to the next epoch's worker (one thread per decoder and stream).
    import threading

    from gpu_loader.cuda import standin_ports
    from gpu_loader.cuda._gpu_stage import WorkerPool

    pool = WorkerPool(standin_ports(StandinRuntime()))
    states: dict[str, object] = {}
    acquired, release = threading.Event(), threading.Event()

    def stuck_worker() -> None:
        states["stuck"] = pool.acquire()
        acquired.set()
        release.wait(10)

    stuck = threading.Thread(target=stuck_worker)
    stuck.start()
    assert acquired.wait(10)
    ended = threading.Thread(target=lambda: states.update(ended=pool.acquire()))
    ended.start()
    ended.join()
    pool.reclaim()
    fresh: list[object] = []
    worker = threading.Thread(target=lambda: fresh.extend([pool.acquire(), pool.acquire()]))
    worker.start()
    worker.join()
    release.set()
    stuck.join()
    assert any(s is states["ended"] for s in fresh)
    assert not any(s is states["stuck"] for s in fresh)
    assert pool.created == 3  # two at first, then one new: the stuck thread's kept
