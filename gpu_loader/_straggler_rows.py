"""Straggler mode on the CPU path: decode into batch rows, copy only what moved.

A sample does not know which batch it will join until the batcher emits it, so the
simple way is a private tensor per sample and a copy of every sample into its batch
(measured: 2-8 ms per 32 x 224 x 224 float32 batch on the 2-core dev machine, plus page
faults on the fresh per-sample tensors at each epoch's start). Instead each sample is
decoded straight into its row of its *nominal* batch's tensor (a "slab"), as in ordered
mode, and a batch the batcher emits is built on a slab that no decode still writes to:

* the slab of the nominal batch holding most (at least half) of the batch's samples is
  the *host* when no decode is writing into it and none of its finished rows is needed
  by a later batch;
  the batch's other samples (moved in from other slabs or private tensors) are copied
  into the host's rows whose samples left earlier, failed or have not been decoded, and
  the host is sealed: it goes to the training loop and nothing writes to it again;
* a sample whose slab is sealed (it is late: its batch went without it) decodes into a
  private, recycled tensor and is copied into the batch it joins; so does a file much
  larger than recent ones (expected to be slow), so that its batch can go without it;
* when no slab can host (its straggler is still decoding into it), the batch is copied
  into a fresh tensor. The loader avoids that case: it does not let a batch skip a
  sample in a row of its slab until that decode is a straggler (`hold_back`).

So a batch that equals its nominal batch (the usual case while the loader is ahead)
costs no copy, and a moved sample costs one row copy. Row order then follows the host,
not the positions: `assemble` returns the positions in row order.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpu_loader.batching import AdaptiveThreshold, BatchPlan

LARGE_FILE_FACTOR = 4.0
"""A file more than this many times the median size of recent ones decodes privately."""

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class Slab:
    """A nominal batch's tensor; its samples decode into their rows."""

    index: int
    """The nominal batch."""
    tensor: torch.Tensor | None
    """``[rows, 3, H, W]``; None once sealed."""
    array: np.ndarray | None = None
    """A numpy view of ``tensor`` (rows are cheaper to index there); None once sealed."""
    sealed: bool = False
    """Handed to the training loop as (the base of) a batch: nothing writes to it again."""
    writers: int = 0
    """Decodes writing into a row now."""
    held: set[int] = field(default_factory=set)
    """Rows holding a finished sample not yet emitted."""


class Run:
    """One worker's run of decodes (consecutive samples in one engine call). The samples
    it has decoded reach the batcher only when it ends, so `hold_back` sees each of them
    as late as the run's current decode."""

    __slots__ = ("began",)

    def __init__(self) -> None:
        self.began: float | None = None
        """clock() when the run's current decode began; None once the run ended."""


@dataclass(eq=False)
class Placed:
    """Where one sample's output is: a row of a slab, or a private tensor.

    No view of a slab is kept: `BatchPool` tells a batch tensor is free again by the use
    count of its storage, which a lingering row view would skew.
    """

    slab: Slab | None
    row: int
    private: torch.Tensor | None = None

    @property
    def data(self) -> torch.Tensor:
        """``[3, H, W]``: a fresh view of the row, or the private tensor."""
        if self.slab is None:
            assert self.private is not None
            return self.private
        assert self.slab.tensor is not None, "read only while the slab holds this row"
        return self.slab.tensor[self.row]

    @property
    def array(self) -> np.ndarray:
        """`data` as numpy (bfloat16 as int16 bit patterns, as `as_numpy`)."""
        if self.slab is None:
            assert self.private is not None
            return as_numpy(self.private)
        assert self.slab.array is not None, "read only while the slab holds this row"
        row: np.ndarray = self.slab.array[self.row]
        return row


