"""BatchPlan: nominal batches, last batch size, drop_last, validation."""

from __future__ import annotations

import pytest

from gpu_loader.batching import Batch, BatchPlan


@pytest.mark.parametrize(
    ("n", "size", "drop_last", "batches", "last", "kept"),
    [
        (10, 4, False, 3, 2, 10),
        (10, 4, True, 2, 4, 8),
        (8, 4, True, 2, 4, 8),
        (3, 4, True, 0, 0, 0),
        (3, 4, False, 1, 3, 3),
        (0, 1, False, 0, 0, 0),
    ],
)
def test_layout(n: int, size: int, drop_last: bool, batches: int, last: int, kept: int) -> None:
    plan = BatchPlan(n, size, drop_last)
    assert (plan.num_batches, plan.last_batch_size, plan.num_kept) == (batches, last, kept)
    assert list(plan.dropped) == list(range(kept, n))
    covered = [p for b in range(plan.num_batches) for p in plan.batch_range(b)]
    assert covered == list(range(kept))
    assert all(plan.batch_of(p) == p // size for p in covered)


def test_errors_name_the_value_and_fix() -> None:
    with pytest.raises(ValueError, match="`batch_size` must be >= 1, got 0"):
        BatchPlan(10, 0)
    with pytest.raises(ValueError, match="`num_samples` must be >= 0, got -1"):
        BatchPlan(-1, 2)
    with pytest.raises(TypeError, match="`batch_size` must be an int, got bool"):
        BatchPlan(10, True)
    with pytest.raises(TypeError, match="`drop_last` must be a bool"):
        BatchPlan(10, 2, 1)  # type: ignore[arg-type]
    plan = BatchPlan(10, 4, True)
    with pytest.raises(ValueError, match="do not start it"):
        plan.batch_of(9)
    with pytest.raises(ValueError, match=r"must be in \[0, 10\), got 10"):
        plan.batch_of(10)
    with pytest.raises(IndexError, match=r"batch index must be in \[0, 2\), got 2"):
        plan.batch_range(2)


def test_batch_record() -> None:
    batch = Batch(items=("a", "b"), positions=(3, 9), index=2, delays=(2, 0))
    assert len(batch) == 2 and batch.max_delay == 2
    assert Batch(items=(), positions=(), index=0, delays=()).max_delay == 0
