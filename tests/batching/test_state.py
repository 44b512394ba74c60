"""Resume: state after k batches + a new batcher fed the rest = every position exactly once."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_loader.batching import OrderedBatcher, StragglerBatcher

from ._sim import FakeClock, check_exactly_once, simulate
from .test_straggler import scenarios


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(0, 12), st.sampled_from(["straggler", "ordered"]))
def test_resume_delivers_exactly_the_rest(s: dict, stop_after: int, mode: str) -> None:  # type: ignore[type-arg]
    def make(clock: FakeClock):  # type: ignore[no-untyped-def]
        if mode == "ordered":
            return OrderedBatcher(s["size"], s["n"], s["drop_last"], clock=clock)
        return StragglerBatcher(
            s["size"], s["n"], max_delay_batches=s["delay"], drop_last=s["drop_last"], clock=clock
        )

    clock = FakeClock()
    first = make(clock)
    kw = {"threads": s["threads"], "window": s["window"]}
    run1 = simulate(
        first, clock, s["durations"], s["failures"], order=range(first.plan.num_kept),
        stop_after=stop_after, **kw,
    )  # fmt: skip
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    assert state["batches"] == len(run1.batches)
    second = make(clock)
    second.load_state_dict(state)
    remaining = second.remaining_positions()
    run2 = simulate(second, clock, s["durations"], s["failures"], order=remaining, **kw)
    check_exactly_once(run2, first.plan.num_kept, previous=run1.delivered(), failed=run1.failed)
    # Samples completed but not emitted before the checkpoint are computed again, nothing else.
    assert set(remaining).isdisjoint(run1.delivered()) and set(remaining).isdisjoint(run1.failed)
    assert [b.index for b in run1.batches + run2.batches] == list(
        range(len(run1.batches) + len(run2.batches))
    )
    assert all(b.max_delay <= s["delay"] for b in run2.batches if mode == "straggler")
    assert second.stats().overdue == 0


def test_state_is_compact_ranges() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(4, 1000, max_delay_batches=1)
    for p in range(1000):
        b.started(p)
    b.fail(7)
    for p in range(901):
        if p != 7:
            b.push(p, p)
        while b.pop() is not None:
            pass
    state = b.state_dict()
    # 899 of the 900 ready samples: the failure left one place of a batch empty (as in
    # ordered mode), and 225 batches hold 4 * 225 - 1.
    assert state["delivered"] == [[0, 7], [8, 900]]
    assert state["failed"] == [[7, 8]]
    assert state["batches"] == 900 // 4
    assert len(json.dumps(state)) < 300


def test_load_state_dict_refuses_mismatches_and_used_batchers() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(2, 4)
    b.push(0, 0)
    b.push(1, 1)
    assert b.pop() is not None
    state = b.state_dict()
    with pytest.raises(ValueError, match="'batch_size' is 2 but this batcher needs 3"):
        StragglerBatcher(3, 4).load_state_dict(state)
    with pytest.raises(ValueError, match="'mode' is 'straggler' but this batcher needs 'ordered'"):
        OrderedBatcher(2, 4).load_state_dict(state)
    with pytest.raises(RuntimeError, match="needs a fresh batcher"):
        b.load_state_dict(state)
    for ranges in ([[0, 9]], [[0, 5]], [[-1, 2]], [[3, 2]]):  # past the end by one too
        bad = {**state, "delivered": ranges}
        with pytest.raises(
            ValueError, match=r"expected \[start, stop\] with 0 <= start <= stop <= 4"
        ):
            StragglerBatcher(2, 4).load_state_dict(bad)
    for batches in (-1, 1.0, True, None):
        with pytest.raises(ValueError, match="'batches' must be an int >= 0"):
            StragglerBatcher(2, 4).load_state_dict({**state, "batches": batches})
    with pytest.raises(ValueError, match="lists position 1 twice"):
        StragglerBatcher(2, 4).load_state_dict({**state, "failed": [[1, 2]]})
    fresh: StragglerBatcher[int] = StragglerBatcher(2, 4)
    fresh.load_state_dict(state)
    assert fresh.remaining_positions() == [2, 3]
    with pytest.raises(ValueError, match="position 0 was already delivered"):
        fresh.push(0, 0)
    with pytest.raises(ValueError, match="position 1 was already delivered"):
        fresh.started(1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 0, 1, 2, 3, 4]), max_size=300))
def test_ledger_remaining_and_failed_positions_match_their_statuses(codes: list[int]) -> None:
    # Both are found by byte searches (an ImageNet-sized epoch's ledger is 1.28M bytes,
    # read at every epoch's start); they must list exactly the positions per status.
    from gpu_loader.batching._ledger import FAILED, NOT_STARTED, Ledger
    from gpu_loader.batching._plan import BatchPlan

    ledger = Ledger(BatchPlan(len(codes), 4))
    for position, code in enumerate(codes):
        if code != NOT_STARTED:
            ledger.status[position] = code
            ledger.started += 1
    assert ledger.remaining() == [p for p, c in enumerate(codes) if c == NOT_STARTED]
    assert ledger.failed_positions() == [p for p, c in enumerate(codes) if c == FAILED]


def test_ledger_undeliver_takes_back_only_delivered_positions() -> None:
    # The loader's record of a batch an interrupt stopped before the training loop got it
    # (`Received.undelivered`): possibly only part of it was recorded.
    from gpu_loader.batching._ledger import Ledger
    from gpu_loader.batching._plan import BatchPlan

    ledger = Ledger(BatchPlan(12, 4))
    for position in range(6):
        ledger.complete(position, ok=True)
        ledger.deliver(position)
    ledger.complete(6, ok=False)
    assert ledger.low() == 7
    for position in (4, 5, 6, 7):  # 6 failed, 7 was never recorded: both untouched
        ledger.undeliver(position)
    state = ledger.to_state("ordered", 1)
    assert state["delivered"] == [[0, 4]] and state["failed"] == [[6, 7]]
    assert (ledger.delivered, ledger.completed, ledger.started) == (4, 5, 5)
    assert ledger.low() == 4
    assert ledger.remaining() == [4, 5, 7, 8, 9, 10, 11]
    ledger.complete(4, ok=True)  # and the position completes again, once
    with pytest.raises(ValueError, match="already completed"):
        ledger.complete(4, ok=True)


def test_a_state_from_another_drop_last_setting_is_refused() -> None:
    saved = StragglerBatcher(4, 10, drop_last=True).state_dict()
    with pytest.raises(ValueError, match="drop_last"):
        StragglerBatcher(4, 10, drop_last=False).load_state_dict(saved)


def test_the_default_lateness_bound_is_two_batches() -> None:
    assert StragglerBatcher(4, 16).max_delay_batches == 2  # documented in LoaderOptions


def test_running_names_at_most_limit_positions_lowest_first() -> None:
    b: StragglerBatcher[int] = StragglerBatcher(4, 16)
    for position in (5, 1, 3, 0, 9):
        b.started(position)
    b.push(0, 0)  # completed: no longer running
    assert b.running(limit=2) == [1, 3]
    assert b.running(limit=10) == [1, 3, 5, 9]
