"""PinnedArena: slices, the blocking bound, no over-commit, fetch with unknown or wrong sizes."""

from __future__ import annotations

import threading
import time
from typing import Any

import fsspec
import numpy as np
import pytest

from gpu_loader.cuda._arena import ALIGN, ArenaTooSmallError, PinnedArena
from gpu_loader.sources import FileList
from gpu_loader.sources._io import max_file_bytes, set_max_file_bytes


def test_slices_are_aligned_disjoint_and_reused() -> None:
    arena = PinnedArena(8 * ALIGN)
    a, b = arena.acquire(10), arena.acquire(ALIGN + 1)
    assert (a.offset, a.capacity, b.offset, b.capacity) == (0, ALIGN, ALIGN, 2 * ALIGN)
    a.view[:3] = b"abc"
    assert bytes(b.view[:3]) != b"abc" or b.offset != a.offset
    a.release()
    c = arena.acquire(ALIGN)
    assert c.offset == 0  # the freed range is handed out again
    with pytest.raises(ValueError, match="released twice"):
        a.release()
    b.release()
    c.release()
    assert arena.stats().in_use == 0
    # Everything merged back: the whole arena fits in one slice again.
    arena.acquire(8 * ALIGN).release()


def test_acquire_blocks_when_full_until_a_release() -> None:
    arena = PinnedArena(4 * ALIGN)
    held = arena.acquire(4 * ALIGN)
    got: list[float] = []

    def waiter() -> None:
        arena.acquire(ALIGN).release()
        got.append(time.monotonic())

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    assert got == []  # still blocked: the arena is full
    released_at = time.monotonic()
    held.release()
    t.join(5)
    assert got and got[0] >= released_at
    assert arena.stats().waits == 1


def test_try_acquire_never_waits() -> None:
    arena = PinnedArena(4 * ALIGN)
    held = arena.acquire(3 * ALIGN)
    t0 = time.monotonic()
    assert arena.try_acquire(2 * ALIGN, key="k") is None  # no room now
    assert arena.try_acquire(5 * ALIGN, key="k") is None  # larger than the whole arena
    assert time.monotonic() - t0 < 0.05
    got = arena.try_acquire(ALIGN)
    assert got is not None and got.offset == 3 * ALIGN
    assert arena.stats().waits == 0
    got.release()
    held.release()
    assert arena.stats().in_use == 0


def test_a_lazy_arena_allocates_once_at_its_first_acquire() -> None:
    calls: list[int] = []

    def alloc(n: int) -> np.ndarray:
        calls.append(n)
        return np.empty(n, dtype=np.uint8)

    arena = PinnedArena(4 * ALIGN + 5, allocator=alloc, lazy=True)
    assert calls == [] and not arena.allocated and arena.stats().capacity == 4 * ALIGN
    assert arena.try_acquire(5 * ALIGN) is None  # too large: still nothing allocated
    assert calls == []
    a = arena.try_acquire(ALIGN)
    b = arena.acquire(2 * ALIGN)
    assert a is not None and calls == [4 * ALIGN] and arena.allocated
    assert b.buffer.base is a.buffer.base  # one buffer
    a.release()
    b.release()
    arena.reset()
    arena.acquire(ALIGN).release()
    assert calls == [4 * ALIGN]  # kept across reset()
    bad = PinnedArena(ALIGN, allocator=lambda n: np.empty(n, dtype=np.float32), lazy=True)
    with pytest.raises(ValueError, match="flat uint8 array"):
        bad.acquire(1)


def test_try_acquire_does_not_jump_the_queue() -> None:
    arena = PinnedArena(4 * ALIGN)
    held = arena.acquire(3 * ALIGN)
    waiting = threading.Thread(target=lambda: arena.acquire(2 * ALIGN).release())
    waiting.start()
    time.sleep(0.1)  # the thread now waits for room at the head of the queue
    # One ALIGN is free, but a fetch is waiting: an optional use must not take it first.
    assert arena.try_acquire(ALIGN) is None
    held.release()
    waiting.join(5)
    assert not waiting.is_alive() and arena.stats().in_use == 0


def test_timeout_and_stop_event() -> None:
    arena = PinnedArena(2 * ALIGN)
    held = arena.acquire(2 * ALIGN)
    with pytest.raises(TimeoutError, match="'k1'"):
        arena.acquire(1, timeout=0.05, key="k1")
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    with pytest.raises(InterruptedError):
        arena.acquire(1, stop_event=stop)
    held.release()
    assert arena.stats().live_slices == 0


def test_larger_than_the_arena_is_refused_with_the_key() -> None:
    arena = PinnedArena(4 * ALIGN)
    with pytest.raises(ArenaTooSmallError, match=r"'big\.jpg'"):
        arena.acquire(4 * ALIGN + 1, key="big.jpg")


