"""Hostile ops, errors and arguments: each ends in a recorded failure or a clear error,
never a hang, a false failure or a quietly disabled feature (QA52's cases)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_loader.pipeline import PipelineBuilder, PipelineFailure, SlowLane


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


def consume(p: Any, limit_s: float = 20.0) -> list[Any]:
    """The pipeline's outputs, or the error it raised, from a thread with a deadline: a hang
    fails the test instead of stalling the suite."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            with p:
                box["out"] = list(p)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the consumer hung"
    if "error" in box:
        raise box["error"]
    return box["out"]


def test_a_source_error_whose_str_raises_stops_the_run() -> None:
    def source() -> Iterator[int]:
        yield 1
        raise BadStr()

    with pytest.raises(
        PipelineFailure, match="stage 'source' failed: BadStr: <str\\(\\) raised"
    ) as info:
        consume(PipelineBuilder().add_source(source()).add_sink().build())
    assert isinstance(info.value.exceptions[0], BadStr)


def test_an_op_error_whose_str_raises_is_a_recorded_failure() -> None:
    def op(x: int) -> int:
        if x == 3:
            raise BadStr()
        return x

    p = PipelineBuilder().add_source(range(6)).pipe(op, concurrency=2).add_sink().build()
    assert sorted(consume(p)) == [0, 1, 2, 4, 5]
    (record,) = p.failures()
    assert record.key == "3" and str(record) == "BadStr: <str() raised RuntimeError>"


def test_worker_init_raising_such_an_error_keeps_it() -> None:
    def init() -> None:
        raise BadStr()

    p = PipelineBuilder().add_source(range(3)).pipe(lambda x, s: x, worker_init=init).add_sink()
    with pytest.raises(PipelineFailure) as info:
        consume(p.build())
    assert isinstance(info.value.exceptions[0], BadStr)


def test_an_error_with_a_tuple_of_notes_and_an_unprintable_key_are_plain_failures() -> None:
    class TupleNotes(Exception):
        __notes__ = ()

    class Key:
        def __str__(self) -> str:
            raise RuntimeError("no key")

    class Item:
        def __init__(self, i: int) -> None:
            self.i, self.key = i, Key()

    def op(item: Item) -> int:
        if item.i == 1:
            raise TupleNotes("bad one")
        if item.i == 2:
            raise ValueError("bad two")
        return item.i

    source = [Item(i) for i in range(4)]
    p = PipelineBuilder().add_source(source).pipe(op, max_failures=None).add_sink().build()
    assert sorted(consume(p)) == [0, 3]
    failures = sorted(p.failures(), key=lambda r: str(r))
    assert [str(r) for r in failures] == ["TupleNotes: bad one", "ValueError: bad two"]
    assert all("str() of its key raised RuntimeError" in r.key for r in failures)
    assert failures[0].error.__notes__[-1].startswith("stage: op, sample: ")


@pytest.mark.parametrize("how", ["break", "close"])
def test_an_input_order_generator_stopped_between_yields_is_no_failure(how: str) -> None:
    def op(x: int) -> Iterator[tuple[int, int]]:
        for i in range(20):
            time.sleep(0.005)
            yield x, i

    p = PipelineBuilder().add_source(range(40)).pipe(op, concurrency=4).add_sink().build()
    with p:
        for n, _ in enumerate(p):
            if n == 30:
                if how == "break":
                    break
                p.close()
    assert p.failures() == []
    assert all(s.failures == 0 for s in p.stats().stages)


class Threshold:
    def __init__(self, limit: Any) -> None:
        self._limit = limit

    def observe(self, duration_s: float) -> None:
        pass

    def limit(self) -> Any:
        if isinstance(self._limit, Exception):
            raise self._limit
        return self._limit


@pytest.mark.parametrize("limit", [ValueError("threshold broke"), "0.1", float("nan")])
def test_a_broken_lane_threshold_stops_the_run(limit: Any) -> None:
    lane = SlowLane(max_threads=2, threshold=Threshold(limit))

    def op(x: int) -> int:
        time.sleep(0.002)
        return x

    p = (
        PipelineBuilder()
        .add_source(range(10_000))
        .pipe(op, concurrency=2, slow_lane=lane, output_order="completion")
    )
    with pytest.raises(PipelineFailure, match="in the slow-lane watchdog"):
        consume(p.add_sink().build())


