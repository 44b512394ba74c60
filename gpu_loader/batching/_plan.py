"""The nominal batch layout of an epoch and the records a batcher hands out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")


def _check_int(name: str, value: object, minimum: int) -> int:
    # bool is an int subclass; `batch_size=True` is always a bug, so refuse it.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class BatchPlan:
    """Where each epoch position nominally belongs: batch ``position // batch_size``.

    With ``drop_last=True`` the positions of the nominal short last batch
    (``position >= num_kept``) are not part of the epoch: the loader should not start
    them, and batchers refuse them. Every other position is delivered exactly once
    or reported failed.
    """

    num_samples: int
    """Positions in the epoch (the rank's shard), numbered ``0 .. num_samples - 1``."""
    batch_size: int
    """Samples per batch."""
    drop_last: bool = False
    """Drop the nominal short last batch (deterministic: always the same positions)."""

    def __post_init__(self) -> None:
        _check_int("num_samples", self.num_samples, 0)
        _check_int("batch_size", self.batch_size, 1)
        if not isinstance(self.drop_last, bool):
            raise TypeError(f"`drop_last` must be a bool, got {self.drop_last!r}")

    @property
    def num_kept(self) -> int:
        """Positions that belong to the epoch (all of them unless ``drop_last``)."""
        if self.drop_last:
            return self.num_samples - self.num_samples % self.batch_size
        return self.num_samples

    @property
    def num_batches(self) -> int:
        """Nominal batches in the epoch (the short last one counts unless dropped)."""
        return -(-self.num_kept // self.batch_size)

    @property
    def last_batch_size(self) -> int:
        """Size of the nominal last batch (0 for an empty epoch)."""
        if self.num_kept == 0:
            return 0
        return self.num_kept - (self.num_batches - 1) * self.batch_size

    @property
    def dropped(self) -> range:
        """Positions left out by ``drop_last`` (empty unless ``drop_last``)."""
        return range(self.num_kept, self.num_samples)

    def batch_of(self, position: int) -> int:
        """Nominal batch index of a kept position."""
        self.check_position(position)
        return position // self.batch_size

    def batch_range(self, index: int) -> range:
        """Positions of nominal batch ``index``."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index must be in [0, {self.num_batches}), got {index}")
        start = index * self.batch_size
        return range(start, min(start + self.batch_size, self.num_kept))

    def check_position(self, position: int) -> None:
        """Raise a clear error unless ``position`` is a kept position of this epoch."""
        if not isinstance(position, int) or isinstance(position, bool):
            raise TypeError(f"position must be an int, got {type(position).__name__}")
        if 0 <= position < self.num_kept:
            return
        if self.num_kept <= position < self.num_samples:
            raise ValueError(
                f"position {position} is in the short last batch dropped by drop_last=True "
                f"(positions >= {self.num_kept}); do not start it"
            )
        raise ValueError(f"position must be in [0, {self.num_samples}), got {position}")


@dataclass(frozen=True)
class Batch(Generic[T]):
    """One emitted batch: its samples in ascending position order."""

    items: tuple[T, ...]
    """The samples, aligned with ``positions``."""
    positions: tuple[int, ...]
    """Epoch positions of the samples, ascending."""
    index: int
    """Emission index within the epoch (0, 1, 2, ...; continues across a resume)."""
    delays: tuple[int, ...]
    """Per sample ``index - position // batch_size``: > 0 late, < 0 early (holes filled)."""

    def __len__(self) -> int:
        return len(self.items)

    @property
    def max_delay(self) -> int:
        """Largest per-sample delay in batches (0 for an empty batch)."""
        return max(self.delays, default=0)


@dataclass(frozen=True)
class BatcherStats:
    """A snapshot of a batcher's counters for the current epoch."""

    mode: Literal["ordered", "straggler"]
    """Which batcher produced the snapshot."""
    batches: int
    """Batches emitted so far (counting those emitted before a resume)."""
    delivered: int
    """Samples delivered in emitted batches (counting those before a resume)."""
    failed: int
    """Positions reported failed."""
    dropped: int
    """Positions left out by ``drop_last`` (not failures)."""
    pending: int
    """Positions started and not yet completed."""
    ready: int
    """Completed samples held by the batcher, waiting for their batch."""
    moved: int
    """Delivered samples with delay > 0 (they joined a later batch than their nominal one)."""
    mean_moved_delay: float
    """Mean delay in batches of the moved samples (0.0 when none moved)."""
    max_delay: int
    """Largest delay in batches of any delivered sample."""
    overdue: int
    """Samples delivered later than ``max_delay_batches`` (0 unless positions were started
    far out of order, see the README; in ordered mode, which has no bound, the later
    parts of a batch split to keep the number of batches count too)."""
    held_back: int
    """Calls of ``pop()`` that returned nothing although ``batch_size`` samples were ready
    (ordered: head-of-line blocking; straggler: the lateness bound waiting for a straggler)."""
    held_back_s: float
    """Clock time spent in that state, from the first such ``pop()`` to the next emission
    (or to now, while it lasts)."""
    rows_copied: int = 0
    """Sample rows copied to build batches: the samples that moved (CPU loader, straggler
    mode; 0 elsewhere, where samples are written where they are delivered from)."""
    batches_copied: int = 0
    """Batches built in a fresh tensor because no nominal batch's tensor could hold them,
    every row copied (CPU loader, straggler mode; expected 0 or close to it)."""
    large_private: int = 0
    """Samples decoded into a private tensor because their file was much larger than
    recent ones (CPU loader, straggler mode): each moves, or costs one row copy."""
