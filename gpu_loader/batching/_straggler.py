"""StragglerBatcher: fast samples fill batches at once; a straggler joins a later batch."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Collection
from typing import Literal, TypeVar

from gpu_loader.batching._base import CALLER_WAITS, BatcherBase, check_delay
from gpu_loader.batching._ledger import READY

T = TypeVar("T")


class StragglerBatcher(BatcherBase[T]):
    """Form batches from the samples that are ready; bound how late any sample may be.

    Rules (``B = batch_size``, ``D = max_delay_batches``, nominal batch of a position
    ``p // B``, emission index ``e`` of the next batch):

    * A batch is the ``B`` ready samples with the smallest positions (oldest nominal batch
      first), formed as soon as ``B`` are ready.
    * Lateness bound: every sample is delivered in a batch with index ``<= p // B + D``.
      Batch ``e`` is therefore held back while some incomplete position ``p`` below the
      high-water mark (the highest position started or completed) has ``p // B + D <= e``:
      the consumer waits for that straggler. Positions above the mark have not entered the
      pipeline and belong to the future; an unstarted position below it (a start order
      reordered by `order_by_cost`) counts as pending, so the bound holds for it too.
    * ``pop(moves=False)`` emits only a batch that skips no incomplete position, and
      ``pop(wait_for=...)`` one that skips none of the named ones (see `BatcherBase.pop`).
    * Every kept position is delivered exactly once or reported failed. Once all of them
      have completed, the tail is emitted, the last batch short when ``n - failed`` is not a
      multiple of ``B``.
    * Failures do not change the number of batches (ranks of a distributed job must step
      together): each failure leaves one place of a batch empty, as in ordered mode,
      though not necessarily in the batch that lost it (the next batch formed is short
      by the failures not yet left empty, never below one sample), and batches are cut
      below ``B`` where needed so that every nominal batch is still emitted, while at
      least as many samples are left as batches owed. The batch before the last waits
      while every sample left for the last one is still running, until one of them
      completes: should they all fail, it is cut in two instead (where the lateness
      bound allows: not with ``D = 0``, whose samples are all due).
      ``wait_for_last=False`` leaves that wait out (the loader does, for a single
      process, where the count matters less than the epoch's end).
    * ``drop_last=True`` drops the nominal short last batch, as in ordered mode: positions
      ``>= n - n % B`` are not part of the epoch (reported in ``stats().dropped``, not
      failed; the loader must not start them). The set of delivered samples is thus the
      same in both modes; a failure can still leave the final batch short.

    With ``D = 0`` and no failures the batches equal `OrderedBatcher`'s. Progress: with
    positions started in ascending order (or reordered in blocks by `order_by_cost` with
    look-ahead ``L``), a loader whose in-flight window (started minus emitted or failed)
    is at least ``B + L`` never deadlocks; ``(D + 1) * B + L`` lets fast samples run ahead
    by the full bound. Memory: the batcher holds only samples inside that window.
    """

    mode: Literal["ordered", "straggler"] = "straggler"

    def __init__(
        self,
        batch_size: int,
        num_positions: int,
        *,
        max_delay_batches: int = 2,
        drop_last: bool = False,
        wait_for_last: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            batch_size, num_positions, drop_last, check_delay(max_delay_batches), clock
        )
        self._heap: list[int] = []  # ready positions, smallest first
        self._wait_for_last = wait_for_last  # `_last_has_none_ready`'s wait, when True

    @property
    def max_delay_batches(self) -> int:
        return self._max_delay

    def _on_completed(self, position: int, *, ok: bool) -> None:
        if ok:
            heapq.heappush(self._heap, position)

    def _select(
        self, moves: bool, wait_for: Collection[int] | Callable[[], Collection[int]]
    ) -> list[int] | str | None:
        heap, ledger = self._heap, self._ledger
        size = self._target_size()
        if not heap or (len(heap) < size and not ledger.done):
            return None
        if self._last_has_none_ready(size):
            return None  # a batch fewer if what is running fails: wait for one of them
        low = ledger.low()
        if (
            low < ledger.highwater
            and low // self.plan.batch_size + self._max_delay <= self._emitted
        ):
            return None  # emitting now would push `low` past its bound: wait for it
        # The batch's largest position, only when the caller restricts what it may skip:
        # pop runs after every completion, and a free pop needs no look at the heap.
        names: Collection[int] = ()
        if not moves:
            top = heapq.nsmallest(size, heap)[-1]
        elif callable(wait_for):
            top = heapq.nsmallest(size, heap)[-1]
            if top > low:  # called only now that a batch skipping one could go (`pop`)
                names = wait_for()
        else:
            names = wait_for
            top = heapq.nsmallest(size, heap)[-1] if names else low
        if top > low:  # the batch would skip incomplete positions in [low, top)
            if not moves:
                return CALLER_WAITS
            status = ledger.status
            if any(low <= p < top and status[p] < READY for p in names):
                return CALLER_WAITS
        # Smallest positions first is earliest-deadline-first: while the bound above holds
        # for every incomplete position, it also holds for the ready ones left out.
        return [heapq.heappop(heap) for _ in range(min(size, len(heap)))]

    def _target_size(self) -> int:
        """``B``, less one place per failure so far (as ordered mode leaves them empty),
        or fewer so that every batch still owed this epoch can have a sample; never below
        the ready samples due now.

        Failures must not change how many batches an epoch yields: ranks of a distributed
        job step together, and one yielding a batch fewer leaves the others waiting in a
        collective. The samples left (ready, running or not started) are spread so that
        each owed batch can get one; the epoch still ends short when fewer samples are
        left than batches owed, or when samples counted on here fail after the batches
        were cut.
        """
        ledger, size = self._ledger, self.plan.batch_size
        left = len(ledger.status) - ledger.delivered - ledger.failed
        owed = self.plan.num_batches - self._emitted
        if owed <= 1 or left < owed:
            return size
        # Each failure so far leaves one place empty, as in ordered mode: filled from
        # later samples instead, the places ran out at the epoch's end, and a distributed
        # epoch padded its last batches with repeats (QA: 4 of 34 batches with 11 of 101
        # samples failed, where ordered mode repeated none). Never below the samples due
        # now: the lateness bound comes first.
        unfilled = ledger.failed - (self._emitted * size - ledger.delivered)
        cut = size - min(max(unfilled, 0), size - 1)
        if left - owed + 1 < cut:
            cut = left - owed + 1
        return cut if cut == size else min(size, max(cut, self._due_count()))

    def _due_count(self) -> int:
        """Ready samples due in this batch: no cut goes below them, the lateness bound
        comes first."""
        due = (self._emitted - self._max_delay + 1) * self.plan.batch_size
        return sum(p < due for p in self._heap)  # positions below `due` are due now

    def _last_has_none_ready(self, size: int) -> bool:
        """Whether emitting ``size`` now, as the batch before the last, would leave the
        last one only samples still running: should they all fail, the epoch would end a
        batch short (`_target_size`). Then this batch waits until one of them completes
        (or all have failed, and the count is kept by cutting this one)."""
        ledger = self._ledger
        return (
            self._wait_for_last
            and self._max_delay > 0  # else all of this batch is due now: no cut could help
            and self.plan.num_batches - self._emitted == 2
            and len(self._heap) <= size  # every ready sample would go now
            and ledger.started == len(ledger.status)  # the tail: none left to start
            and ledger.completed < len(ledger.status)  # and some are running
        )
