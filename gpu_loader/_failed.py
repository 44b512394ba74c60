"""`FailedSample`: what the loader reports for a sample it did not deliver.

Its own module so the epoch code can import it at the top: a lazy import from
`gpu_loader.loader` failed when an unfinished epoch was finalised at interpreter exit
(the import system is gone by then), printing a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)  # slots: kept for every failure of every epoch
class FailedSample:
    """A sample that was not delivered, and why."""

    key: str
    """The sample's key (its path or URL)."""
    stage: str
    """The pipeline stage that failed: ``read`` or ``decode`` on the CPU path, ``fetch``
    (read, header, non-JPEG decode) or ``gpu_decode`` on the GPU path; ``augment`` where
    the loader's ``augment`` function raised or returned something unusable (counted
    with ``decode`` for ``max_failures``: it runs in that stage); ``before resume``
    for a sample a resumed epoch's state lists as failed, when this loader has no record
    of its error (the state keeps positions, not errors)."""
    error: str
    """``ExceptionType: message``."""
    epoch: int
    """The epoch it failed in."""

    def __iter__(self) -> Iterator[str | int]:
        """``key, stage, error, epoch = failed``, as the README writes it (QA51: refused,
        as a dataclass does not unpack)."""
        return iter((self.key, self.stage, self.error, self.epoch))


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a file name that is not holds surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_key(key: str) -> str:
    """A key as the commands' listings print it: as it is, or quoted (``repr``) when it
    holds a newline or another character that cannot be printed (QA: a key with a newline
    split its line of a listing in two), or a name that is not UTF-8 (its surrogates)."""
    return key if is_utf8(key) and key.isprintable() else repr(key)


def counted(n: int, noun: str) -> str:
    """``n`` of ``noun``, as the commands' reports count ("1 image", "1,200 files")."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
