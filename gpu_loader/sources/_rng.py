"""Per-sample random streams keyed by ``(seed, epoch, index)``.

Transforms draw their parameters from ``sample_rng(seed, epoch, index)``, so a sample's
crop and flip never depend on which thread handled it or when. Philox is a counter-based
generator: different keys give independent streams, so packing the triple into the
128-bit key is enough (no hashing) and construction costs a few microseconds.
"""

from __future__ import annotations

import numpy as np

_SEED_BITS, _EPOCH_BITS, _INDEX_BITS = 64, 24, 40


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A fresh generator for one sample; the same triple always gives the same stream."""
    _check("seed", seed, _SEED_BITS)
    _check("epoch", epoch, _EPOCH_BITS)
    _check("index", index, _INDEX_BITS)
    # int(): numpy integers would overflow in the shifts below.
    key = int(seed) | (((int(epoch) << _INDEX_BITS) | int(index)) << _SEED_BITS)
    return np.random.Generator(np.random.Philox(key=key))


def _check(name: str, value: int, bits: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"sample_rng `{name}` must be an int, got {value!r}")
    if not 0 <= value < (1 << bits):
        raise ValueError(f"sample_rng `{name}` must be in [0, 2**{bits}), got {value}")
