"""The pinned host arena: one buffer, handed out in slices for fetched bytes, reused.

Fetch threads ``acquire`` a slice, ``readinto`` it and hand the bytes (a memoryview of
the slice) to the batch decoder without a copy; the slice is ``release``-d once the
decode stream has consumed it. The arena's capacity is the memory bound: ``acquire``
BLOCKS while no free range fits, and never over-commits.

Allocation is first fit over a free list of (offset, size) ranges, merged with their
neighbours on release. Waiters are served in arrival order (a ticket queue), so a
large request is not starved by a stream of small ones.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpu_loader.sources import BufferTooSmallError
from gpu_loader.sources._io import check_size

if TYPE_CHECKING:
    from gpu_loader.sources import SampleIndex

# Slices start on 256-byte boundaries: what cudaMemcpyAsync and the decoders like best.
ALIGN = 256
_POLL_S = 0.05  # waits re-check the stop event this often


class ArenaTooSmallError(ValueError):
    """A sample is larger than the whole arena: it can never be fetched."""


class ArenaFullError(TimeoutError):
    """No room in the arena for a sample within the ``timeout`` given to ``acquire``."""


@dataclass(eq=False)
class Slice:
    """A range of the arena owned by one sample until released."""

    offset: int
    """Start in the arena, in bytes."""
    capacity: int
    """Bytes reserved (the request rounded up to ALIGN; less after `PinnedArena.shrink`)."""
    buffer: np.ndarray = field(repr=False)
    """The reserved bytes, a uint8 view into the arena."""
    arena: PinnedArena = field(repr=False)
    """The arena it came from."""
    generation: int = 0
    """The arena's reset count when the slice was handed out."""
    released: bool = False
    """Set by ``release``; a released slice must not be used."""

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the reserved bytes (for ``readinto``)."""
        return memoryview(self.buffer)  # type: ignore[arg-type]  # ndarray is a buffer

    def release(self) -> None:
        """Give the bytes back to the arena (once)."""
        self.arena.release(self)


@dataclass(frozen=True)
class ArenaStats:
    """A snapshot of the arena's use."""

    capacity: int
    """Total bytes."""
    in_use: int
    """Bytes held by live slices now."""
    peak_in_use: int
    """The most bytes ever held at once (never above capacity)."""
    live_slices: int
    """Slices acquired and not yet released."""
    acquires: int
    """Slices handed out so far."""
    waits: int
    """Acquires that had to wait for space."""