def test_never_over_commits_under_contention() -> None:
    arena = PinnedArena(16 * ALIGN)
    owner = np.zeros(16 * ALIGN, dtype=np.int64)  # who holds each byte
    lock = threading.Lock()
    errors: list[str] = []

    def worker(tid: int) -> None:
        rng = np.random.default_rng(tid)
        for _ in range(200):
            piece = arena.acquire(int(rng.integers(1, 6 * ALIGN)), timeout=10)
            span = slice(piece.offset, piece.offset + piece.capacity)
            with lock:
                if owner[span].any():
                    errors.append(f"overlap at {piece.offset}")
                owner[span] = tid + 1
                if arena.stats().in_use > arena.capacity:
                    errors.append("over-committed")
            time.sleep(float(rng.random()) * 1e-4)
            with lock:
                owner[span] = 0
            piece.release()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stats = arena.stats()
    assert errors == []
    assert stats.in_use == 0 and stats.acquires == 1200
    assert stats.peak_in_use <= arena.capacity
    assert stats.waits > 0  # the bound was actually hit


def test_a_large_request_is_not_starved() -> None:
    arena = PinnedArena(8 * ALIGN)
    small = [arena.acquire(ALIGN) for _ in range(8)]
    done = threading.Event()

    def big() -> None:
        arena.acquire(8 * ALIGN, timeout=5).release()
        done.set()

    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.05)
    # Small requests queued after the big one must wait their turn, not take freed space.
    late = threading.Thread(target=lambda: arena.acquire(ALIGN, timeout=5).release())
    late.start()
    for piece in small:
        piece.release()
    t.join(5)
    late.join(5)
    assert done.is_set()


class _NoSizes(FileList):
    def nbytes(self, i: int) -> int | None:
        return None  # like a remote source: the size is learnt from the read


def test_fetch_unknown_size_retries_with_the_exact_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    payload = bytes(range(256)) * 20  # 5120 bytes, larger than the first guess
    (tmp_path / "x.bin").write_bytes(payload)
    source = _NoSizes([(tmp_path / "x.bin", 0)])
    arena = PinnedArena(64 * ALIGN)
    piece, data = arena.fetch(source, 0, key="x.bin", guess=ALIGN)
    assert bytes(data) == payload and piece.capacity >= len(payload)
    assert arena.stats().acquires == 2 and arena.stats().live_slices == 1
    piece.release()


def test_fetch_refuses_a_file_larger_than_the_arena(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "huge.jpg").write_bytes(b"\0" * (8 * ALIGN))
    arena = PinnedArena(4 * ALIGN)
    with pytest.raises(ArenaTooSmallError, match=r"huge\.jpg"):
        arena.fetch(FileList([(tmp_path / "huge.jpg", 0)]), 0, key=str(tmp_path / "huge.jpg"))
    assert arena.stats().live_slices == 0


