"""OrderedBatcher: batches in nominal order, whatever order the samples complete in."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Literal, TypeVar

from gpu_loader.batching._base import BatcherBase
from gpu_loader.batching._ledger import READY

T = TypeVar("T")


class OrderedBatcher(BatcherBase[T]):
    """Emit nominal batch 0, 1, 2, ... each with its positions in order, minus failed ones.

    A batch is emitted once every one of its positions has completed, so one slow sample
    holds back its whole batch and every batch after it (head-of-line blocking; measured as
    ``held_back`` in `stats()`). A batch whose members all failed is skipped: the next
    batch takes its emission index, so ``Batch.index`` counts emitted batches and
    ``Batch.delays`` are then negative. With the same seed the batches are the same
    whatever the thread counts and timings.

    Memory: it holds only completed samples of batches not yet emitted, that is at most the
    loader's in-flight window (samples started and not yet handed out).
    """

    mode: Literal["ordered", "straggler"] = "ordered"

    def __init__(
        self,
        batch_size: int,
        num_positions: int,
        drop_last: bool = False,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(batch_size, num_positions, drop_last, 0, clock)
        self._next = 0  # next nominal batch to emit
        # Positions of each nominal batch still incomplete: O(1) readiness check per pop.
        self._missing = [len(self.plan.batch_range(b)) for b in range(self.plan.num_batches)]

    def _on_completed(self, position: int, *, ok: bool) -> None:
        self._missing[position // self.plan.batch_size] -= 1

    def _on_loaded(self) -> None:
        status = self._ledger.status
        for b in range(self.plan.num_batches):
            self._missing[b] = sum(status[p] < READY for p in self.plan.batch_range(b))

    def _select(
        self, moves: bool, wait_for: Collection[int] | Callable[[], Collection[int]]
    ) -> list[int] | str | None:
        status = self._ledger.status
        while self._next < self.plan.num_batches and self._missing[self._next] == 0:
            members = self.plan.batch_range(self._next)
            self._next += 1
            positions = [p for p in members if status[p] == READY]
            if positions:
                return positions
            # Nothing to hand out: all failed (skipped, documented above) or all delivered
            # before a resume. Either way move on to the next nominal batch.
        return None
