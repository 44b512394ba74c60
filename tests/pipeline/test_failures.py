"""Failure records, keys, notes, tracebacks and the max_failures policy."""

from __future__ import annotations

import builtins
import re
import sys
import traceback
import weakref
from typing import Any

import pytest

from gpu_loader.pipeline import FailureRecord, PipelineBuilder, PipelineFailure
from gpu_loader.pipeline._errors import RATE_WARMUP_CALLS

from ._helpers import Keyed

if sys.version_info >= (3, 11):
    ExceptionGroupType = builtins.ExceptionGroup
else:  # Python 3.10: the backport the package depends on there
    from exceptiongroup import ExceptionGroup as ExceptionGroupType


def fail_on(bad: set[int]) -> Any:
    def check_item(x: int) -> int:
        if x in bad:
            raise ValueError(f"bad item {x}")
        return x

    return check_item


def run(n: int, op: Any, **pipe_kwargs: Any) -> tuple[list[Any], Any]:
    p = PipelineBuilder().add_source(range(n)).pipe(op, **pipe_kwargs).add_sink(2).build()
    with p:
        out = list(p)
    return out, p


@pytest.mark.parametrize("concurrency", [1, 4])
def test_failures_are_recorded_and_items_dropped(concurrency: int) -> None:
    out, p = run(50, fail_on({3, 17}), concurrency=concurrency, name="decode")
    assert out == [x for x in range(50) if x not in (3, 17)]
    records = sorted(p.failures(), key=lambda r: int(r.key))
    assert [(r.stage, r.key) for r in records] == [("decode", "3"), ("decode", "17")]
    assert records[0].error_text == "ValueError: bad item 3"
    assert str(records[0]) == "ValueError: bad item 3"
    assert records[0].error.__notes__ == ["stage: decode, sample: 3"]
    assert p.stats().stages[1].failures == 2


def test_key_from_attribute_and_key_fn() -> None:
    def boom(x: Any) -> Any:
        raise KeyError("nope")

    p = PipelineBuilder().add_source([Keyed("img_7.jpg")]).pipe(boom).add_sink(2).build()
    with p:
        list(p)
    assert p.failures()[0].key == "img_7.jpg"

    p = (
        PipelineBuilder()
        .add_source([{"path": "a.png"}])
        .pipe(boom, key_fn=lambda item: item["path"])
        .add_sink(2)
        .build()
    )
    with p:
        list(p)
    assert p.failures()[0].key == "a.png"

    p = PipelineBuilder().add_source(["x" * 500]).pipe(boom).add_sink(2).build()
    with p:
        list(p)
    assert len(p.failures()[0].key) < 80  # a short repr, not the whole item


def test_max_failures_zero_raises_at_once_with_context() -> None:
    def decode_image(x: int) -> int:
        if x == 5:
            raise ValueError("corrupt")
        return x

    p = PipelineBuilder().add_source(range(100_000)).pipe(decode_image, max_failures=0)
    pipeline = p.add_sink(2).build()
    got = 0
    with pytest.raises(PipelineFailure) as info, pipeline:
        for _ in pipeline:
            got += 1
    assert got < 1000  # it stopped early instead of running to the end
    group = info.value
    assert isinstance(group, ExceptionGroupType)
    (cause,) = group.exceptions
    assert isinstance(cause, ValueError)
    assert cause.__notes__ == ["stage: decode_image, sample: 5"]
    # The original traceback reaches the consumer: it ends in the op's frame.
    frames = traceback.extract_tb(cause.__traceback__)
    assert frames[-1].name == "decode_image"


@pytest.mark.parametrize(("bad", "raises"), [(3, False), (4, True)])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_count_threshold(bad: int, raises: bool, concurrency: int) -> None:
    op = fail_on(set(range(0, 10 * bad, 10)))
    if not raises:
        out, p = run(100, op, concurrency=concurrency, max_failures=3)
        assert len(out) == 100 - bad and len(p.failures()) == 3
        return
    with pytest.raises(PipelineFailure, match="more than 3 failures") as info:
        run(100, op, concurrency=concurrency, max_failures=3)
    assert len(info.value.exceptions) == 4


@pytest.mark.parametrize(("every", "raises"), [(20, False), (5, True)])
def test_rate_threshold(every: int, raises: bool) -> None:
    n = 3 * RATE_WARMUP_CALLS
    op = fail_on(set(range(0, n, every)))  # 5% or 20% of calls fail
    if not raises:
        out, _ = run(n, op, concurrency=2, max_failures=0.1)
        assert len(out) == n - n // every
        return
    with pytest.raises(PipelineFailure, match=r"failure rate above 0\.1"):
        run(n, op, concurrency=2, max_failures=0.1)


