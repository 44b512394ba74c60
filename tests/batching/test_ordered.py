"""OrderedBatcher: nominal order whatever the completion order, failures skipped."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_loader.batching import BatchPlan, OrderedBatcher

from ._sim import FakeClock


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_emits_nominal_batches_in_order_minus_failures(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 60))
    size = data.draw(st.integers(1, 7))
    drop_last = data.draw(st.booleans())
    plan = BatchPlan(n, size, drop_last)
    order = data.draw(st.permutations(range(plan.num_kept)))
    failed = data.draw(st.sets(st.sampled_from(order), max_size=n // 3)) if order else set()
    b: OrderedBatcher[int] = OrderedBatcher(size, n, drop_last)
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
    expected = [
        tuple(p for p in plan.batch_range(i) if p not in failed) for i in range(plan.num_batches)
    ]
    expected = [e for e in expected if e]  # a batch whose members all failed is skipped
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
        ((4,), 1, (-1,)),  # took the skipped batch's index
    ]


def test_drop_last_refuses_the_tail() -> None:
    b: OrderedBatcher[int] = OrderedBatcher(3, 7, drop_last=True)
    with pytest.raises(ValueError, match="drop_last=True"):
        b.push(6, 6)
    for p in range(6):
        b.push(p, p)
    assert [x.positions for x in b.pop_final()] == [(0, 1, 2), (3, 4, 5)]
    assert b.stats().dropped == 1
