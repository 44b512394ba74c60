"""A discrete-event loader for the batcher tests: workers, an in-flight window, a fake clock."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_loader.batching import Batch, OrderedBatcher, StragglerBatcher

Batcher = OrderedBatcher[tuple[str, int]] | StragglerBatcher[tuple[str, int]]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start_and_push(
    batcher: OrderedBatcher[int] | StragglerBatcher[int], started: int, ready: Iterable[int]
) -> None:
    """Start positions ``0 .. started - 1``, then complete those in ``ready`` (in that
    order, each with its position as its item)."""
    for p in range(started):
        batcher.started(p)
    for p in ready:
        batcher.push(p, p)


@dataclass
class Run:
    batches: list[Batch[tuple[str, int]]] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)
    calls: dict[int, int] = field(default_factory=dict)  # completions per position
    stopped_early: bool = False

    def delivered(self) -> list[int]:
        return [p for b in self.batches for p in b.positions]


def simulate(
    batcher: Batcher,
    clock: FakeClock,
    durations: Sequence[float],
    failures: Sequence[bool],
    *,
    threads: int,
    window: int,
    order: Sequence[int],
    stop_after: int | None = None,
) -> Run:
    """Start ``order`` on ``threads`` workers, at most ``window`` samples in flight.

    In flight = started and not yet handed out in a batch nor failed, as the loader counts.
    Each position completes ``durations[p]`` after it starts, or fails if ``failures[p]``.
    """
    run = Run()
    events: list[tuple[float, int]] = []
    nxt, free, in_flight = 0, threads, 0
    while True:
        while nxt < len(order) and free and in_flight < window:
            p = order[nxt]
            nxt += 1
            batcher.started(p)
            heapq.heappush(events, (clock.now + durations[p], p))
            free -= 1
            in_flight += 1
        while (batch := batcher.pop()) is not None:
            run.batches.append(batch)
            in_flight -= len(batch)
            if stop_after is not None and len(run.batches) >= stop_after:
                run.stopped_early = True
                return run
        if not events:
            if nxt < len(order) and free and in_flight < window:
                continue  # the batches just handed out freed window slots
            if nxt < len(order):
                raise AssertionError(f"deadlock: window full, {batcher.stats()}")
            break
        clock.now, p = heapq.heappop(events)
        free += 1
        run.calls[p] = run.calls.get(p, 0) + 1
        if failures[p]:
            batcher.fail(p)
            run.failed.add(p)
            in_flight -= 1
        else:
            batcher.push(p, ("item", p))
    run.batches.extend(batcher.pop_final())
    return run


def check_exactly_once(run: Run, kept: int, previous: Sequence[int] = (), failed: Any = ()) -> None:
    """Every kept position delivered once or failed; items match their positions."""
    delivered = list(previous) + run.delivered()
    assert len(delivered) == len(set(delivered)), "a position was delivered twice"
    assert not set(delivered) & (run.failed | set(failed)), "a failed position was delivered"
    assert set(delivered) | run.failed | set(failed) == set(range(kept))
    for batch in run.batches:
        assert [item[1] for item in batch.items] == list(batch.positions)
        assert list(batch.positions) == sorted(batch.positions)
