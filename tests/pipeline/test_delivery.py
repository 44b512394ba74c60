"""Exactly-once delivery, ordering, generator ops, SKIP, aggregate, worker_init."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_loader.pipeline import SKIP, PipelineBuilder

from ._helpers import CallCounter


def jitter(x: int) -> int:
    # Random short waits so workers finish out of order.
    time.sleep(random.random() * 0.0003)
    return x


@pytest.mark.parametrize("order", ["input", "completion"])
@pytest.mark.parametrize("concurrency", [1, 2, 4, 8, 16])
def test_exactly_once(concurrency: int, order: str) -> None:
    n = 300
    counter = CallCounter()

    def op(x: int) -> int:
        counter.add(x)
        return jitter(x) * 10

    p = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(op, concurrency=concurrency, output_order=order)  # type: ignore[arg-type]
        .pipe(jitter, concurrency=concurrency, output_order=order)  # type: ignore[arg-type]
        .add_sink(3)
        .build()
    )
    with p:
        out = list(p)
    assert Counter(out) == Counter(x * 10 for x in range(n))
    assert all(c == 1 for c in counter.calls.values()) and len(counter.calls) == n
    if order == "input":
        assert out == [x * 10 for x in range(n)]


def test_completion_order_really_reorders() -> None:
    # Guards the ordering test: without reordering this would be in input order.
    def op(x: int) -> int:
        if x == 0:
            time.sleep(0.2)
        return x

    p = PipelineBuilder().add_source(range(20)).pipe(op, concurrency=4, output_order="completion")
    with p.add_sink(2).build() as pipeline:
        out = list(pipeline)
    assert sorted(out) == list(range(20))
    assert out[0] != 0


def test_input_order_with_a_slow_head_item() -> None:
    def op(x: int) -> int:
        if x % 7 == 0:
            time.sleep(0.01)
        return x

    p = PipelineBuilder().add_source(range(100)).pipe(op, concurrency=6).add_sink(2).build()
    with p:
        assert list(p) == list(range(100))


@pytest.mark.parametrize("order", ["input", "completion"])
def test_generator_op_zero_or_more_outputs(order: str) -> None:
    def expand(x: int) -> Iterator[tuple[int, int]]:
        for j in range(x % 3):  # 0, 1 or 2 outputs
            yield (x, j)

    p = (
        PipelineBuilder()
        .add_source(range(60))
        .pipe(expand, concurrency=4, output_order=order)  # type: ignore[arg-type]
        .add_sink(2)
        .build()
    )
    with p:
        out = list(p)
    expected = [(x, j) for x in range(60) for j in range(x % 3)]
    assert sorted(out) == expected
    if order == "input":
        assert out == expected


def test_generator_op_object_with_generator_call() -> None:
    class Pairs:
        def __call__(self, x: int) -> Iterator[int]:
            yield x
            yield x

    p = PipelineBuilder().add_source(range(5)).pipe(Pairs()).add_sink(2).build()
    with p:
        assert list(p) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_skip_drops_without_failure(concurrency: int) -> None:
    def odd_only(x: int) -> Any:
        return x if x % 2 else SKIP

    p = PipelineBuilder().add_source(range(50)).pipe(odd_only, concurrency=concurrency)
    pipeline = p.add_sink(2).build()
    with pipeline:
        out = list(pipeline)
    assert out == list(range(1, 50, 2))
    stage = pipeline.stats().stages[1]
    assert (stage.skipped, stage.failures, stage.tasks_done) == (25, 0, 50)
    assert pipeline.failures() == []


@pytest.mark.parametrize(("drop_last", "sizes"), [(False, [4, 4, 2]), (True, [4, 4])])
def test_aggregate(drop_last: bool, sizes: list[int]) -> None:
    p = PipelineBuilder().add_source(range(10)).aggregate(4, drop_last=drop_last)
    pipeline = p.add_sink(2).build()
    with pipeline:
        out = list(pipeline)
    assert [len(b) for b in out] == sizes
    assert [x for b in out for x in b] == list(range(sum(sizes)))


def test_aggregate_exact_multiple_has_no_empty_tail() -> None:
    pipeline = PipelineBuilder().add_source(range(8)).aggregate(4).add_sink(2).build()
    with pipeline:
        assert list(pipeline) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_disaggregate_inverts_aggregate() -> None:
    pipeline = (
        PipelineBuilder()
        .add_source(range(23))
        .aggregate(5)
        .pipe(lambda batch: [x * 2 for x in batch], concurrency=2)
        .disaggregate()
        .add_sink(2)
        .build()
    )
    with pipeline:
        assert list(pipeline) == [x * 2 for x in range(23)]


def test_empty_source() -> None:
    pipeline = PipelineBuilder().add_source([]).pipe(jitter, concurrency=4).aggregate(3)
    with pipeline.add_sink(2).build() as p:
        assert list(p) == []


@pytest.mark.parametrize("order", ["input", "completion"])
def test_worker_init_runs_once_per_worker_thread(order: str) -> None:
    inits: list[int] = []
    lock = threading.Lock()

    def init() -> dict[str, int]:
        with lock:
            inits.append(threading.get_ident())
        return {"thread": threading.get_ident()}

    def op(x: int, state: dict[str, int]) -> tuple[int, bool]:
        time.sleep(0.001)
        return x, state["thread"] == threading.get_ident()

    p = (
        PipelineBuilder()
        .add_source(range(40))
        .pipe(op, concurrency=3, output_order=order, worker_init=init)  # type: ignore[arg-type]
        .add_sink(2)
        .build()
    )
    with p:
        out = list(p)
    assert sorted(x for x, _ in out) == list(range(40))
    assert all(same_thread for _, same_thread in out)
    assert len(inits) == 3 and len(set(inits)) == 3


def test_iterate_with_idle_ticks_yields_idle_while_nothing_arrives() -> None:
    from gpu_loader.pipeline import IDLE

    gate = threading.Event()

    def op(x: int) -> int:
        if x == 2:
            gate.wait(5)  # held until the consumer has seen idle ticks
        return x

    p = PipelineBuilder().add_source(range(4)).pipe(op, concurrency=1).add_sink(2).build()
    seen: list[Any] = []
    with p:
        for item in p.iterate(idle_s=0.02):
            seen.append(item)
            if sum(i is IDLE for i in seen) == 3:
                gate.set()
    outputs = [i for i in seen if i is not IDLE]
    assert outputs == [0, 1, 2, 3]  # every output, in order, exactly once
    idle_at = [k for k, item in enumerate(seen) if item is IDLE]
    assert len(idle_at) >= 3 and seen.index(2) > idle_at[2]  # ticks came while 2 was held
    assert repr(IDLE) == "IDLE"


def test_iterate_refuses_a_bad_idle_interval() -> None:
    p = PipelineBuilder().add_source(range(2)).pipe(lambda x: x).add_sink(1).build()
    with p, pytest.raises(ValueError, match="idle_s"):
        p.iterate(idle_s=0)
