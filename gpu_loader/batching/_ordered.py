"""OrderedBatcher: batches in nominal order, whatever order the samples complete in."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection
from typing import Literal, TypeVar

from gpu_loader.batching._base import BatcherBase
from gpu_loader.batching._ledger import FAILED, READY

T = TypeVar("T")


class OrderedBatcher(BatcherBase[T]):
    """Emit nominal batch 0, 1, 2, ... each with its positions in order, minus failed ones.

    A batch is emitted once every one of its positions has completed, so one slow sample
    holds back its whole batch and every batch after it (head-of-line blocking; measured as
    ``held_back`` in `stats()`). With the same seed the batches are the same whatever the
    thread counts and timings.

    Failures do not change the number of batches (ranks of a distributed job must step
    together, as in `StragglerBatcher`): a nominal batch whose members all failed emits
    nothing, and the next batch with two samples or more is split to make up for it
    (``Batch.index`` counts emitted batches: a batch after a skipped one has a delay of -1,
    a split's later parts 0 or +1).
    So that a short last batch failing wholly (a lone last sample, say) can be made up for
    too, the batch before it waits until it has completed, given a ``window`` (the
    caller's most samples in flight: started and not yet emitted or failed) with room
    for both (``batch_size`` + the last batch's size). The epoch still ends short
    when not enough samples are left to split: every later batch a single sample, or the
    last two nominal batches failing wholly.

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
        window: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(batch_size, num_positions, drop_last, 0, clock)
        self._next = 0  # next nominal batch to emit
        # Positions of each nominal batch still incomplete: O(1) readiness check per pop.
        self._missing = [len(self.plan.batch_range(b)) for b in range(self.plan.num_batches)]
        self._parts: list[list[int]] = []  # the rest of a split batch, emitted next
        # The batch before a short last one waits for it (see the class docstring), when
        # the caller's in-flight window has room for both: held, it must not keep the last
        # one from starting. Not known (no window given): no wait, and no split for it.
        plan, last = self.plan, self.plan.last_batch_size
        room = window is not None and window >= batch_size + last
        self._wait_at = plan.num_batches - 2 if room and last < batch_size else -1

    def _on_completed(self, position: int, *, ok: bool) -> None:
        self._missing[position // self.plan.batch_size] -= 1

    def _on_loaded(self) -> None:
        status = self._ledger.status
        for b in range(self.plan.num_batches):
            self._missing[b] = sum(status[p] < READY for p in self.plan.batch_range(b))

    def _select(
        self, moves: bool, wait_for: Collection[int] | Callable[[], Collection[int]]
    ) -> list[int] | str | None:
        if self._parts:
            return self._parts.pop(0)
        status, plan, missing = self._ledger.status, self.plan, self._missing
        while self._next < plan.num_batches and missing[self._next] == 0:
            if self._next == self._wait_at and missing[self._next + 1]:
                return None
            members = plan.batch_range(self._next)
            self._next += 1
            positions = [p for p in members if status[p] == READY]
            if not positions:
                # All failed (made up for by a split) or all delivered before a resume:
                # move on to the next nominal batch.
                continue
            # Nominal batches passed that emitted nothing, this one's emission counted.
            # Exact across a resume too: `_emitted` is restored, and a resumed epoch
            # passes the batches delivered before it again.
            owed = self._next - self._emitted - 1
            if self._next - 1 == self._wait_at and self._all_failed(self._next):
                owed += 1  # the last batch will emit nothing: this one pays for it too
            if owed > 0 and len(positions) > 1:
                parts = min(owed + 1, len(positions))
                cut = [len(positions) * i // parts for i in range(parts + 1)]
                self._parts = [positions[a:b] for a, b in itertools.pairwise(cut[1:])]
                return positions[: cut[1]]
            return positions
        return None

    def _all_failed(self, batch: int) -> bool:
        status = self._ledger.status
        return all(status[p] == FAILED for p in self.plan.batch_range(batch))
