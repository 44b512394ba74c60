"""Straggler mode's batch rows: decode into the nominal batch, copy only what moved."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from gpu_loader._straggler_rows import Placed, Run, StragglerRows
from gpu_loader.batching import BatchPlan

B = 4


class Rows:
    """A StragglerRows over tiny tensors, with the allocations it made counted."""

    def __init__(
        self,
        n: int,
        clock: Callable[[], float] = time.monotonic,
        spare: collections.deque[torch.Tensor] | None = None,
    ) -> None:
        self.batches = 0
        self.samples = 0
        self.recycled: list[torch.Tensor] = []
        self.rows = StragglerRows(
            BatchPlan(n, B), self.new_batch, self.new_sample, self.recycled.append, clock, spare
        )

    def new_batch(self, rows: int) -> torch.Tensor:
        self.batches += 1
        return torch.full((rows, 1, 2, 2), -1.0)

    def new_sample(self) -> torch.Tensor:
        self.samples += 1
        return torch.full((1, 2, 2), -1.0)

    def decode(self, position: int, *, ok: bool = True) -> Placed:
        placed = self.rows.place(position)
        placed.data.fill_(float(position))  # what load_into would write
        self.rows.finished(placed, ok=ok)
        return placed


def rows_hold(images: torch.Tensor, order: list[int]) -> bool:
    return all(np.all(images[i].numpy() == p) for i, p in enumerate(order))


def test_an_unmoved_batch_is_its_nominal_tensor_without_copies() -> None:
    r = Rows(8)
    placed = [r.decode(p) for p in range(4)]
    slab = placed[0].data.data_ptr()
    images, order = r.rows.assemble([0, 1, 2, 3], placed)
    assert order == [0, 1, 2, 3] and rows_hold(images, order)
    assert images.data_ptr() == slab  # the nominal batch's tensor itself
    assert (r.rows.hosted, r.rows.copied_rows, r.batches) == (1, 0, 1)


def test_a_straggler_still_decoding_is_not_overwritten() -> None:
    r = Rows(12)
    straggler = r.rows.place(1)  # decoding into row 1 of batch 0's tensor
    first = [r.decode(p) for p in (0, 2, 3, 4)]
    images, order = r.rows.assemble([0, 2, 3, 4], first)
    # No tensor can host (batch 0's has a writer, batch 1's holds one row): a copy.
    assert r.rows.hosted == 0 and order == [0, 2, 3, 4] and rows_hold(images, order)
    straggler.data.fill_(1.0)
    r.rows.finished(straggler, ok=True)
    assert rows_hold(images, order)  # the batch handed out is untouched
    second = [straggler] + [r.decode(p) for p in (5, 6, 7)]
    slab = second[1].data.data_ptr() - 1 * 4 * 4  # row 1 of batch 1's tensor
    images2, order2 = r.rows.assemble([1, 5, 6, 7], second)
    # Batch 1's tensor hosts: the straggler is copied into the row position 4 left.
    assert r.rows.hosted == 1 and sorted(order2) == [1, 5, 6, 7]
    assert order2[0] == 1 and rows_hold(images2, order2)
    assert images2.data_ptr() == slab


def test_a_sample_whose_batch_went_without_it_decodes_privately() -> None:
    r = Rows(8)
    first = [r.decode(p) for p in (0, 1, 2, 4)]  # position 3 has not started (slow read)
    images, order = r.rows.assemble([0, 1, 2, 4], first)
    assert r.rows.hosted == 1 and sorted(order) == [0, 1, 2, 4] and rows_hold(images, order)
    late = r.decode(3)
    assert late.slab is None and r.samples == 1  # batch 0's tensor is sealed
    second = [late] + [r.decode(p) for p in (5, 6, 7)]
    images2, order2 = r.rows.assemble([3, 5, 6, 7], second)
    assert rows_hold(images2, order2) and sorted(order2) == [3, 5, 6, 7]
    assert not np.shares_memory(images.numpy(), images2.numpy())
    assert rows_hold(images, order)  # the first batch still holds what it was given


def test_private_tensors_are_reused_by_the_next_epochs_rows() -> None:
    # The loader keeps the spares across epochs: each epoch making its own freed and
    # allocated ~30 sample tensors again, and the process grew ~2 MB an epoch.
    spare: collections.deque[torch.Tensor] = collections.deque()
    for epoch in range(3):
        r = Rows(8, spare=spare)
        first = [r.decode(p) for p in (0, 1, 2, 4)]
        r.rows.assemble([0, 1, 2, 4], first)
        late = r.decode(3)  # its batch went without it: a private tensor
        assert late.slab is None
        rest = [late] + [r.decode(p) for p in (5, 6, 7)]
        images, order = r.rows.assemble([3, 5, 6, 7], rest)
        assert rows_hold(images, order)
        assert r.samples == (1 if epoch == 0 else 0)  # later epochs take the first's
        assert len(spare) == 1


def test_failed_rows_are_free_and_unused_tensors_are_recycled() -> None:
    r = Rows(8)
    r.decode(1, ok=False)
    r.rows.failed(1)
    first = [r.decode(p) for p in (0, 2, 3, 4)]
    images, order = r.rows.assemble([0, 2, 3, 4], first)
    assert r.rows.hosted == 1 and rows_hold(images, order)
    second = [r.decode(p) for p in (5, 6, 7)]
    slab = second[0].data.data_ptr() - 4 * 4  # row 1 of batch 1's tensor
    # The short last batch is copied; batch 1's tensor, never handed out, goes back.
    images2, order2 = r.rows.assemble([5, 6, 7], second)
    assert order2 == [5, 6, 7] and rows_hold(images2, order2)
    assert len(r.recycled) == 1 and r.recycled[0].data_ptr() == slab
    assert r.rows._slabs == {}  # every batch is done, the failed sample's too: none kept


def test_a_finished_row_a_later_batch_needs_is_not_sealed_away() -> None:
    # Position 1 is decoded but moved to a later batch; a batch made of 0, 2, 3 and an
    # outsider must not be built on batch 0's tensor, whose row 1 it would hand out.
    r = Rows(12)
    kept = r.decode(1)
    batch = [r.decode(p) for p in (0, 2, 3, 4)]
    images, order = r.rows.assemble([0, 2, 3, 4], batch)
    assert r.rows.fresh == 1 and rows_hold(images, order)
    later = [kept] + [r.decode(p) for p in (5, 6, 7)]
    images2, order2 = r.rows.assemble([1, 5, 6, 7], later)
    assert sorted(order2) == [1, 5, 6, 7] and rows_hold(images2, order2)


def test_hold_back_names_samples_in_rows_until_the_batcher_has_them() -> None:
    now = [0.0]
    r = Rows(12, clock=lambda: now[0])
    decoding = r.rows.place(1)  # writing into row 1 of batch 0's tensor
    r.decode(2)  # decoded, on its way to the batcher
    now[0] = 0.8
    younger = r.rows.place(9)
    assert sorted(r.rows.hold_back(1.0)) == [1, 2, 9]
    now[0] = 1.6  # position 1 has decoded for 1.6 s, a straggler by a 1 s limit; 9 for 0.8
    assert sorted(r.rows.hold_back(1.0)) == [2, 9]
    assert sorted(r.rows.hold_back(None)) == [1, 2, 9]  # no limit known: hold all
    r.rows.arrived(2)
    r.rows.finished(decoding, ok=False)
    r.rows.failed(1)
    r.rows.finished(younger, ok=True)
    now[0] = 5.0
    assert r.rows.hold_back(0.5) == [9]  # decoded, not yet at the batcher: held
    r.rows.arrived(9)
    assert r.rows.hold_back(None) == []


def test_hold_back_lets_run_mates_of_a_straggling_decode_go() -> None:
    # Samples a run decoded reach the batcher only when the run ends: they are held as
    # long as the run's current decode is, and no longer.
    now = [0.0]
    r = Rows(12, clock=lambda: now[0])
    run = Run()
    for position in (0, 1):
        r.rows.run_decoding(run)
        placed = r.rows.place(position)
        r.rows.finished(placed, ok=True, run=run)
    now[0] = 0.1
    r.rows.run_decoding(run)  # position 2: decodes for long
    slow = r.rows.place(2)
    now[0] = 0.5
    assert sorted(r.rows.hold_back(1.0)) == [0, 1, 2]
    now[0] = 1.2  # the run's current decode is past a 1 s limit: all three may go
    assert r.rows.hold_back(1.0) == []
    assert sorted(r.rows.hold_back(None)) == [0, 1, 2]
    r.rows.finished(slow, ok=True, run=run)
    r.rows.run_ended(run)  # the whole run is on its way to the batcher: held again
    assert sorted(r.rows.hold_back(1.0)) == [0, 1, 2]


def test_a_file_much_larger_than_recent_ones_decodes_privately() -> None:
    r = Rows(200)
    for p in range(40):  # sizes around 1000 bytes: the median
        placed = r.rows.place(p, nbytes=900 + 5 * p)
        assert placed.slab is not None
        r.rows.finished(placed, ok=True)
    big = r.rows.place(40, nbytes=5000)  # > 4 x the median
    assert big.slab is None and big.private is not None and r.rows.private_large == 1
    assert 40 not in r.rows.hold_back(None)  # its batch may go without it
    assert r.rows.place(41, nbytes=3000).slab is not None  # large, but under 4x


def test_concurrent_decodes_and_assembly_deliver_every_sample_once() -> None:
    n = 64
    r = Rows(n)
    placed: dict[int, Placed] = {}
    lock = threading.Lock()

    def work(positions: range) -> None:
        for p in positions:
            done = r.decode(p)
            with lock:
                placed[p] = done

    threads = [threading.Thread(target=work, args=(range(k, n, 4),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen: list[int] = []
    for start in range(0, n, B):
        batch = list(range(start, start + B))
        images, order = r.rows.assemble(batch, [placed[p] for p in batch])
        assert rows_hold(images, order)
        seen += order
    assert sorted(seen) == list(range(n))
