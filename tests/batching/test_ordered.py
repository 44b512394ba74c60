"""OrderedBatcher: nominal order whatever the completion order, failures skipped."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_loader.batching import BatchPlan, OrderedBatcher

from ._sim import FakeClock, start_and_push


def ordered_batches(
    plan: BatchPlan, failed: set[int], *, window: int | None
) -> list[tuple[int, ...]]:
    """The batches the rules give: nominal batches minus failures, in order; a wholly
    failed one is made up for by splitting the next batch of 2+ samples (into equal
    parts, the first part the smallest), and with a window given, the batch before a
    short last one makes up for that one."""
    nominal = [
        tuple(p for p in plan.batch_range(i) if p not in failed) for i in range(plan.num_batches)
    ]
    last = len(nominal) - 1
    short_last = window is not None and plan.last_batch_size < plan.batch_size
    out: list[tuple[int, ...]] = []
    for i, positions in enumerate(nominal):
        if not positions:
            continue
        owed = i - len(out) + (short_last and i == last - 1 and not nominal[last])
        parts = min(owed + 1, len(positions)) if owed > 0 else 1
        cuts = [len(positions) * k // parts for k in range(parts + 1)]
        out += [positions[a:b] for a, b in itertools.pairwise(cuts)]
    return out


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_emits_nominal_batches_in_order_minus_failures(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 60))
    size = data.draw(st.integers(1, 7))
    drop_last = data.draw(st.booleans())
    plan = BatchPlan(n, size, drop_last)
    order = data.draw(st.permutations(range(plan.num_kept)))
    failed = data.draw(st.sets(st.sampled_from(order), max_size=n // 3)) if order else set()
    window = data.draw(st.sampled_from([None, 2 * size]))
    b: OrderedBatcher[int] = OrderedBatcher(size, n, drop_last, window=window)
    batches = []
    for p in order:
        b.started(p)
    for p in order:
        if p in failed:
            b.fail(p)
        else:
            b.push(p, p * 10)
        while (batch := b.pop()) is not None:
            batches.append(batch)
    batches += b.pop_final()
    expected = ordered_batches(plan, failed, window=window)
    assert [x.positions for x in batches] == expected
    assert [x.index for x in batches] == list(range(len(expected)))
    assert all(x.items == tuple(p * 10 for p in x.positions) for x in batches)
    stats = b.stats()
    assert stats.ready == 0 and stats.failed == len(failed)
    assert stats.delivered == plan.num_kept - len(failed)


def test_a_slow_head_blocks_every_later_batch() -> None:
    clock = FakeClock()
    b: OrderedBatcher[int] = OrderedBatcher(2, 6, clock=clock)
    for p in range(6):
        b.started(p)
    for p in range(1, 6):
        b.push(p, p)
        assert b.pop() is None  # position 0 holds batch 0 and so everything
    assert b.stats().ready == 5 and b.stats().held_back == 4
    clock.now = 1.5
    # Still held: the time so far counts (an epoch stopped here read 0.0 s, QA).
    assert b.stats().held_back_s == 1.5
    clock.now = 2.0
    b.push(0, 0)
    assert [x.positions for x in b.pop_final()] == [(0, 1), (2, 3), (4, 5)]
    assert b.stats().held_back_s == 2.0  # held from the first refused pop at t=0
    assert b.stats().ready == 0


def test_all_failed_batch_is_skipped_and_indices_stay_dense() -> None:
    b: OrderedBatcher[int] = OrderedBatcher(2, 5)
    b.fail(2)
    b.fail(3)
    for p in (4, 1, 0):
        b.push(p, p)
    out = b.pop_final()
    assert [(x.positions, x.index, x.delays) for x in out] == [
        ((0, 1), 0, (0, 0)),
        ((4,), 1, (-1,)),  # took the skipped batch's index; too small to split
    ]


def test_a_wholly_failed_batch_is_made_up_for_by_splitting_the_next() -> None:
    # Ranks of a distributed job must yield as many batches: one yielding fewer leaves
    # the others waiting in a collective for good.
    b: OrderedBatcher[int] = OrderedBatcher(3, 12)
    for p in range(12):
        b.started(p)
    for p in (3, 4, 5):
        b.fail(p)
    for p in (0, 1, 2, 6, 7, 8, 9, 10, 11):
        b.push(p, p)
    out = b.pop_final()
    assert [(x.positions, x.index) for x in out] == [
        ((0, 1, 2), 0),
        ((6,), 1),
        ((7, 8), 2),
        ((9, 10, 11), 3),
    ]
    assert len(out) == b.plan.num_batches


def test_the_batch_before_a_short_last_one_waits_for_it_and_makes_up_for_it() -> None:
    # A lone last sample that fails: with the batch before it already gone, the epoch
    # would end a batch short on this rank alone.
    b: OrderedBatcher[int] = OrderedBatcher(4, 9, window=8)
    start_and_push(b, 9, range(8))
    assert [x.positions for x in iter(b.pop, None)] == [(0, 1, 2, 3)]  # (4..7) waits for 8
    assert b.stats().held_back == 1
    b.fail(8)
    out = b.pop_final()
    assert [(x.positions, x.index) for x in out] == [((4, 5), 1), ((6, 7), 2)]


def test_the_batch_before_a_full_last_one_does_not_wait() -> None:
    b: OrderedBatcher[int] = OrderedBatcher(2, 6, window=4)
    start_and_push(b, 6, range(4))
    assert [x.positions for x in iter(b.pop, None)] == [(0, 1), (2, 3)]


def test_without_room_in_the_window_the_batch_before_a_short_last_one_does_not_wait() -> None:
    # Held, it would keep the last batch from starting: the loader would wait for good.
    b: OrderedBatcher[int] = OrderedBatcher(4, 9, window=4)  # room for 4: not 4 + 1
    for p in range(8):
        b.push(p, p)
    assert [x.positions for x in iter(b.pop, None)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    b.fail(8)
    assert b.pop_final() == []  # short by one: nothing left to split


def complete(b: OrderedBatcher[int], p: int, failed: set[int]) -> None:
    if p in failed:
        b.fail(p)
    else:
        b.push(p, p)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_resume_keeps_the_batch_count(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    size = data.draw(st.integers(1, 5))
    failed = data.draw(st.sets(st.integers(0, n - 1), max_size=n // 2))
    cut = data.draw(st.integers(0, n))  # completions before the checkpoint
    first: OrderedBatcher[int] = OrderedBatcher(size, n, window=2 * size)
    batches = []
    for p in range(n):
        first.started(p)
    for p in range(cut):
        complete(first, p, failed)
        batches += list(iter(first.pop, None))
    resumed: OrderedBatcher[int] = OrderedBatcher(size, n, window=2 * size)
    resumed.load_state_dict(first.state_dict())
    todo = resumed.remaining_positions()  # what was not delivered or failed
    for p in todo:
        resumed.started(p)
    for p in todo:
        complete(resumed, p, failed)
        batches += list(iter(resumed.pop, None))
    batches += resumed.pop_final()
    without_resume = ordered_batches(BatchPlan(n, size), failed, window=2 * size)
    assert len(batches) == len(without_resume)
    assert sorted(p for b in batches for p in b.positions) == sorted(set(range(n)) - failed)


def test_drop_last_refuses_the_tail() -> None:
    b: OrderedBatcher[int] = OrderedBatcher(3, 7, drop_last=True)
    with pytest.raises(ValueError, match="drop_last=True"):
        b.push(6, 6)
    for p in range(6):
        b.push(p, p)
    assert [x.positions for x in b.pop_final()] == [(0, 1, 2), (3, 4, 5)]
    assert b.stats().dropped == 1