class PinnedArena:
    """A bounded, reused host buffer for fetched bytes (pinned when the allocator pins).

    ``allocator(nbytes)`` returns a flat uint8 array: ``DeviceRuntime.alloc_pinned`` on
    CUDA (page-locked, so the decoder's host-to-device copies run asynchronously), plain
    NumPy memory in the stand-in. ``poison`` (tests) overwrites released bytes with
    ``0xEE``, so bytes read after release are caught rather than silently stale.
    ``lazy`` allocates the buffer at the first acquire instead of here: for an arena
    that may never be used (the GPU path's staging area for decoded non-JPEG pixels,
    on a dataset of JPEGs), page-locked memory is a scarce resource.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        allocator: Callable[[int], np.ndarray] | None = None,
        poison: bool = False,
        lazy: bool = False,
    ) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes < ALIGN:
            raise ValueError(f"`capacity_bytes` must be an int >= {ALIGN}, got {capacity_bytes!r}")
        capacity = capacity_bytes - capacity_bytes % ALIGN
        self._alloc = allocator or (lambda n: np.empty(n, dtype=np.uint8))
        self.capacity = capacity
        self._buf: np.ndarray | None = None if lazy else self._allocate()
        self._poison = poison
        self._free: list[tuple[int, int]] = [(0, capacity)]  # sorted by offset
        self._cond = threading.Condition()
        self._tickets: collections.deque[int] = collections.deque()
        self._next_ticket = 0
        self._in_use = 0
        self._peak = 0
        self._live = 0
        self._acquires = 0
        self._waits = 0
        self.overflow_warned = False
        """Whether a fetch has said that it read outside this arena (said once per arena:
        the loader keeps its arena across epochs)."""
        self._generation = 0  # bumped by reset(): older slices are then already given back

    def _allocate(self) -> np.ndarray:
        buf = np.asarray(self._alloc(self.capacity))
        if buf.dtype != np.uint8 or buf.ndim != 1 or buf.size < self.capacity:
            raise ValueError(
                f"the arena allocator must return a flat uint8 array of >= {self.capacity} "
                f"bytes, got {buf.dtype} {buf.shape}"
            )
        return buf[: self.capacity]

    @property
    def allocated(self) -> bool:
        """Whether the buffer exists (a ``lazy`` arena allocates at its first acquire)."""
        return self._buf is not None

    # -- allocation --------------------------------------------------------------------
    def acquire(
        self,
        nbytes: int,
        *,
        timeout: float | None = None,
        stop_event: threading.Event | None = None,
        key: str = "?",
    ) -> Slice:
        """A slice of at least ``nbytes`` bytes; blocks while the arena has no room.

        Raises ArenaTooSmallError when ``nbytes`` exceeds the whole arena, ArenaFullError
        (a TimeoutError) after ``timeout`` seconds, and InterruptedError once ``stop_event`` is set.
        """
        size = self._rounded(nbytes, key)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._buf is None:  # lazy: the first acquire allocates
                self._buf = self._allocate()
            buf = self._buf
            ticket = self._next_ticket
            self._next_ticket += 1
            self._tickets.append(ticket)
            try:
                waited = False
                while True:
                    if self._tickets[0] == ticket:
                        offset = self._take(size)
                        if offset is not None:
                            break
                    if stop_event is not None and stop_event.is_set():
                        raise InterruptedError(f"stopped while waiting for arena room for {key!r}")
                    left = _POLL_S if deadline is None else deadline - time.monotonic()
                    if left <= 0:
                        raise ArenaFullError(
                            f"no room in the {self.capacity}-byte pinned arena for {size} bytes "
                            f"of sample {key!r} after {timeout} s ({self._in_use} bytes held by "
                            f"{self._live} slices); make the arena larger than the bytes of the "
                            "samples in flight (at least a few decode batches)"
                        )
                    waited = True
                    self._cond.wait(min(left, _POLL_S))
            finally:
                self._tickets.remove(ticket)
                self._cond.notify_all()  # the next ticket may now be at the head
            self._in_use += size
            self._peak = max(self._peak, self._in_use)
            self._live += 1
            self._acquires += 1
            self._waits += int(waited)
        return Slice(offset, size, buf[offset : offset + size], self, self._generation)

    def try_acquire(self, nbytes: int, *, key: str = "?") -> Slice | None:
        """A slice of at least ``nbytes`` bytes if there is room now, else None (no wait).

        For optional uses of the arena (decoded pixels staged for an asynchronous
        upload): they never queue behind, or hold up, the fetches that need it.
        """
        try:
            return self.acquire(nbytes, timeout=0, key=key)
        except (ArenaFullError, ArenaTooSmallError):
            return None

    def release(self, piece: Slice) -> None:
        """Give a slice back; its bytes may be handed out again at once."""
        with self._cond:
            if piece.released:
                raise ValueError(f"arena slice at offset {piece.offset} was released twice")
            piece.released = True
            if piece.generation != self._generation:
                return  # reclaimed by reset() already
            if self._poison:
                piece.buffer.fill(0xEE)
            self._give(piece.offset, piece.capacity)
            self._in_use -= piece.capacity
            self._live -= 1
            self._cond.notify_all()

    def shrink(self, piece: Slice, nbytes: int) -> None:
        """Give back the bytes of ``piece`` past its first ``nbytes`` (rounded up to
        ALIGN): for a slice sized by a guess, once the read has said what it needed."""
        keep = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._cond:
            if piece.released:
                raise ValueError(f"arena slice at offset {piece.offset} was already released")
            if keep >= piece.capacity or piece.generation != self._generation:
                return
            tail = piece.capacity - keep
            if self._poison:
                piece.buffer[keep:].fill(0xEE)
            self._give(piece.offset + keep, tail)
            self._in_use -= tail
            piece.capacity, piece.buffer = keep, piece.buffer[:keep]
            self._cond.notify_all()

    def reset(self) -> int:
        """Reclaim every slice still out; returns how many there were.

        For the end of an epoch: samples dropped in queues when a pipeline stops never
        reach the stage that releases them. Call it only once the pipeline is closed and
        the device has passed every decode (no slice can still be read).
        """
        with self._cond:
            lost = self._live
            self._free = [(0, self.capacity)]
            self._in_use = 0
            self._live = 0
            self._generation += 1
            self._cond.notify_all()
        return lost

    def stats(self) -> ArenaStats:
        with self._cond:
            return ArenaStats(
                self.capacity, self._in_use, self._peak, self._live, self._acquires, self._waits
            )

    # -- fetching ----------------------------------------------------------------------
    def fetch(
        self,
        source: SampleIndex,
        index: int,
        *,
        key: str,
        guess: int = 1 << 20,
        timeout: float | None = None,
        stop_event: threading.Event | None = None,
    ) -> tuple[Slice, memoryview]:
        """Read sample ``index`` straight into a slice; returns the slice and its bytes.

        The slice is sized from ``source.nbytes`` when known, else ``guess`` (at most a
        sixteenth of the arena); a file that
        turns out larger is retried once with its exact size (from the bytes the failed
        read already holds, where it had to read them whole: a remote file is not
        downloaded twice), and the rest of a guessed slice is given back once the read
        has said how much it needed (else every sample of unknown size, a `FileList` of
        URLs, held ``guess`` bytes in flight). The slice is released if the read fails.
        """
        known = source.nbytes(index)
        if known is not None:
            check_size(key, known)  # the byte limit first: not after waiting for room
        # A guess is at most a sixteenth of the arena: a guess as large as the arena
        # waits until every other slice is back, however small the files.
        want = known if known is not None else min(guess, max(ALIGN, self.capacity // 16))
        read: bytes | None = None
        for _ in range(2):
            piece = self.acquire(max(want, 1), timeout=timeout, stop_event=stop_event, key=key)
            try:
                if read is not None and len(read) <= len(piece.view):
                    count = len(read)
                    piece.view[:count] = read
                else:
                    count = source.readinto(index, piece.view)
            except BufferTooSmallError as exc:
                self.release(piece)
                want = exc.nbytes  # the exact size, learnt from the failed read
                check_size(key, want)
                read = exc.data
                continue
            except BaseException:
                self.release(piece)
                raise
            if known is None:
                self.shrink(piece, count)
            return piece, piece.view[:count]
        raise RuntimeError(f"sample {key!r} grew while it was being read; it changed on disk")

    # -- free list ---------------------------------------------------------------------
    def _rounded(self, nbytes: int, key: str) -> int:
        if not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"`nbytes` must be an int >= 1, got {nbytes!r}")
        size = -(-nbytes // ALIGN) * ALIGN
        if size > self.capacity:
            raise ArenaTooSmallError(
                f"sample {key!r} is {nbytes} bytes, larger than the whole pinned arena "
                f"({self.capacity} bytes); raise the arena size above the largest file"
            )
        return size

    def _take(self, size: int) -> int | None:
        for i, (offset, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[i]
                else:
                    self._free[i] = (offset + size, free - size)
                return offset
        return None

    def _give(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._free, (offset, 0))
        # Merge with the free range after, then with the one before.
        if i < len(self._free) and offset + size == self._free[i][0]:
            size += self._free[i][1]
            del self._free[i]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            offset, size = self._free[i - 1][0], self._free[i - 1][1] + size
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (offset, size))
