"""StragglerBatcher: exactly once, bounded lateness, fast samples first, drop_last, the tail."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_loader.batching import OrderedBatcher, StragglerBatcher

from ._sim import FakeClock, check_exactly_once, simulate, start_and_push

# Heavy tail: most tasks take 1-3 ticks, about one in ten 8-16 times longer.
DURATION = st.one_of(
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(8, 48)
).map(float)


@st.composite
def scenarios(draw: st.DrawFn, *, with_failures: bool = True) -> dict[str, object]:
    n = draw(st.integers(0, 70))
    size = draw(st.integers(1, 8))
    delay = draw(st.integers(0, 3))
    durations = draw(st.lists(DURATION, min_size=n, max_size=n))
    if with_failures:
        failures = draw(st.lists(st.integers(0, 9).map(lambda x: x == 0), min_size=n, max_size=n))
    else:
        failures = [False] * n
    threads = draw(st.integers(1, 8))
    # From the smallest window that guarantees progress (B) to "everything in flight".
    window = draw(st.integers(size, max(size, n) + size))
    return {
        "n": n,
        "size": size,
        "delay": delay,
        "durations": durations,
        "failures": failures,
        "threads": threads,
        "window": window,
        "drop_last": draw(st.booleans()),
    }


def run_straggler(s: dict[str, object]):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    batcher: StragglerBatcher[tuple[str, int]] = StragglerBatcher(
        s["size"], s["n"], max_delay_batches=s["delay"], drop_last=s["drop_last"], clock=clock
    )
    order = range(batcher.plan.num_kept)
    run = simulate(
        batcher, clock, s["durations"], s["failures"], threads=s["threads"],
        window=s["window"], order=order,
    )  # fmt: skip
    return batcher, run


@pytest.mark.parametrize("bad", range(8))
def test_a_failure_known_in_time_does_not_cost_a_batch(bad: int) -> None:
    # One rank's 9 samples in batches of 4: [4, 4, 1]. Re-packing the 8 good ones as
    # [4, 4] gave this rank a batch fewer than its peers, and a distributed job hung.
    batcher: StragglerBatcher[int] = StragglerBatcher(4, 9, max_delay_batches=2)
    sizes = []
    for p in range(9):
        if p == bad:
            batcher.fail(p)
        else:
            batcher.push(p, p)
        while (batch := batcher.pop()) is not None:
            sizes.append(len(batch))
    sizes += [len(b) for b in batcher.pop_final()]
    assert len(sizes) == batcher.plan.num_batches == 3 and sum(sizes) == 8
    assert sizes[0] == 4 or bad < 4  # full batches while the samples left allow it


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_a_last_sample_that_fails_after_the_others_does_not_cost_a_batch(delay: int) -> None:
    # Batches of 4 over 9 samples: the lone last one still running when 4-7 are ready.
    # Emitting all four left nothing for the last batch when that sample then failed.
    batcher: StragglerBatcher[int] = StragglerBatcher(4, 9, max_delay_batches=delay)
    start_and_push(batcher, 9, range(8))
    out = list(iter(batcher.pop, None))
    if delay:
        assert [b.positions for b in out] == [(0, 1, 2, 3)]  # (4-7) waits for 8
    batcher.fail(8)
    out += batcher.pop_final()
    if delay == 0:  # 4-7 are all due in batch 1: the lateness bound comes first
        assert [b.positions for b in out] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    else:
        assert [b.positions for b in out] == [(0, 1, 2, 3), (4, 5, 6), (7,)]
    assert batcher.stats().overdue == 0


def test_without_wait_for_last_the_batch_before_the_last_goes_at_once() -> None:
    # A single process: a batch fewer harms nothing, a wait at the epoch's end would.
    batcher: StragglerBatcher[int] = StragglerBatcher(
        4, 9, max_delay_batches=2, wait_for_last=False
    )
    start_and_push(batcher, 9, range(8))
    assert [b.positions for b in iter(batcher.pop, None)] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_the_batch_before_the_last_waits_only_for_the_first_of_the_last_s_samples() -> None:
    batcher: StragglerBatcher[int] = StragglerBatcher(4, 11, max_delay_batches=2)
    start_and_push(batcher, 11, range(8))
    assert [b.positions for b in iter(batcher.pop, None)] == [(0, 1, 2, 3)]
    batcher.push(9, 9)  # 8 and 10 still running: the last batch has a sample
    assert [b.positions for b in iter(batcher.pop, None)] == [(4, 5, 6, 7)]
    batcher.fail(8)
    batcher.fail(10)
    assert [b.positions for b in batcher.pop_final()] == [(9,)]


def test_the_batch_before_the_last_is_whole_when_the_last_has_a_ready_sample() -> None:
    batcher: StragglerBatcher[int] = StragglerBatcher(4, 10, max_delay_batches=2)
    start_and_push(batcher, 10, range(9))
    assert [b.positions for b in iter(batcher.pop, None)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    batcher.fail(9)
    assert [b.positions for b in batcher.pop_final()] == [(8,)]


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_exactly_once_and_bounded_delay_under_heavy_tails(s: dict[str, object]) -> None:
    batcher, run = run_straggler(s)
    size, delay = s["size"], s["delay"]
    check_exactly_once(run, batcher.plan.num_kept)
    assert all(count == 1 for count in run.calls.values())
    assert [b.index for b in run.batches] == list(range(len(run.batches)))
    assert all(len(b) >= 1 for b in run.batches)
    plan = batcher.plan
    failed = list(s["failures"])[: plan.num_kept]  # drop_last: the cut positions never run
    if not any(failed):  # full batches except the tail: a short batch is only the last one
        assert all(len(b) == size for b in run.batches[:-1])
    # Failures never add batches; without failures the count is the nominal one.
    assert len(run.batches) <= plan.num_batches
    if not any(failed):
        assert len(run.batches) == plan.num_batches
    for batch in run.batches:
        assert batch.delays == tuple(batch.index - p // size for p in batch.positions)
        assert batch.max_delay <= delay
    stats = batcher.stats()
    assert stats.overdue == 0
    assert stats.max_delay <= delay
    assert stats.delivered == len(run.delivered())
    assert stats.failed == len(run.failed)
    assert stats.batches == len(run.batches)
    assert stats.pending == stats.ready == 0


@settings(max_examples=200, deadline=None)
@given(scenarios(with_failures=False))
def test_zero_delay_without_failures_equals_ordered(s: dict[str, object]) -> None:
    s = {**s, "delay": 0}
    _, straggler = run_straggler(s)
    clock = FakeClock()
    ordered: OrderedBatcher[tuple[str, int]] = OrderedBatcher(
        s["size"], s["n"], s["drop_last"], clock=clock
    )
    run = simulate(
        ordered, clock, s["durations"], s["failures"], threads=s["threads"],
        window=s["window"], order=range(ordered.plan.num_kept),
    )  # fmt: skip
    assert [b.positions for b in straggler.batches] == [b.positions for b in run.batches]


def test_fast_samples_fill_batches_and_the_straggler_joins_a_later_one() -> None:
    clock = FakeClock()
    b: StragglerBatcher[str] = StragglerBatcher(4, 13, max_delay_batches=2, clock=clock)
    for p in range(13):
        b.started(p)
    for p in range(13):
        if p != 1:
            b.push(p, f"x{p}")
    first, second = b.pop(), b.pop()
    assert first is not None and second is not None
    assert first.positions == (0, 2, 3, 4) and first.index == 0
    assert first.items == ("x0", "x2", "x3", "x4")
    assert first.delays == (0, 0, 0, -1)
    assert second.positions == (5, 6, 7, 8) and second.delays == (0, 0, 0, -1)
    # 9..12 are ready, but batch 2 is the last one position 1 (nominal batch 0) may join.
    clock.now = 10.0
    assert b.pop() is None
    clock.now = 10.5
    assert b.pop() is None
    clock.now = 13.0
    b.push(1, "x1")
    third = b.pop()
    assert third is not None
    assert third.positions == (1, 9, 10, 11) and third.delays == (2, 0, 0, 0)
    tail = b.pop_final()
    assert [(x.positions, x.index, x.delays) for x in tail] == [((12,), 3, (0,))]
    stats = b.stats()
    assert (stats.moved, stats.mean_moved_delay, stats.max_delay) == (1, 2.0, 2)
    assert stats.held_back == 2
    assert stats.held_back_s == pytest.approx(3.0)


def test_pending_straggler_blocks_only_at_its_bound() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(2, 10, max_delay_batches=1, clock=FakeClock())
    start_and_push(b, 10, range(1, 10))
    batch = b.pop()
    assert batch is not None and batch.positions == (1, 2)
    assert b.pop() is None  # batch 1 is position 0's last chance
    b.push(0, 0)
    batch = b.pop()
    assert batch is not None and batch.positions == (0, 3) and batch.delays == (1, 0)


def test_unstarted_gap_below_the_high_water_mark_counts_as_pending() -> None:
    # A cost-reordered start: position 0 has not started, 1..5 have completed.
    b: StragglerBatcher[int] = StragglerBatcher(2, 6, max_delay_batches=0, clock=FakeClock())
    for p in range(1, 6):
        b.started(p)
        b.push(p, p)
    assert b.pop() is None
    b.started(0)
    b.push(0, 0)
    assert [x.positions for x in b.pop_final()] == [(0, 1), (2, 3), (4, 5)]


def test_drop_last_keeps_the_same_deterministic_set_as_ordered_mode() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(4, 10, drop_last=True, clock=FakeClock())
    assert b.plan.num_kept == 8 and list(b.plan.dropped) == [8, 9]
    with pytest.raises(ValueError, match=r"dropped by drop_last=True \(positions >= 8\)"):
        b.started(9)
    for p in range(8):
        b.started(p)
    b.fail(5)
    for p in (7, 6, 4, 3, 2, 1, 0):
        b.push(p, p)
    batches = [b.pop(), *b.pop_final()]
    # A failure leaves a batch short (the first formed once it is known, as ordered mode's
    # batch that lost it); drop_last only removes the nominal tail.
    assert [x.positions for x in batches if x] == [(0, 1, 2), (3, 4, 6, 7)]
    stats = b.stats()
    assert (stats.dropped, stats.failed, stats.delivered) == (2, 1, 7)


def test_short_tail_waits_until_every_position_completed() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(4, 6, clock=FakeClock())
    start_and_push(b, 6, (0, 1, 2, 3, 4))
    first = b.pop()
    assert first is not None and first.positions == (0, 1, 2, 3)
    assert b.pop() is None  # only 1 ready and position 5 still running
    with pytest.raises(RuntimeError, match=r"1 position\(s\) never completed, e.g. \[5\]"):
        b.finish()
    b.push(5, 5)
    assert [x.positions for x in b.pop_final()] == [(4, 5)]


def test_misuse_raises_clear_errors() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(2, 4, clock=FakeClock())
    b.started(0)
    with pytest.raises(ValueError, match="position 0 was already started"):
        b.started(0)
    b.push(0, 0)
    with pytest.raises(ValueError, match="position 0 was already completed"):
        b.push(0, 0)
    with pytest.raises(ValueError, match="position 0 was already completed"):
        b.fail(0)
    with pytest.raises(ValueError, match=r"position must be in \[0, 4\), got 4"):
        b.push(4, 4)
    with pytest.raises(ValueError, match="max_delay_batches"):
        StragglerBatcher(2, 4, max_delay_batches=-1)
    with pytest.raises(ValueError, match="`batch_size` must be >= 1, got 0"):
        StragglerBatcher(0, 4)
    with pytest.raises(TypeError, match="`clock` must be a callable"):
        StragglerBatcher(2, 4, clock=1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("window", [6, 15, 40])
def test_spread_failures_leave_short_batches_not_an_empty_tail(window: int) -> None:
    # Failures through an epoch, the training loop slower than the loader (one batch a
    # step, the loader keeping ``window`` samples in flight): the places failures left
    # were filled from later samples, batches were cut only once the samples left ran
    # short, and failures met after that cut left the last batches none (a distributed
    # epoch padded 4 of 34 with repeats; QA).
    b: StragglerBatcher[int] = StragglerBatcher(3, 101, max_delay_batches=2, clock=FakeClock())
    failed = {*range(4, 70, 9), 90, 93, 96, 99}  # 12 of 101, a third of them in the tail
    batches, started, taken = [], 0, 0
    while len(batches) < b.plan.num_batches:
        while started < 101 and started - taken < window:  # the loader runs ahead
            if started in failed:
                b.fail(started)
                taken += 1
            else:
                b.push(started, started)
            started += 1
        batch = b.pop()
        if batch is None:
            assert started == 101  # nothing in flight is running: only the tail waits
            batches += [x for x in b.pop_final() if x]
            break
        batches.append(batch)  # the training loop takes one a step
        taken += len(batch.positions)
    assert len(batches) == b.plan.num_batches == 34
    assert all(batch.positions for batch in batches)
    delivered = sorted(p for batch in batches for p in batch.positions)
    assert delivered == sorted(set(range(101)) - failed)


def test_push_without_started_counts_as_started() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(2, 2, clock=FakeClock())
    b.push(1, 1)
    b.fail(0)
    assert [x.positions for x in b.pop_final()] == [(1,)]
    assert b.stats().failed == 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_completion_order_with_everything_in_flight(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 60))
    size = data.draw(st.integers(1, 6))
    delay = data.draw(st.integers(0, 3))
    order = data.draw(st.permutations(range(n)))
    failed = data.draw(st.sets(st.integers(0, n - 1), max_size=n // 4))
    b: StragglerBatcher[int] = StragglerBatcher(size, n, max_delay_batches=delay)
    for p in range(n):
        b.started(p)
    batches = []
    for p in order:
        if p in failed:
            b.fail(p)
        else:
            b.push(p, p)
        while (batch := b.pop()) is not None:
            batches.append(batch)
    batches += b.pop_final()
    delivered = [p for x in batches for p in x.positions]
    assert sorted(delivered) == sorted(set(range(n)) - failed)
    if not failed:
        assert all(len(x) == size for x in batches[:-1])
    assert len(batches) <= b.plan.num_batches and all(len(x) >= 1 for x in batches)
    assert all(x.max_delay <= delay for x in batches)


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(2, 12), st.data())
def test_cost_reordered_starts_keep_the_bound_and_progress(
    s: dict[str, object], lookahead: int, data: st.DataObject
) -> None:
    from gpu_loader.batching import order_by_cost

    clock = FakeClock()
    b: StragglerBatcher[tuple[str, int]] = StragglerBatcher(
        s["size"], s["n"], max_delay_batches=s["delay"], drop_last=s["drop_last"], clock=clock
    )
    kept = b.plan.num_kept
    costs = data.draw(st.lists(st.floats(0, 10), min_size=kept, max_size=kept))
    order = order_by_cost(range(kept), costs, lookahead)
    # The smallest window the README promises never deadlocks: B + lookahead.
    run = simulate(
        b, clock, s["durations"], s["failures"], threads=s["threads"],
        window=s["size"] + lookahead, order=order,
    )  # fmt: skip
    check_exactly_once(run, kept)
    assert b.stats().overdue == 0
    assert all(x.max_delay <= s["delay"] for x in run.batches)


def head_of_line_missing() -> StragglerBatcher[int]:
    """Batch size 4, positions 0-7 started, 1-4 ready: batch 0 waits only for position 0."""
    b: StragglerBatcher[int] = StragglerBatcher(4, 12, max_delay_batches=2)
    start_and_push(b, 8, (1, 2, 3, 4))
    return b


def test_pop_without_moves_waits_for_the_head_of_line() -> None:
    b = head_of_line_missing()
    # Four are ready, but the batch would skip position 0: only a pop that may move does.
    assert b.pop(moves=False) is None
    assert b.stats().held_back == 0  # a refusal the caller asked for, not the bound
    b.push(0, 0)
    batch = b.pop(moves=False)
    assert batch is not None and batch.positions == (0, 1, 2, 3)
    assert b.stats().moved == 0


def test_pop_with_moves_takes_the_ready_samples_the_same_call_would_wait_for() -> None:
    b = head_of_line_missing()
    assert b.pop(moves=False) is None
    batch = b.pop()
    assert batch is not None and batch.positions == (1, 2, 3, 4)
    assert batch.delays == (0, 0, 0, -1)
    for p in (0, 5, 6, 7):
        b.push(p, p)
    # Position 0 joins the next batch even without moves: nothing incomplete is skipped.
    late = b.pop(moves=False)
    assert late is not None and late.positions == (0, 5, 6, 7)
    assert b.stats().moved == 1 and b.stats().max_delay == 1


def test_pop_waits_for_a_named_position_it_would_skip() -> None:
    b = head_of_line_missing()
    # Position 0 is incomplete and named: the batch waits for it, as without moves.
    assert b.pop(wait_for=[0, 6]) is None
    assert b.stats().held_back == 0  # a refusal the caller asked for, not the bound
    # Named positions the batch would not skip (above it) do not hold it.
    batch = b.pop(wait_for=[5, 6, 7])
    assert batch is not None and batch.positions == (1, 2, 3, 4)


def test_a_named_position_holds_the_batch_only_until_it_completes() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(4, 12, max_delay_batches=2)
    start_and_push(b, 8, (0, 2, 4, 5))
    assert b.pop(wait_for=[3]) is None  # the batch (0, 2, 4, 5) would skip 1 and 3
    b.push(3, 3)
    # Position 3 is ready now: the batch skips only position 1, which is not named.
    batch = b.pop(wait_for=[3])
    assert batch is not None and batch.positions == (0, 2, 3, 4)


def test_a_callable_wait_for_is_asked_only_when_a_batch_could_go() -> None:
    # The loader's list costs a walk over every sample in flight; it pops after every
    # completion, and most pops find fewer than a batch ready.
    asked: list[int] = []

    def names() -> list[int]:
        asked.append(1)
        return [0]

    b: StragglerBatcher[int] = StragglerBatcher(4, 12, max_delay_batches=2)
    for p in range(8):
        b.started(p)
    for p in (1, 2, 3):
        b.push(p, p)
        assert b.pop(wait_for=names) is None
    assert asked == []  # never a batch's worth ready
    b.push(4, 4)
    assert b.pop(moves=False, wait_for=names) is None and asked == []  # no moves: not needed
    assert b.pop(wait_for=names) is None and asked == [1]  # it would skip 0, named
    b.push(0, 0)
    batch = b.pop(wait_for=names)
    assert batch is not None and batch.positions == (0, 1, 2, 3)
    assert asked == [1]  # the next positions in order: it skips none, nothing to ask


def test_ordered_batches_ignore_moves() -> None:
    b: OrderedBatcher[int] = OrderedBatcher(2, 4)
    for p in range(4):
        b.push(p, p)
    first = b.pop(moves=False, wait_for=[0, 1])
    assert first is not None and first.positions == (0, 1)
    second = b.pop(moves=True, wait_for=[2])
    assert second is not None and second.positions == (2, 3)