def test_the_byte_limit_is_checked_before_waiting_for_room(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # As on the CPU path, and at once: not after a wait for arena room (3 blocks, the
    # arena full), nor reported as too large for the arena (8 blocks).
    arena = PinnedArena(4 * ALIGN)
    held = arena.acquire(4 * ALIGN)  # the arena is full
    limit = max_file_bytes()
    set_max_file_bytes(2 * ALIGN)
    try:
        for blocks in (3, 8):
            path = tmp_path / f"big{blocks}.jpg"
            path.write_bytes(b"\0" * (blocks * ALIGN))
            start = time.monotonic()
            with pytest.raises(ValueError, match=rf"big{blocks}\.jpg.* over the .*-byte limit"):
                arena.fetch(FileList([(path, 0)]), 0, key=str(path), timeout=5)
            assert time.monotonic() - start < 1.0
        held.release()
        held = arena.acquire(3 * ALIGN)  # room for a first guess: the size is learnt by a read
        path = tmp_path / "big3.jpg"
        with pytest.raises(ValueError, match="-byte limit"):
            arena.fetch(_NoSizes([(path, 0)]), 0, key=str(path), guess=ALIGN, timeout=5)
    finally:
        set_max_file_bytes(limit)
        held.release()
    assert arena.stats().live_slices == 0


def test_fetch_releases_on_a_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    arena = PinnedArena(4 * ALIGN)
    source = _NoSizes([(tmp_path / "missing.jpg", 0)])
    with pytest.raises(FileNotFoundError):
        arena.fetch(source, 0, key="missing.jpg")
    assert arena.stats().live_slices == 0


def test_poison_marks_released_bytes() -> None:
    arena = PinnedArena(2 * ALIGN, poison=True)
    piece = arena.acquire(4)
    piece.view[:4] = b"JPEG"
    view = piece.buffer
    piece.release()
    assert bytes(view[:4]) == b"\xee" * 4


def test_bad_allocator_and_capacity() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        PinnedArena(10)
    with pytest.raises(ValueError, match="flat uint8"):
        PinnedArena(1024, allocator=lambda n: np.empty(n // 8, np.float64))


def test_reset_reclaims_slices_lost_at_a_stop() -> None:
    arena = PinnedArena(4 * ALIGN)
    lost = [arena.acquire(ALIGN) for _ in range(3)]
    kept = lost.pop()
    assert arena.reset() == 3
    assert arena.stats().in_use == 0
    whole = arena.acquire(4 * ALIGN)  # all of it is free again
    kept.release()  # a slice from before the reset: already reclaimed, no double free
    assert arena.stats().in_use == 4 * ALIGN
    whole.release()
    assert arena.stats().live_slices == 0


@pytest.mark.parametrize("sizes_known", [True, False])
def test_fetch_hands_back_exactly_the_files_bytes(tmp_path, sizes_known: bool) -> None:  # type: ignore[no-untyped-def]
    # The slice is rounded up (and the first guess may be larger still): bytes past the
    # file's end would be another sample's, left in the arena.
    arena = PinnedArena(64 * ALIGN)
    stale = arena.acquire(8 * ALIGN, key="earlier")
    stale.view[:] = b"\xab" * len(stale.view)
    stale.release()
    payload = bytes(range(200)) * 5  # 1000 bytes: not a multiple of ALIGN
    (tmp_path / "x.bin").write_bytes(payload)
    items = [(tmp_path / "x.bin", 0)]
    source = FileList(items) if sizes_known else _NoSizes(items)
    piece, data = arena.fetch(source, 0, key="x.bin", guess=4 * ALIGN)
    assert len(data) == len(payload) and bytes(data) == payload
    piece.release()


def test_a_remote_file_larger_than_the_guess_is_downloaded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A remote file is read whole to learn its size; the retry in a slice of that size
    # copied nothing from that read and downloaded the file again.
    fs = fsspec.filesystem("memory")
    payload = bytes(range(256)) * 20  # 5120 bytes, larger than the first guess
    fs.pipe_file("/arena-once/x.bin", payload)
    reads: list[str] = []
    original = type(fs).cat_file

    def counted(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(path)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(type(fs), "cat_file", counted)
    source = FileList([("memory://arena-once/x.bin", 0)])
    assert source.nbytes(0) is None
    arena = PinnedArena(64 * ALIGN)
    try:
        piece, data = arena.fetch(source, 0, key="x.bin", guess=ALIGN)
        assert bytes(data) == payload and len(reads) == 1
        assert arena.stats().acquires == 2 and arena.stats().live_slices == 1
        piece.release()
    finally:
        fs.rm("/arena-once", recursive=True)


def test_a_guessed_slice_gives_back_what_its_read_did_not_need(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A sample of unknown size (a FileList of URLs) is read into a slice of `guess`
    # bytes; the slice held them all until its batch was decoded, so an arena four
    # guesses large held four samples in flight however small they were (QA59's test
    # hung on a 1 MiB arena with the default 1 MiB guess).
    # Every file fits the guess (no retry): each read is into a slice of 4 * ALIGN, and
    # 20 of them (20,000 bytes) fit the 64 * ALIGN arena (16,384) only if given back.
    payloads = [bytes([i]) * (300 + 35 * i) for i in range(20)]
    for i, payload in enumerate(payloads):
        (tmp_path / f"{i}.bin").write_bytes(payload)
    source = _NoSizes([(tmp_path / f"{i}.bin", 0) for i in range(20)])
    arena = PinnedArena(64 * ALIGN, poison=True)
    held = [arena.fetch(source, i, key=f"{i}.bin", guess=4 * ALIGN, timeout=1) for i in range(20)]
    for (piece, data), payload in zip(held, payloads, strict=True):
        assert bytes(data) == payload and piece.capacity == -(-len(payload) // ALIGN) * ALIGN
    stats = arena.stats()
    assert stats.acquires == 20 and stats.waits == 0  # one read each, none waited
    assert stats.live_slices == 20 and stats.in_use == sum(p.capacity for p, _ in held)
    for piece, _ in held:
        piece.release()
    stats = arena.stats()
    assert stats.in_use == 0 and arena.acquire(64 * ALIGN, timeout=0).capacity == 64 * ALIGN


def test_a_guess_never_asks_for_the_whole_arena(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The default guess (1 MiB) in a 1 MiB arena asked for all of it: the second sample
    # of unknown size waited until the first was released.
    payload = bytes(range(256)) * 300  # 76,800 bytes: more than 1 MiB / 16, so a retry
    for i in range(3):
        (tmp_path / f"{i}.bin").write_bytes(payload)
    source = _NoSizes([(tmp_path / f"{i}.bin", 0) for i in range(3)])
    arena = PinnedArena(1 << 20)
    held = [arena.fetch(source, i, key=f"{i}.bin", timeout=1) for i in range(3)]
    assert all(bytes(data) == payload for _, data in held)
    assert arena.stats().waits == 0 and arena.stats().live_slices == 3
    for piece, _ in held:
        piece.release()