def test_rate_waits_for_warmup_then_checks_at_the_end() -> None:
    # One failure in the first 10 calls is 10% > 5%, but the check waits for warm-up...
    op = fail_on({0})
    out, _ = run(RATE_WARMUP_CALLS * 2, op, max_failures=0.05)
    assert len(out) == RATE_WARMUP_CALLS * 2 - 1
    # ...while a short stream is still judged once it ends: 2 of 10 is above 5%.
    with pytest.raises(PipelineFailure, match="2 of 10 items failed"):
        run(10, fail_on({1, 2}), max_failures=0.05)


def test_failures_before_count_against_the_limit() -> None:
    # A resumed stream: 3 failures of 40 calls before it, then 1 of 10 here.
    op = fail_on({5})
    out, _ = run(10, op, max_failures=3)  # 1 failure alone is within 3
    assert len(out) == 9
    with pytest.raises(PipelineFailure, match=r"more than 3 failures \(4 items failed\)") as info:
        run(10, op, max_failures=3, failures_before=(40, 3))
    assert len(info.value.exceptions) == 1  # the earlier errors were not kept
    # A rate over the whole: 1 of 10 is above 0.05, but 1 of 50 is not.
    with pytest.raises(PipelineFailure, match="1 of 10 items failed"):
        run(10, op, max_failures=0.05)
    out, _ = run(10, op, max_failures=0.05, failures_before=(40, 0))
    assert len(out) == 9
    # Failures only before: judged at the end, with a cause that says so.
    with pytest.raises(PipelineFailure, match="4 of 50 items failed") as info:
        run(10, fail_on(set()), max_failures=0.05, failures_before=(40, 4))
    assert "before the point this run resumed from" in str(info.value.exceptions[0])


@pytest.mark.parametrize("before", [(3, 4), (-1, 0), (2,), [5, 1], (True, 0)])
def test_failures_before_is_checked(before: Any) -> None:
    with pytest.raises(ValueError, match="failures_before"):
        PipelineBuilder().add_source([1]).pipe(lambda x: x, failures_before=before)


def test_source_error_reaches_consumer() -> None:
    def source() -> Any:
        yield 1
        raise OSError("index unreadable")

    p = PipelineBuilder().add_source(source()).pipe(lambda x: x).add_sink(2).build()
    with pytest.raises(PipelineFailure) as info, p:
        list(p)
    (cause,) = info.value.exceptions
    assert isinstance(cause, OSError)
    assert "stage: source" in cause.__notes__


def test_worker_init_error_reaches_consumer() -> None:
    def init() -> None:
        raise RuntimeError("no decoder")

    p = PipelineBuilder().add_source(range(3)).pipe(lambda x, s: x, worker_init=init)
    pipeline = p.add_sink(2).build()
    with pytest.raises(PipelineFailure, match="worker_init") as info, pipeline:
        list(pipeline)
    assert isinstance(info.value.exceptions[0], RuntimeError)


def test_disaggregate_of_non_iterable_says_what_to_do() -> None:
    p = PipelineBuilder().add_source(range(3)).disaggregate().add_sink(2).build()
    with pytest.raises(PipelineFailure, match="after aggregate"), p:
        list(p)


def test_failure_split_keeps_the_class() -> None:
    group = PipelineFailure("x", [ValueError("a"), KeyError("b")])
    matched, rest = group.split(ValueError)
    assert isinstance(matched, PipelineFailure) and isinstance(rest, PipelineFailure)


def test_failure_record_is_frozen() -> None:
    record = FailureRecord(stage="s", key="k", error=ValueError("v"))
    with pytest.raises(AttributeError):
        record.stage = "t"  # type: ignore[misc]


class Blob(bytearray):
    """A failed item's payload; a weak reference tells whether anything still holds it."""


def test_a_recorded_failure_does_not_keep_the_item_alive() -> None:
    refs: list[weakref.ref[Blob]] = []

    def decode(i: int) -> int:
        data = Blob(1 << 20)  # the bytes a real decode would hold in its frame
        refs.append(weakref.ref(data))
        try:
            raise ValueError(f"corrupt {len(data)}")
        except ValueError as exc:  # chained: the context's traceback counts too
            raise RuntimeError(f"cannot decode item {i}") from exc

    p = PipelineBuilder().add_source(range(5)).pipe(decode, max_failures=None).add_sink(2).build()
    with p:
        assert list(p) == []
        records = p.failures()
        assert len(records) == 5 and all(r() is None for r in refs)  # freed, not collected
    text = "".join(traceback.format_exception(records[0].error))
    assert "in decode" in text and "raise ValueError" in text  # still a full traceback