class StragglerRows:
    """Slabs, private tensors and batch assembly for straggler mode (thread-safe)."""

    def __init__(
        self,
        plan: BatchPlan,
        new_batch: Callable[[int], torch.Tensor],
        new_sample: Callable[[], torch.Tensor],
        recycle: Callable[[torch.Tensor], None],
        clock: Callable[[], float] = time.monotonic,
        spare: collections.deque[torch.Tensor] | None = None,
    ) -> None:
        self.plan = plan
        self._new_batch = new_batch
        self._new_sample = new_sample
        self._recycle = recycle  # gives back a slab tensor that was never handed out
        self._lock = threading.Lock()
        self._slabs: dict[int, Slab] = {}
        self._gone: collections.Counter[int] = collections.Counter()  # emitted or failed
        # Private tensors of late samples, reused (deque append/pop are atomic); the
        # loader passes its own, kept across epochs: fresh ones each epoch were freed and
        # made again, and glibc's heap grew ~2 MB an epoch for 30 epochs (fragmentation).
        self._spare: collections.deque[torch.Tensor] = (
            collections.deque() if spare is None else spare
        )
        # Positions with a slab row whose sample the batcher has not received, with the
        # clock() reading when their decode began (None once it ended, or the `Run` it
        # ended in while that run goes on): a batch that skipped one could not be built on
        # that slab (see `hold_back`).
        self._in_transit: dict[int, float | Run | None] = {}
        self._clock = clock
        # Encoded sizes seen lately: their median times LARGE_FILE_FACTOR marks the files
        # expected to decode slowly (an AdaptiveThreshold over sizes instead of durations).
        self._sizes = AdaptiveThreshold(
            percentile=0.5, factor=LARGE_FILE_FACTOR, window=256, min_samples=32
        )
        self.private_large = 0
        """Samples decoded into a private tensor because their file was large."""
        self.copied_rows = 0
        """Rows copied into a batch (moved samples, or every row of a fallback batch)."""
        self.hosted = 0
        """Batches built on a slab."""
        self.fresh = 0
        """Batches copied whole into a fresh tensor (no slab could host them)."""

    # -- worker threads ------------------------------------------------------------------
    def place(self, position: int, nbytes: int | None = None) -> Placed:
        """Where to decode ``position`` (``nbytes``: its encoded size, if known); call
        `finished` after, whatever happens.

        A file much larger than recent ones (`LARGE_FILE_FACTOR` x their median) is
        expected to decode slowly, so it decodes into a private tensor: if its batch is
        due before it ends, the batch goes without it and is still built on its slab
        (one row copy when it is on time, instead of a whole batch when it is late).
        """
        if nbytes is not None:
            limit = self._sizes.limit_then_observe(float(nbytes))
            if limit is not None and nbytes > limit:
                with self._lock:
                    self.private_large += 1
                return Placed(None, -1, self._take_spare())
        b = position // self.plan.batch_size
        with self._lock:
            slab = self._slabs.get(b)
            if slab is None:
                tensor = self._new_batch(len(self.plan.batch_range(b)))
                slab = Slab(b, tensor, as_numpy(tensor))
                self._slabs[b] = slab
            if not slab.sealed:
                slab.writers += 1
                self._in_transit[position] = self._clock()
                return Placed(slab, position - b * self.plan.batch_size)
        return Placed(None, -1, self._take_spare())  # its batch went without it: late

    def finished(self, placed: Placed, *, ok: bool, run: Run | None = None) -> None:
        """The decode into ``placed`` is over (``ok``: it holds the sample; ``run``: the
        run it was decoded in, which the sample waits for before it reaches the batcher)."""
        slab = placed.slab
        if slab is None:
            if not ok and placed.private is not None:
                self._spare.append(placed.private)
            return
        position = slab.index * self.plan.batch_size + placed.row
        with self._lock:
            slab.writers -= 1
            if position in self._in_transit:
                # Decoded: on its way to the batcher, once its run (if any) ends.
                self._in_transit[position] = run
            if ok:
                slab.held.add(placed.row)

    # One attribute store each, atomic: no lock (`hold_back` reads the old value or the
    # new, as it would a moment earlier or later). The lock cost 10 us per sample with
    # 16 decode threads contending for it.
    def run_decoding(self, run: Run) -> None:
        """``run``'s next decode begins."""
        run.began = self._clock()

    def run_ended(self, run: Run) -> None:
        """``run``'s samples are on their way to the batcher."""
        run.began = None

    def hold_back(self, straggler_after_s: float | None) -> list[int]:
        """Positions a batch should wait for rather than leave behind: those in a row of
        their slab that the batcher has not received (`arrived`), except decodes running
        for longer than ``straggler_after_s`` (None: no exception), and samples decoded in
        a run whose current decode is running that long (they reach the batcher only when
        their run ends).

        A batch that left one of them behind could not be built on that slab (a decode
        still writes to it, or a finished row would be overwritten), so it would be
        copied whole (the fallback above): at 128 x 224 x 224 float32, 40-90 ms on the
        2-core dev machine, far more than the rest of a decode that has not yet turned
        into a straggler, or than the moment a decoded sample takes to reach the batcher.
        The loader passes these as ``pop(wait_for=...)``, with a per-sample straggler
        limit: samples waiting for their read, decoding into a private tensor, or
        running (or waiting on a run-mate running) past that limit still move.
        """
        now = self._clock()
        held = []
        with self._lock:
            for position, state in self._in_transit.items():
                began = state.began if isinstance(state, Run) else state
                if began is None or straggler_after_s is None or now - began <= straggler_after_s:
                    held.append(position)
        return held

    # -- the batcher thread --------------------------------------------------------------
    def arrived(self, position: int) -> None:
        """The batcher has received ``position``'s sample."""
        with self._lock:
            self._in_transit.pop(position, None)

    def failed(self, position: int) -> None:
        """``position`` failed (read or decode): its row, if any, is free."""
        with self._lock:
            self._in_transit.pop(position, None)
            self._leave([position])

    def assemble(
        self, positions: Sequence[int], items: Sequence[Placed]
    ) -> tuple[torch.Tensor, list[int]]:
        """The batch as one tensor, and its positions in row order."""
        with self._lock:
            host = self._pick_host(items, len(positions))
            tensor = None
            if host is not None:
                tensor, host.tensor, host.array, host.sealed = host.tensor, None, None, True
                host.held.clear()
        if host is None or tensor is None:
            tensor = self._new_batch(len(positions))
            np.stack([p.array for p in items], out=as_numpy(tensor))
            order = list(positions)
            moved = items
        else:
            order, moved = self._fill_host(tensor, host, positions, items)
        with self._lock:  # both the batcher and the training loop's threads assemble
            for placed in moved:
                if placed.slab is not None and placed.slab is not host:
                    placed.slab.held.discard(placed.row)
            self._leave(positions)
            self.copied_rows += len(moved)
            self.hosted += host is not None
            self.fresh += host is None
        for placed in moved:
            if placed.private is not None:
                self._spare.append(placed.private)
        return tensor, order

    # -- internals -----------------------------------------------------------------------
    def _pick_host(self, items: Sequence[Placed], size: int) -> Slab | None:
        """The slab with most of the batch's rows that can be sealed now, or None."""
        rows: dict[int, tuple[Slab, set[int]]] = {}
        for placed in items:
            if placed.slab is not None:
                entry = rows.setdefault(id(placed.slab), (placed.slab, set()))
                entry[1].add(placed.row)
        for slab, mine in sorted(rows.values(), key=lambda e: -len(e[1])):
            if (
                not slab.sealed
                and slab.tensor is not None
                and slab.writers == 0
                and slab.held <= mine  # no finished row of a later batch is overwritten
                and slab.tensor.shape[0] == size
                # A host holding few of the batch's rows would cost a copy of most of
                # them now and send most of its own batch to private tensors later.
                and 2 * len(mine) >= size
            ):
                return slab
        return None

    def _fill_host(
        self, tensor: torch.Tensor, host: Slab, positions: Sequence[int], items: Sequence[Placed]
    ) -> tuple[list[int], list[Placed]]:
        """Copy the batch's samples from elsewhere into the host's free rows."""
        order: list[int | None] = [None] * tensor.shape[0]
        moved: list[Placed] = []
        outsiders: list[tuple[int, Placed]] = []
        for position, placed in zip(positions, items, strict=True):
            if placed.slab is host:
                order[placed.row] = position
            else:
                outsiders.append((position, placed))
        free = (r for r, p in enumerate(order) if p is None)
        out = as_numpy(tensor)
        for (position, placed), row in zip(outsiders, free, strict=False):
            np.copyto(out[row], placed.array)
            order[row] = position
            moved.append(placed)
        return [p for p in order if p is not None], moved

    def _leave(self, positions: Sequence[int]) -> None:
        """Count positions that are done; drop a slab once all of its batch is (locked)."""
        size = self.plan.batch_size
        for position in positions:
            b = position // size
            self._gone[b] += 1
            if self._gone[b] == len(self.plan.batch_range(b)):
                del self._gone[b]
                slab = self._slabs.pop(b, None)
                if slab is not None and slab.tensor is not None:
                    self._recycle(slab.tensor)

    def _take_spare(self) -> torch.Tensor:
        try:
            return self._spare.pop()
        except IndexError:
            return self._new_sample()


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor; bfloat16 (which numpy lacks) as its int16 bit patterns."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()
