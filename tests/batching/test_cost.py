"""order_by_cost and CostModel: slow samples first within bounded blocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_loader.batching import CostModel, order_by_cost


def test_slow_samples_start_first_within_each_block() -> None:
    positions = list(range(8))
    costs = [1, 1, 9, 1, 5, 1, 1, 7]
    assert order_by_cost(positions, costs, 4) == [2, 0, 1, 3, 7, 4, 5, 6]
    assert order_by_cost(positions, costs, 1) == positions
    assert order_by_cost(positions, costs, 0) == positions
    assert order_by_cost([], [], 16) == []


@given(st.lists(st.floats(0, 100), max_size=80), st.integers(1, 20))
def test_a_permutation_that_moves_nothing_out_of_its_block(costs: list[float], L: int) -> None:
    positions = [100 + i for i in range(len(costs))]
    out = order_by_cost(positions, costs, L)
    assert sorted(out) == positions
    for j, p in enumerate(out):
        i = p - 100
        assert i // L == j // L and abs(i - j) < L
    for start in range(0, len(out), L):
        block = [costs[p - 100] for p in out[start : start + L]]
        assert block == sorted(block, reverse=True)


def test_ties_keep_their_order_and_errors_are_clear() -> None:
    assert order_by_cost([5, 3, 9], [2.0, 2.0, 2.0], 3) == [5, 3, 9]
    with pytest.raises(ValueError, match="same length, got 3 and 2"):
        order_by_cost([1, 2, 3], [1.0, 2.0], 2)
    with pytest.raises(ValueError, match="`lookahead` must be an int >= 0, got -1"):
        order_by_cost([1], [1.0], -1)


def test_cost_model() -> None:
    assert CostModel().estimate(1000) == 1000
    model = CostModel(base=5.0, per_byte=0.0, per_pixel=2.0)
    assert model.estimate(1000, pixels=10) == 25.0
    assert model.estimate(1000) == 5.0
    with pytest.raises(ValueError, match="`per_pixel` must be finite and >= 0"):
        CostModel(per_pixel=-1.0)
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        CostModel().estimate(-1)
