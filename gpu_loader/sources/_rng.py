"""Per-sample random streams keyed by ``(seed, epoch, index)``.

Transforms draw their parameters from ``sample_rng(seed, epoch, index)``, so a sample's
crop and flip never depend on which thread handled it or when. Philox is a counter-based
generator: different keys give independent streams, so packing the triple into the
128-bit key is enough (no hashing) and construction costs a few microseconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

_SEED_BITS, _EPOCH_BITS, _INDEX_BITS = 64, 24, 40
_INDEX_MASK = (1 << _INDEX_BITS) - 1
EPOCH_LIMIT = 1 << _EPOCH_BITS
"""Epochs are numbered from 0 to ``EPOCH_LIMIT - 1`` (the key has 24 bits for them)."""


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A fresh generator for one sample; the same triple always gives the same stream."""
    return sample_stream(seed, epoch, index).generator()


def sample_stream(seed: int, epoch: int, index: int) -> SampleStream:
    """The stream `sample_rng` gives, as its key only: `TrainTransform.make_params` draws
    from it in C with the native extension (the same numbers, without building numpy's
    Generator: 4 us per sample for key and parameters, against 22 us), and through
    `generator()` otherwise."""
    _check("seed", seed, _SEED_BITS)
    _check("epoch", epoch, _EPOCH_BITS)
    _check("index", index, _INDEX_BITS)
    # int(): numpy integers would overflow in the shifts below.
    return SampleStream(int(seed), (int(epoch) << _INDEX_BITS) | int(index))


class SampleStream:
    """numpy's Philox keyed ``low | high << 64``, counter at zero, not yet built."""

    __slots__ = ("philox_key",)

    def __init__(self, low: int, high: int) -> None:
        for name, word in (("low", low), ("high", high)):
            if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word < 1 << 64:
                raise ValueError(
                    f"SampleStream `{name}` must be an int in [0, 2**64), got {word!r}"
                )
        self.philox_key = (low, high)

    def generator(self) -> np.random.Generator:
        """A new numpy Generator at the start of the stream."""
        # The same state as Philox(key=low | high << 64), without the OS entropy that
        # Philox(key=...) gathers (and then discards) for a seed: ~5 us instead of ~14.
        # (numpy's stubs say SeedSequence; the runtime accepts any ISeedSequence, as documented.)
        return np.random.Generator(np.random.Philox(_KeyWords(*self.philox_key)))  # type: ignore[arg-type]

    def __repr__(self) -> str:
        low, high = self.philox_key
        return f"SampleStream(seed={low}, epoch={high >> _INDEX_BITS}, index={high & _INDEX_MASK})"


class _KeyWords(ISeedSequence):
    """Hands Philox its 128-bit key as the two 64-bit words it asks its seed sequence for.

    Philox built from a seed sequence takes ``generate_state(2, uint64)`` as its key and
    starts its counter at zero, exactly as ``Philox(key=...)`` does (a test compares the
    streams).
    """

    __slots__ = ("words",)

    def __init__(self, low: int, high: int) -> None:
        self.words = (low, high)

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words != 2 or np.dtype(dtype) != np.uint64:
            raise RuntimeError(f"Philox asked for {n_words} words of {dtype}; expected 2 x uint64")
        return np.array(self.words, np.uint64)


def _check(name: str, value: int, bits: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"sample_rng `{name}` must be an int, got {value!r}")
    if not 0 <= value < (1 << bits):
        raise ValueError(f"sample_rng `{name}` must be in [0, 2**{bits}), got {value}")
