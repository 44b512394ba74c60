"""What the ordered and the straggler batcher share: bookkeeping, locking, stats, state."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, Generic, Literal, TypeVar

from gpu_loader.batching._ledger import READY, STARTED, Ledger
from gpu_loader.batching._plan import Batch, BatcherStats, BatchPlan

T = TypeVar("T")

CALLER_WAITS: Final = "caller waits"
"""What `_select` returns when a batch is held back because the caller asked for it
(``moves=False`` or ``wait_for``), not by the batcher's own rules."""


class BatcherBase(Generic[T]):
    """Thread-safe: the source thread may call `started()` while the consumer pushes and pops."""

    mode: Literal["ordered", "straggler"]

    def __init__(
        self,
        batch_size: int,
        num_positions: int,
        drop_last: bool,
        max_delay_batches: int,
        clock: Callable[[], float],
    ) -> None:
        if not callable(clock):
            raise TypeError(f"`clock` must be a callable returning seconds, got {clock!r}")
        self.plan = BatchPlan(num_positions, batch_size, drop_last)
        self._ledger = Ledger(self.plan)
        self._items: dict[int, T] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._max_delay = max_delay_batches
        self._emitted = 0
        self._moved = 0
        self._moved_delay_sum = 0
        self._max_seen_delay = 0
        self._overdue = 0
        self._held_back = 0
        self._held_back_s = 0.0
        self._held_since: float | None = None

    # -- feeding -------------------------------------------------------------------------
    def started(self, position: int) -> None:
        """Record that ``position`` entered the pipeline (call before it can complete)."""
        with self._lock:
            self._ledger.start(position)
            self._on_started(position)

    def push(self, position: int, item: T) -> None:
        """Hand over the completed sample of ``position``."""
        with self._lock:
            self._ledger.complete(position, ok=True)
            self._items[position] = item
            self._on_completed(position, ok=True)

    def fail(self, position: int) -> None:
        """Report that ``position`` failed: it is never delivered and counts as done."""
        with self._lock:
            self._ledger.complete(position, ok=False)
            self._on_completed(position, ok=False)

    def completed_ok(self) -> int:
        """Positions completed without failing: ready, or in a batch emitted (a resumed
        epoch's delivered ones included)."""
        with self._lock:
            return self._ledger.completed - self._ledger.failed

    # -- draining ------------------------------------------------------------------------
    def pop(
        self,
        *,
        moves: bool = True,
        wait_for: Collection[int] | Callable[[], Collection[int]] = (),
    ) -> Batch[T] | None:
        """The next batch if one can be emitted now, else None (never blocks).

        ``moves=False`` emits only a batch that moves no sample: one whose positions are
        the next ones to deliver, with no incomplete position below them (ordered
        batching's batch). A loader passes it while the training loop still has batches
        queued, so samples move only when waiting for them would stall it.

        ``wait_for`` names incomplete positions a batch must not leave behind: while one
        of them would be skipped, the pop waits for it as with ``moves=False`` (positions
        that completed meanwhile are ignored). A loader names the samples whose moving
        would cost more than waiting for them (the CPU path: samples already in a row of
        the tensor the batch would be built on). A callable is called only when a batch
        that skips an incomplete position could be emitted: the pop after every
        completion then costs nothing while fewer than a batch are ready, or while the
        next batch is the next positions in order. It is called under the batcher's
        lock, which is not re-entrant: it must not call the batcher's methods.

        Ordered batches never move samples, so neither changes anything there; a pop
        refused because of them does not count as held back.
        """
        with self._lock:
            positions = self._select(moves, wait_for)
            if isinstance(positions, str):  # CALLER_WAITS
                return None
            if positions is None:
                if moves and self._ready_count() >= self.plan.batch_size:
                    self._held_back += 1
                    if self._held_since is None:
                        self._held_since = self._clock()
                return None
            return self._emit(positions)

    def finish(self) -> None:
        """Check that the epoch is complete: every kept position is delivered, ready or failed.

        Call it when the pipeline's output ends; it raises `RuntimeError` naming what is
        missing instead of silently losing samples.
        """
        with self._lock:
            ledger = self._ledger
            if ledger.done:
                return
            missing = [p for p, s in enumerate(ledger.status) if s < READY]
            raise RuntimeError(
                f"epoch ended with {len(missing)} position(s) never completed, e.g. "
                f"{missing[:8]}; every position in [0, {self.plan.num_kept}) must be pushed "
                "or failed (after a resume, start exactly remaining_positions())"
            )

    def pop_final(self) -> list[Batch[T]]:
        """`finish()`, then every remaining batch (the epoch's tail), in emission order."""
        self.finish()
        out = []
        while (batch := self.pop()) is not None:
            out.append(batch)
        return out

    # -- reporting and resume ------------------------------------------------------------
    def stats(self) -> BatcherStats:
        with self._lock:
            ledger = self._ledger
            mean = self._moved_delay_sum / self._moved if self._moved else 0.0
            return BatcherStats(
                mode=self.mode,
                batches=self._emitted,
                delivered=ledger.delivered,
                failed=ledger.failed,
                dropped=len(self.plan.dropped),
                pending=ledger.started - ledger.completed,
                ready=self._ready_count(),
                moved=self._moved,
                mean_moved_delay=mean,
                max_delay=self._max_seen_delay,
                overdue=self._overdue,
                held_back=self._held_back,
                # with a hold-back still open (an epoch stopped by a timeout or a
                # break there) its time so far: QA saw 2 s held back read as 0.0
                held_back_s=self._held_back_s
                + (0.0 if self._held_since is None else self._clock() - self._held_since),
            )

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable record of what this epoch delivered and failed so far.

        Samples completed but not yet emitted are not in it: a resumed epoch computes them
        again (they were never delivered). Ranges are half-open ``[start, stop]`` lists.
        """
        with self._lock:
            return self._ledger.to_state(self.mode, self._emitted)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue an epoch from `state_dict()`: its delivered and failed positions are done.

        Needs a fresh batcher built with the same arguments. Start exactly
        `remaining_positions()` afterwards.
        """
        with self._lock:
            self._emitted = self._ledger.load_state(state, self.mode)
            self._on_loaded()

    def running(self, limit: int) -> list[int]:
        """The smallest positions started and not completed, at most ``limit`` of them:
        what the next batch waits for."""
        with self._lock:
            status, found = self._ledger.status, list[int]()
            at = status.find(STARTED, self._ledger.low())
            while at != -1 and len(found) < limit:
                found.append(at)
                at = status.find(STARTED, at + 1)
            return found

    def remaining_positions(self) -> list[int]:
        """Positions never started this epoch, ascending (after a resume: what is left)."""
        with self._lock:
            return self._ledger.remaining()

    # -- hooks for the subclasses (called with the lock held) --------------------------
    def _on_started(self, position: int) -> None:
        """Extra bookkeeping when a position starts."""

    def _on_completed(self, position: int, *, ok: bool) -> None:
        """Extra bookkeeping when a position completes."""

    def _on_loaded(self) -> None:
        """Extra bookkeeping after `load_state_dict()`."""

    def _ready_count(self) -> int:
        return len(self._items)

    def _select(
        self, moves: bool, wait_for: Collection[int] | Callable[[], Collection[int]]
    ) -> list[int] | str | None:
        """Positions of the next batch (removing them from the waiting set), or None, or
        `CALLER_WAITS` when only ``moves=False`` or ``wait_for`` holds it back."""
        raise NotImplementedError

    def _emit(self, positions: list[int]) -> Batch[T]:
        index = self._emitted
        self._emitted += 1
        if self._held_since is not None:
            self._held_back_s += self._clock() - self._held_since
            self._held_since = None
        size = self.plan.batch_size
        delays = tuple(index - p // size for p in positions)
        items = tuple(self._items.pop(p) for p in positions)
        for position, delay in zip(positions, delays, strict=True):
            self._ledger.deliver(position)
            if delay > 0:
                self._moved += 1
                self._moved_delay_sum += delay
                self._overdue += delay > self._max_delay
        if delays:
            self._max_seen_delay = max(self._max_seen_delay, max(delays))
        return Batch(items=items, positions=tuple(positions), index=index, delays=delays)


def check_delay(max_delay_batches: object) -> int:
    if not isinstance(max_delay_batches, int) or isinstance(max_delay_batches, bool):
        raise TypeError(f"`max_delay_batches` must be an int, got {max_delay_batches!r}")
    if max_delay_batches < 0:
        raise ValueError(
            f"`max_delay_batches` must be >= 0 (0 keeps every sample in its nominal batch), "
            f"got {max_delay_batches}"
        )
    return max_delay_batches