def test_releasing_locals_leaves_a_suspended_generator_running() -> None:
    # The exception was raised inside a long-lived generator, which caught it and handed
    # it on; its traceback holds that generator's suspended frame. Clearing it would
    # close the generator, and every later item would fail.
    def checker() -> Any:
        item = yield None
        while True:
            try:
                if item % 3 == 2:
                    raise ValueError(f"bad item {item}")
                out: Any = item
            except ValueError as exc:
                out = exc
            item = yield out

    gen = checker()
    next(gen)

    def op(i: int) -> int:
        out = gen.send(i)
        if isinstance(out, Exception):
            raise out
        return int(out)

    p = PipelineBuilder().add_source(range(10)).pipe(op, max_failures=None).add_sink(2).build()
    with p:
        got = sorted(p)
    assert got == [0, 1, 3, 4, 6, 7, 9]
    assert [r.key for r in p.failures()] == ["2", "5", "8"]


def test_a_raised_failure_keeps_its_locals_for_a_debugger() -> None:
    def decode(i: int) -> int:
        payload = f"item {i}"
        raise ValueError(payload)

    p = PipelineBuilder().add_source(range(3)).pipe(decode, max_failures=0).add_sink(2).build()
    with pytest.raises(PipelineFailure) as info, p:
        list(p)
    cause = info.value.exceptions[0]
    tb = cause.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != "decode":
        tb = tb.tb_next
    assert tb is not None and tb.tb_frame.f_locals["payload"] == "item 0"


def test_an_unlucky_start_under_the_limit_does_not_stop_the_stream() -> None:
    # 33 of the first 101 calls fail, 25% of the whole stream: under max_failures=0.3.
    # Judged on the running rate, the stream stopped at call 101 (a QA run's case).
    n = 400
    bad = set(range(0, 99, 3))  # 33 failures in the first 99 calls
    bad |= set(range(101, n, 4)[: 100 - len(bad)])  # and 67 spread over the rest
    assert len(bad) == 100 and sum(1 for b in bad if b <= 100) == 33
    out, p = run(n, fail_on(bad), max_failures=0.3)
    assert len(out) == n - 100 and len(p.failures()) == 100


def test_a_rate_of_one_never_stops_the_stream() -> None:
    # "Every item may fail": refused before as a rate outside (0, 1), with a hint to pass
    # an int for a count, where max_failures=1 would stop at the second failure.
    out, p = run(150, fail_on(set(range(150))), max_failures=1.0)
    assert out == [] and len(p.failures()) == 150
    for limit in (0.0, 1.5, -0.5):
        with pytest.raises(ValueError, match=r"must be in \(0, 1\].*None for no limit"):
            run(1, fail_on(set()), max_failures=limit)


def test_a_clearly_broken_stream_still_stops_early() -> None:
    # Half the calls fail against max_failures=0.1: stopped soon after the warm-up, not
    # at the end of the stream.
    n = 20 * RATE_WARMUP_CALLS
    with pytest.raises(PipelineFailure, match=r"failure rate above 0\.1") as info:
        run(n, fail_on(set(range(0, n, 2))), max_failures=0.1)
    found = re.search(r"\((\d+) of (\d+) items failed\)", str(info.value))
    assert found is not None and int(found[2]) <= 2 * RATE_WARMUP_CALLS


@pytest.mark.parametrize(
    ("failed", "calls", "limit", "over"),
    [
        (33, 101, 0.3, False),  # the unlucky start above
        (60, 100, 0.1, True),  # clearly broken
        (9, 50, 0.05, False),  # before the warm-up
        (3200, 10000, 0.3, True),  # 32% of many calls: beyond doubt
        (310, 1000, 0.3, False),  # 31% of 1000: could be chance
        (20, 100, 0.3, False),  # under the limit
    ],
)
def test_rate_clearly_over(failed: int, calls: int, limit: float, over: bool) -> None:
    from gpu_loader.pipeline._errors import rate_clearly_over

    assert rate_clearly_over(failed, calls, limit) is over


def test_a_policy_never_counts_fewer_calls_than_failures() -> None:
    # Two threads: one numbers its call before the other's failure and records after it.
    # The limit then judged "100 of 99 calls" (or, as here, waited out a warm-up that
    # 100 failures had passed).
    from gpu_loader.pipeline._errors import FailurePolicy

    policy = FailurePolicy("decode", 0.1)
    for call in range(1, RATE_WARMUP_CALLS):
        assert policy.record(FailureRecord("decode", str(call), ValueError()), calls=call) is None
    late = policy.record(FailureRecord("decode", "late", ValueError()), calls=RATE_WARMUP_CALLS - 1)
    assert late is not None
    assert f"{RATE_WARMUP_CALLS} of {RATE_WARMUP_CALLS} items failed" in late.message


def test_the_limit_error_is_returned_once_so_the_first_one_wins() -> None:
    from gpu_loader.pipeline._errors import FailurePolicy

    policy = FailurePolicy("decode", 1)
    errors = [
        policy.record(FailureRecord("decode", f"k{i}", ValueError(i)), i + 1) for i in range(4)
    ]
    assert [e is not None for e in errors] == [False, True, False, False]
    assert policy.failures() == 4  # every failure is still recorded
