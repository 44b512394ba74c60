"""The batchers are driven from several threads at once: source, workers, consumer."""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest

from gpu_loader.batching import Batch, OrderedBatcher, StragglerBatcher


@pytest.mark.parametrize("mode", ["straggler", "ordered"])
def test_concurrent_started_push_fail_and_pop(mode: str) -> None:
    n, size = 4000, 16
    b: StragglerBatcher[int] | OrderedBatcher[int]
    b = (
        StragglerBatcher(size, n, max_delay_batches=2)
        if mode == "straggler"
        else OrderedBatcher(size, n)
    )
    todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    failed = set(range(0, n, 97))

    def source() -> None:
        for p in range(n):
            b.started(p)
            todo.put(p)
        for _ in range(4):
            todo.put(None)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while (p := todo.get()) is not None:
            if rng.random() < 0.01:
                threading.Event().wait(0.001)  # an occasional straggler
            if p in failed:
                b.fail(p)
            else:
                b.push(p, p)

    threads = [threading.Thread(target=source)]
    threads += [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    batches: list[Batch[int]] = []
    while any(t.is_alive() for t in threads):
        while (batch := b.pop()) is not None:
            batches.append(batch)
        time.sleep(0.0005)  # do not starve the feeding threads on a 2-core machine
    for t in threads:
        t.join()
    batches += b.pop_final()
    delivered = [p for x in batches for p in x.positions]
    assert sorted(delivered) == sorted(set(range(n)) - failed)
    assert len(delivered) == len(set(delivered))
    assert all(x.max_delay <= 2 for x in batches)
    assert b.stats().failed == len(failed)
