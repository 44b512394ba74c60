"""sample_rng: one deterministic, independent stream per (seed, epoch, index), cheaply."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gpu_loader.sources import sample_rng


def test_same_triple_same_stream() -> None:
    a = sample_rng(7, 2, 1234).random(16)
    b = sample_rng(7, 2, 1234).random(16)
    assert np.array_equal(a, b)
    assert np.array_equal(sample_rng(np.int64(7), 2, np.uint32(1234)).random(16), a)


def test_streams_differ_in_every_component() -> None:
    base = sample_rng(7, 2, 1234).random(4)
    for args in [(8, 2, 1234), (7, 3, 1234), (7, 2, 1235), (2, 7, 1234), (0, 0, 0)]:
        assert not np.array_equal(sample_rng(*args).random(4), base), args


def test_neighbouring_streams_do_not_overlap() -> None:
    # Streams keyed by neighbouring indices must not be shifted copies of each other.
    a = sample_rng(1, 0, 10).integers(0, 2**63, 64)
    b = sample_rng(1, 0, 11).integers(0, 2**63, 64)
    assert not set(a.tolist()) & set(b.tolist())


def test_known_raw_streams() -> None:
    # Pinned raw Philox output (stable across numpy versions by numpy's policy): the key
    # packing, and so every transform's random parameters, must not drift between releases.
    assert sample_rng(0, 0, 0).bit_generator.random_raw(2).tolist() == [
        213000021201967259,
        4455796210202625458,
    ]
    assert sample_rng(3, 2, 1).bit_generator.random_raw(2).tolist() == [
        292186794830810073,
        2455466637966368075,
    ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1, 0, 0), ValueError),
        ((0, 2**24, 0), ValueError),
        ((0, 0, 2**40), ValueError),
        ((0, 0, 1.5), TypeError),
        ((True, 0, 0), TypeError),
    ],
)
def test_out_of_range_inputs_are_refused(args: tuple[object, ...], error: type) -> None:
    with pytest.raises(error, match="sample_rng"):
        sample_rng(*args)  # type: ignore[arg-type]


def test_it_is_cheap() -> None:
    n = 2000
    start = time.perf_counter()
    for i in range(n):
        sample_rng(5, 1, i)
    per_call = (time.perf_counter() - start) / n
    # About 7 µs on the 2-core development machine; a loose bound for a loaded CI box.
    assert per_call < 100e-6, f"sample_rng took {per_call * 1e6:.1f} µs per call"


@pytest.mark.parametrize(
    ("seed", "epoch", "index"),
    [(0, 0, 0), (7, 2, 1234), (2**64 - 1, 2**24 - 1, 2**40 - 1), (1, 0, 2**40 - 1)],
)
def test_same_stream_as_philox_keyed_directly(seed: int, epoch: int, index: int) -> None:
    # sample_rng skips Philox(key=...)'s entropy gathering; the state must be identical.
    key = seed | (((epoch << 40) | index) << 64)
    direct = np.random.Generator(np.random.Philox(key=key))
    ours = sample_rng(seed, epoch, index)
    assert np.array_equal(ours.bit_generator.random_raw(64), direct.bit_generator.random_raw(64))
    assert np.array_equal(ours.integers(0, 10**9, 32), direct.integers(0, 10**9, 32))
