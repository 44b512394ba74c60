"""Recycled CPU batches: reused once dropped, never while anything still refers to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import gpu_loader as gl
from gpu_loader._batch_pool import BatchPool
from gpu_loader.ops import EvalTransform
from gpu_loader.sources import FileList


def test_a_dropped_batch_is_reused_and_a_kept_one_is_not() -> None:
    pool = BatchPool((3, 4, 4), torch.float32, keep=4)
    first = pool.take(2)
    handed = pool.hand_out(first)
    kept_slice = handed[1]  # a view of the batch survives the batch itself
    del handed
    second = pool.take(2)
    assert second.data_ptr() != first.data_ptr(), "a slice still refers to it"
    del kept_slice
    third = pool.take(2)
    assert third.data_ptr() == first.data_ptr() and pool.reused == 1


def test_numpy_views_count_as_references() -> None:
    pool = BatchPool((3, 2, 2), torch.float32, keep=4)
    base = pool.take(1)
    as_array = pool.hand_out(base).numpy()
    assert pool.take(1).data_ptr() != base.data_ptr()
    del as_array
    assert pool.take(1).data_ptr() == base.data_ptr()


def test_a_view_alive_at_hand_out_does_not_count_as_idle() -> None:
    # The batcher thread hands a batch out while its own numpy view of it is still in a
    # local: once that goes, the loop's view alone must still keep the batch out.
    pool = BatchPool((3, 2, 2), torch.float32, keep=4)
    base = pool.take(1)
    batchers_view = base.numpy()
    handed = pool.hand_out(base)
    del batchers_view
    assert pool.take(1).data_ptr() != base.data_ptr(), "reused while the loop holds it"
    del handed
    assert pool.take(1).data_ptr() == base.data_ptr()


def test_a_shorter_batch_reuses_a_whole_one_until_it_is_dropped() -> None:
    # QA69: with 10% bad files nearly every batch had its own row count, and each took new
    # memory (830 against 1,900 img/s, 650 against 380 MB). A free whole batch now serves,
    # its first rows; it is whole again once the shorter one is dropped.
    pool = BatchPool((3, 4, 4), torch.float32, keep=4)
    pool.hand_out(pool.take(8))  # and dropped at once, as the loop drops a batch
    short = pool.take(6, most=8)
    assert short.shape[0] == 6 and pool.allocated == 1 and pool.reused == 1
    assert pool.take(6, most=5).data_ptr() != short.data_ptr()  # past `most`: new
    handed = pool.hand_out(short)
    del short
    assert pool.take(8).data_ptr() != handed.data_ptr(), "reused while the loop holds it"
    ptr = handed.data_ptr()
    del handed
    again = pool.take(8)
    assert again.data_ptr() == ptr and again.shape[0] == 8


def test_pool_keeps_at_most_keep_free_batches() -> None:
    pool = BatchPool((1, 1, 1), torch.float32, keep=2)
    handed = [pool.hand_out(pool.take(1)) for _ in range(5)]
    del handed
    pool.take(1)
    assert sum(len(v) for v in pool._free.values()) <= 2


def test_batches_kept_by_the_training_loop_stay_intact(unique_list: FileList) -> None:
    def make() -> gl.ImageLoader:
        return gl.ImageLoader(unique_list, batch_size=8, transform=EvalTransform(32), seed=1)

    loader = make()
    kept = list(loader)  # hold every batch of epoch 0
    copies = [(x.clone(), y.clone()) for x, y in kept]
    for epoch in (1, 2):  # later epochs reuse only what was dropped
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    for (x, y), (xc, yc) in zip(kept, copies, strict=True):
        assert torch.equal(x, xc) and torch.equal(y, yc)
    assert loader._pool is not None and loader._pool.reused > 0


def test_batches_are_made_on_the_cpu_whatever_the_thread_s_default_device() -> None:
    # QA62: straggler mode may form a batch in the training loop's thread, whose
    # torch.set_default_device then applied to the new tensor.
    pool = BatchPool((3, 2, 2), torch.float32, keep=4)
    torch.set_default_device("meta")
    try:
        made = pool.take(2)
    finally:
        torch.set_default_device(None)
    assert made.device.type == "cpu"


def test_ordered_mode_recycles_a_batch_tensor_whose_rows_were_copied_out(
    unique_list: FileList, tmp_path: Path
) -> None:
    # QA62: a batch with a failed sample is copied into a smaller tensor, and its
    # nominal tensor was dropped: a new one for every such batch, every epoch.
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image" * 20)
    n = len(unique_list)
    files = [(str(bad) if i % 4 == 0 else unique_list.key(i), i) for i in range(n)]
    loader = gl.ImageLoader(
        FileList(files), batch_size=4, transform=EvalTransform(32), shuffle=False,
        on_error="skip", max_failures=None, options=gl.LoaderOptions(decode_threads=1),
    )  # fmt: skip
    for _ in loader:  # every batch has one bad file
        pass
    pool = loader._pool
    assert pool is not None
    before = pool.allocated
    for epoch in (1, 2, 3):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    batches = n // 4
    assert pool.allocated - before < 3 * batches / 2, (pool.allocated - before, batches)


def test_a_batch_moved_to_shared_memory_is_never_reused() -> None:
    # QA62: a batch sent through a torch.multiprocessing queue is moved to shared memory
    # and mapped by the receiver, which the use count cannot see: later batches were
    # written over what the other process held.
    pool = BatchPool((3, 2, 2), torch.float32, keep=4)
    base = pool.take(1)
    handed = pool.hand_out(base)
    handed.share_memory_()  # what sending it to another process does
    del handed
    assert pool.take(1).data_ptr() != base.data_ptr()
    assert pool.reused == 0


def test_a_take_looks_at_a_bounded_number_of_the_batches_out(monkeypatch: Any) -> None:
    # QA62: each take walked every batch still out: 2 ms a take with 5,000 kept.
    from gpu_loader import _batch_pool

    pool = BatchPool((1, 1, 1), torch.float32, keep=4)
    kept = [pool.hand_out(pool.take(1)) for _ in range(3 * _batch_pool.RECLAIM_SCAN)]
    looked: list[int] = []
    count = pool._count
    monkeypatch.setattr(pool, "_count", lambda base: looked.append(1) or count(base))
    pool.take(1)
    assert len(looked) == _batch_pool.RECLAIM_SCAN
    # Dropped ones are still found in the end, however deep they lie.
    last = kept.pop()
    del last
    found = False
    for _ in range(4):
        before = pool.reused
        pool.take(1)
        found = found or pool.reused > before
    assert found
