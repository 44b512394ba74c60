"""The stand-in runtime catches each breach of invariant 6, so its silence in the end-to-end
tests means something: every check here is made to fire once, then shown quiet when the
orchestration does the right thing."""

from __future__ import annotations

import gc

import numpy as np
import torch

from gpu_loader.cuda._arena import PinnedArena
from gpu_loader.cuda._gpu_stage import handoff
from gpu_loader.cuda._standin_device import StandinRuntime, StandinStream
from gpu_loader.cuda._standins import StandinDecoder
from tests.cuda.conftest import BAD, Dataset, fetch_all, make_stage


def _write(rt: StandinRuntime, stream: StandinStream, tensor: torch.Tensor, value: float) -> None:
    """A fake kernel writing ``value``: like a real launch it holds an address, not the tensor."""
    backing, n = rt.lookup(tensor.data_ptr()).backing, tensor.numel()
    rt.enqueue(stream, lambda: backing[: 4 * n].view(np.float32).fill(value), writes=[backing])


def test_reading_before_the_event_is_reported() -> None:
    rt = StandinRuntime()
    worker = rt.new_stream()
    out = rt.empty_output((2, 3, 4, 4), "float32", worker)
    _write(rt, worker, out, 1.0)
    rt.to_host(out)  # no wait on the worker's event
    assert any("without default waiting" in v for v in rt.violations)


def test_waiting_on_the_event_makes_the_read_safe() -> None:
    rt = StandinRuntime()
    worker = rt.new_stream()
    out = rt.empty_output((2, 3, 4, 4), "float32", worker)
    _write(rt, worker, out, 1.0)
    rt.handoff([out], rt.record_event(worker))
    assert torch.all(rt.to_host(out) == 1.0)
    assert rt.violations == []


def _reuse_scenario(record: bool) -> StandinRuntime:
    rt = StandinRuntime()
    worker, consumer = rt.new_stream(), rt.new_stream("consumer")
    rt.set_current_stream(consumer)
    out = rt.empty_output((4, 4), "float32", worker)
    _write(rt, worker, out, 1.0)
    event = rt.record_event(worker)
    consumer.wait_event(event)
    if record:
        rt.record_stream(out, consumer)
    rt.consume(out, lambda t: None)  # the training loop's kernel, not run yet
    del out
    gc.collect()
    again = rt.empty_output((4, 4), "float32", worker)  # the next batch
    _write(rt, worker, again, 2.0)
    rt.synchronize()
    return rt


def test_reuse_without_record_stream_is_reported() -> None:
    rt = _reuse_scenario(record=False)
    assert rt.reuses == 1
    assert any("reused" in v and "consumer" in v for v in rt.violations)


def test_record_stream_keeps_the_block_from_early_reuse() -> None:
    rt = _reuse_scenario(record=True)
    assert rt.reuses == 0 and rt.allocations == 2
    assert rt.violations == []


def test_dropping_decoded_images_before_the_kernel_is_reported(dataset: Dataset) -> None:
    stage, rt = make_stage(dataset.source.labels)
    arena = PinnedArena(1 << 20, allocator=rt.alloc_pinned)
    jpegs = [i for i, n in enumerate(dataset.names) if n.endswith(".jpg") and n not in BAD]
    samples, _ = fetch_all(dataset.source, arena, jpegs)
    state = stage.worker_init()
    batch = stage(samples, state)
    assert not batch.event.query()  # the kernel is still pending on the worker stream
    state.pending.clear()  # what the stage must not do: drop the inputs of a pending kernel
    gc.collect()
    assert any("freed while" in v for v in rt.violations)


def test_the_stage_keeps_decoded_images_until_the_event(dataset: Dataset) -> None:
    stage, rt = make_stage(dataset.source.labels)
    arena = PinnedArena(1 << 20, allocator=rt.alloc_pinned)
    samples, _ = fetch_all(dataset.source, arena, list(range(len(dataset.names))))
    state = stage.worker_init()
    batch = stage(samples, state)
    assert len(state.pending) == 1
    images, _ = handoff(batch)
    rt.to_host(images)
    assert batch.event.query()
    samples2, _ = fetch_all(dataset.source, arena, [0])
    stage(samples2, state)  # reaps the first batch's keep-alives: its event has fired
    assert len(state.pending) == 1
    del state
    gc.collect()  # the worker's state is dropped: its last batch is waited for, not torn
    assert rt.violations == []


def test_releasing_bytes_before_the_decode_is_consumed_is_reported(dataset: Dataset) -> None:
    rt = StandinRuntime()
    arena = PinnedArena(1 << 20, allocator=rt.alloc_pinned, poison=True)
    samples, _ = fetch_all(dataset.source, arena, [dataset.names.index("a.jpg")])
    stream = rt.new_stream()
    decoder = StandinDecoder(rt)
    images = decoder.decode([s.data for s in samples], stream)
    assert images[0] is not None
    samples[0].release()  # too early: the stream has not passed the decode
    rt.record_event(stream).synchronize()
    assert any("released too early" in v for v in rt.violations)


def test_changing_a_pinned_upload_source_before_the_copy_is_reported() -> None:
    rt = StandinRuntime()
    pinned = rt.alloc_pinned(4 * 5 * 3).reshape(4, 5, 3)
    pinned[:] = 7
    stream = rt.new_stream()
    image = rt.upload_image(pinned, stream)  # reads `pinned` when the copy runs
    pinned[:] = 0xEE  # the arena slice was given back and reused too early
    rt.record_event(stream).synchronize()
    assert any("changed before the copy ran" in v for v in rt.violations)
    assert image.height == 4 and image.width == 5


def test_a_pageable_upload_source_may_change_at_once() -> None:
    rt = StandinRuntime()
    pageable = np.full((4, 5, 3), 7, np.uint8)
    stream = rt.new_stream()
    image = rt.upload_image(pageable, stream)
    pageable[:] = 0  # torch's pin_memory() staged a copy: the caller may reuse its array
    rt.record_event(stream).synchronize()
    assert rt.violations == []
    assert isinstance(image.owner, torch.Tensor) and int(image.owner.max()) == 7


def test_decoder_returns_none_for_undecodable_input() -> None:
    rt = StandinRuntime()
    decoder = StandinDecoder(rt)
    blob = memoryview(np.frombuffer(b"\xff\xd8\xff\xe0" + b"\0" * 64, np.uint8))
    assert decoder.decode([blob], rt.new_stream()) == [None]


def test_a_batch_is_handed_off_once_however_often_it_is_asked() -> None:
    # A second wait_event + record_stream per call would cost a device call each time a
    # training loop reads batch.images through handoff again.
    from gpu_loader.cuda._gpu_stage import GpuBatch

    calls: list[object] = []

    class Runtime:
        def handoff(self, tensors: object, event: object) -> None:
            calls.append(event)

    batch = GpuBatch(
        images=torch.zeros(1),
        labels=torch.zeros(1),
        positions=[0],
        keys=["k"],
        event="E",
        failed=[],
        runtime=Runtime(),  # type: ignore[arg-type]
    )
    handoff(batch)
    images, _ = handoff(batch)
    assert calls == ["E"] and images is batch.images