def test_a_failure_rate_equal_to_the_limit_passes() -> None:
    # 0.29 * 100 is 28.999999999999996: 29 failures of 100 passed a limit of 0.29.
    def op(x: int) -> int:
        if x < 29:
            raise ValueError(x)
        return x

    p = PipelineBuilder().add_source(range(100)).pipe(op, max_failures=0.29).add_sink().build()
    assert len(consume(p)) == 71 and len(p.failures()) == 29


def test_arguments_that_broke_background_threads_are_refused_when_built() -> None:
    def builder() -> PipelineBuilder:
        return PipelineBuilder().add_source(range(3)).add_sink()

    for interval in (float("inf"), 1e12, float("nan")):
        with pytest.raises(ValueError, match="`report_interval` must be > 0 seconds and finite"):
            builder().build(report_interval=interval)
    with pytest.raises(TypeError, match="`on_report` must be callable"):
        builder().build(report_interval=1.0, on_report=5)  # type: ignore[arg-type]
    for poll in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="`poll_s` must be > 0 seconds and finite"):
            SlowLane(max_threads=1, threshold=Threshold(0.1), poll_s=poll)
    with pytest.raises(ValueError, match="'source' is the source's own"):
        PipelineBuilder().add_source(range(3)).pipe(lambda x: x, name="source")


def test_an_iterator_dropped_before_its_first_next_closes_the_pipeline() -> None:
    p = PipelineBuilder().add_source(range(1000)).pipe(lambda x: x, concurrency=2).add_sink()
    pipeline = p.build()
    outputs = iter(pipeline)  # starts the threads
    assert pipeline.threads
    del outputs
    gc.collect()
    deadline = time.monotonic() + 10
    while pipeline.threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pipeline.threads == []
    with pytest.raises(RuntimeError, match="closed"):
        iter(pipeline)


@pytest.mark.parametrize(("limit", "before"), [(2, (10, 5)), (0.1, (200, 100))])
def test_failures_before_already_past_the_limit_stop_at_once(
    limit: float, before: tuple[int, int]
) -> None:
    # A resume under a lower max_failures: the stream ran to its end (1,000 items
    # computed and delivered) and only then raised.
    calls = []

    def op(x: int) -> int:
        calls.append(x)
        return x

    for order in ("input", "completion"):
        calls.clear()
        p = PipelineBuilder().add_source(range(1000))
        p = p.pipe(
            op, concurrency=2, output_order=order, max_failures=limit, failures_before=before
        )
        with pytest.raises(PipelineFailure) as info:
            consume(p.add_sink().build())
        assert info.value.limit_reached and calls == []
        assert "before the point this run resumed from" in str(info.value.exceptions[0])


def test_closing_an_iterator_before_its_first_next_closes_the_pipeline() -> None:
    # A generator's close() before its first next() runs no `finally`: the threads ran on
    # until the iterator was collected.
    pipeline = PipelineBuilder().add_source(range(1000)).pipe(lambda x: x).add_sink().build()
    outputs = iter(pipeline)
    assert pipeline.threads
    outputs.close()  # type: ignore[attr-defined]
    assert pipeline.threads == []
    with pytest.raises(StopIteration):
        next(outputs)
    outputs.close()  # type: ignore[attr-defined]  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        iter(pipeline)


def test_closing_an_iterator_mid_stream_closes_the_pipeline() -> None:
    pipeline = PipelineBuilder().add_source(range(1000)).pipe(lambda x: x).add_sink().build()
    outputs = iter(pipeline)
    assert next(outputs) == 0
    outputs.close()  # type: ignore[attr-defined]
    assert pipeline.threads == []
    assert not pipeline.completed


def test_the_iterator_keeps_the_generator_protocol() -> None:
    # iterate() returned a bare generator: its send and throw stay.
    pipeline = PipelineBuilder().add_source(range(100)).pipe(lambda x: x).add_sink().build()
    outputs = iter(pipeline)
    assert outputs.send(None) == 0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="stop here"):
        outputs.throw(ValueError("stop here"))  # type: ignore[attr-defined]
    assert pipeline.threads == []  # the generator's own finally closed it
